#!/usr/bin/env bash
# Device call (twenty-third entry): the two split levels of `tc_mm` (FP8 linears' fine split
# at m <= 64, coarse programs above, the same bits). Their GPU tests and the FP8 golden
# files through BatchV41, the step A/B (FP8 and bf16 weights, 4K, B = 1, 8, 64), bench (f) +
# (g) with FP8 weights (the chunked prefill), then the quick tier. carry: [".golden"].
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs -m gpu tests/kernels/test_tc_mm.py \
  tests/test_golden_batched.py > "$OUT/pytest_tc_mm.log" 2>&1
echo "tc_mm + golden batched tests rc $? in $(($(date +%s) - T0)) s: $(tail -1 "$OUT/pytest_tc_mm.log")"
timeout 120 python3 scripts/ab_steps.py --context 4096 --batches 1,8,64 --kv bf16 --weights fp8 --rounds 2 \
  --variants "new;one level;fine fp8 + group 396/5" > "$OUT/ab_fp8.log" 2>&1
echo "ab fp8 rc $? in $(($(date +%s) - T0)) s"
timeout 100 python3 scripts/ab_steps.py --context 4096 --batches 1,8,64 --kv bf16 --weights bf16 --rounds 2 \
  --variants "new;fine group 396/5" > "$OUT/ab_bf16.log" 2>&1
echo "ab bf16 rc $? in $(($(date +%s) - T0)) s"
timeout 120 python3 -m attnv41 bench --parts batch --weights fp8 --batch-sizes 1,64 --batch-contexts 4096 \
  --batch-kv-formats bf16 --out "$OUT/bench_fp8" > "$OUT/bench_fp8.log" 2>&1
echo "bench fp8 rc $? in $(($(date +%s) - T0)) s"
TIER_S="${TIER_S:-230}" OUT="$OUT" bash scripts/dev_tier.sh
echo "total $(($(date +%s) - T0)) s"
grep -E "FAILED|ERROR" "$OUT/pytest_tc_mm.log" | head -10
for f in fp8 bf16; do echo "== ab $f"; grep "^|" "$OUT/ab_$f.log" || tail -5 "$OUT/ab_$f.log"; done
echo "== bench fp8"; grep -E "^4096" "$OUT/bench_fp8.log" || tail -5 "$OUT/bench_fp8.log"
