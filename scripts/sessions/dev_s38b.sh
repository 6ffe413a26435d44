#!/usr/bin/env bash
# Thirty-seventh entry, call 2 (one machine, H200 wanted): the bench rows of issues 13 and 15
# on the code with the compact reindex: (a) decode at 4K / 32K / 128K with both weight
# formats and both cache formats, (c) against FlashMLA (the peer wheel from .whl), (f) the
# batched step at 32K, B = 1 / 64; then (h) one 1,048,000-token prompt in chunks over packed
# caches, FP8 weights, with the time that is left (its row says how far it got).
# carry: [".golden", ".whl"]; timeout_s 600.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
SITE=""
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && SITE=":/tmp/site"
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests$SITE" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 10 "${BENCH_S:-270}" python3 -m attnv41 bench --parts decode,peer,batch --weights both \
  --contexts 4096,32768,131072 --batch-sizes 1,64 --batch-contexts 32768 --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
LEFT=$((${TOTAL_S:-585} - ($(date +%s) - T0)))
BUDGET=$((LEFT - 75))
echo "long: ${LEFT} s left, chunk budget ${BUDGET} s"
timeout -k 5 "$((LEFT - 5))" python3 -m attnv41 bench --parts long --long-context 1048000 --long-kv-formats packed \
  --long-budget-s "$BUDGET" --weights fp8 --out "$OUT/long" > "$OUT/long.log" 2>&1
echo "long rc $? at $(($(date +%s) - T0)) s"
grep -A3 "^context" "$OUT/long.log" | cut -c1-220
grep -B2 -A30 "^### (a)" "$OUT/bench/bench.md" | grep "graphs\|^| context" | cut -c1-120
grep "batched runtime\|FlashMLA" "$OUT/bench/bench.md" | cut -c1-150
grep -A12 "^### (f)" "$OUT/bench/bench.md" | cut -c1-120
