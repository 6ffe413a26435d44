#!/usr/bin/env bash
# Device call (twenty-third entry, last): the two split levels after the opaque additions
# and wo_a's fine split: tc_mm's GPU tests and the golden files through BatchV41, then the
# step A/B (production against one level) with FP8 and bf16 weights, 4K. carry: [".golden"].
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs -n 4 -m "gpu and not gpu_full" tests/kernels/test_tc_mm.py \
  tests/test_golden_batched.py > "$OUT/pytest_tc_mm.log" 2>&1
echo "tc_mm + golden batched tests rc $? in $(($(date +%s) - T0)) s: $(tail -1 "$OUT/pytest_tc_mm.log")"
grep -E "^FAILED|^ERROR" "$OUT/pytest_tc_mm.log" | head -10
timeout 60 python3 scripts/ab_steps.py --context 4096 --batches 1,64 --kv bf16 --weights fp8 --rounds 1 \
  --variants "new;one level" > "$OUT/ab_fp8.log" 2>&1
echo "ab fp8 rc $? in $(($(date +%s) - T0)) s"
timeout 50 python3 scripts/ab_steps.py --context 4096 --batches 1,64 --kv bf16 --weights bf16 --rounds 1 \
  --variants "new;one level" > "$OUT/ab_bf16.log" 2>&1
echo "ab bf16 rc $? in $(($(date +%s) - T0)) s"
for f in fp8 bf16; do echo "== ab $f"; grep "^|" "$OUT/ab_$f.log" || tail -3 "$OUT/ab_$f.log"; done
