#!/usr/bin/env bash
# Thirtieth entry, last call (written 2026-12-05): `tc_mm._SPLIT_FORM = "launch"` (the batched
# products' split partials added by gemv's sum kernels in a launch of their own; the same
# bits, CPU-checked): its GPU tests against the counter, then the batched FP8 step at 32K,
# B = 1 and 64, bf16 caches, "new" (counter) against "tc launch". carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 80 python3 -m pytest -q -p no:cacheprovider -rfE -n 4 -m gpu tests/kernels/test_tc_mm.py \
  tests/kernels/test_gemv_split_forms.py -k "sum_launch or split_form or split_k or one_launch or flash" > "$OUT/pytest_tc.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/pytest_tc.log"
timeout -k 5 "${AB_S:-100}" python3 scripts/ab_steps.py --batches 1,64 --context 32768 --kv bf16 --weights fp8 \
  --rounds 2 --variants "new;tc launch" > "$OUT/ab_tc.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
grep -E "^FAILED|^ERROR" "$OUT/pytest_tc.log" | head -8
grep "^|" "$OUT/ab_tc.log" || tail -5 "$OUT/ab_tc.log"
