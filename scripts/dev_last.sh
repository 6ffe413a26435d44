#!/usr/bin/env bash
# One device call: the two attention combines side by side (bytes and time), the GPU tests'
# quick tier (pytest only; the golden checks ran on the same decode kernels at m = 1), the
# bench's decode step and attention peer rows. Results under $OUT; a short table last.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout 60 python3 scripts/attn_tune.py --set blocks --batches 1,2,8,64 --context 32768 > "$OUT/attn_tune.log" 2>&1
timeout 230 python3 -m pytest -q -m "gpu and not gpu_full" tests > "$OUT/pytest_quick.log" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest_quick.log"
timeout 100 python3 -m attnv41 bench --parts decode,peer --contexts 4096,32768,131072 --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
rm -f "$OUT/bench/decode_step.png"
echo "== $(( $(date +%s) - T0 )) s"
grep -E "^\| [0-9]+ \| (split|FlashMLA|fused)" "$OUT/attn_tune.log" | cut -c1-130
tail -3 "$OUT/pytest_quick.log"; grep -E "FAILED|Error" "$OUT/pytest_quick.log" | head -5
grep -E "graphs|attnv41 decode|FlashMLA" "$OUT/bench.log" | cut -c1-140
