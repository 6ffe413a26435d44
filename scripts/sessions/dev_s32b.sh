#!/usr/bin/env bash
# For the next session with an H200 (written 2026-12-05, thirty-first entry): the bench rows of
# issues 13 and 15 on one H200 run with this code (the last full bench tables are older than
# the launch-form sums and wo_a's FP8 default): (a) decode at 4K / 32K with both weight
# formats, (c) against FlashMLA (carry the peer wheel as the device README says, if present),
# (f) the batched step at 32K, B = 1 / 64. carry: [".golden", ".whl"] (the peer wheel, installed here)
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
SITE=""
if ls .whl/*.whl >/dev/null 2>&1; then  # the FlashMLA peer (bench (c)), as scripts/device_bench.sh installs it
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && SITE=":/tmp/site"
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests$SITE" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 10 "${BENCH_S:-540}" python3 -m attnv41 bench --parts decode,peer,batch --weights both \
  --contexts 4096,32768 --batch-sizes 1,64 --batch-contexts 32768 --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
tail -40 "$OUT/bench.log"
