#!/usr/bin/env bash
# 2026-12-04 (fifteenth entry), call 6: whole batched steps with the Gluon attention on / off
# (ab_steps.py, BatchGraphs at 32K, B = 32 and 64), then `attnv41 bench --parts peer,batch`
# with the FlashMLA wheel. carry: [".golden", ".whl"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 260 python3 scripts/ab_steps.py --context 32768 --batches 32,64 --rounds 2 \
  --variants "new;gluon off" > "$OUT/ab_steps.log" 2>&1
echo "ab_steps rc $? at $(($(date +%s) - T0)) s"; grep "^|" "$OUT/ab_steps.log"
timeout -k 5 280 python3 -m attnv41 bench --parts peer,batch --batch-sizes 1,64 --batch-contexts 32768 \
  --contexts 4096,32768 --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"; rm -f "$OUT/bench/decode_step.png"
grep -E "decode \(split|batched runtime|FlashMLA" "$OUT/bench/bench.md" | cut -c1-170
grep -E "^\| 32768 \| (1|64) \|" "$OUT/bench/bench.md" | cut -c1-150 | head -12
