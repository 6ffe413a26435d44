#!/usr/bin/env bash
# 2026-12-04 (twelfth entry), call 6 (final: the paged index over packed keys in 4 blocks per
# program): the GPU tests of the index scores, decode invariance and batched golden files
# (not the released variants), `bench --parts batch` at 32K, then the full tier's
# test_flash_stack_runtime_vs_reference with 50 decode steps. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 -m gpu tests/kernels/test_indexer_paged.py \
  tests/kernels/test_indexer_packed.py tests/kernels/test_decode_invariance.py tests/test_golden_batched.py \
  -k "not released" > "$OUT/pytest_final.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/pytest_final.log" | cut -c1-300
timeout -k 5 120 python3 -m attnv41 bench --parts batch --batch-sizes 1,64 --batch-contexts 32768 \
  --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
ATTNV41_STACK_STEPS=50 timeout -k 5 280 python3 -m pytest -q -p no:cacheprovider -rfEs tests/runtime/test_gpu.py \
  -k test_flash_stack_runtime_vs_reference > "$OUT/pytest_stack.log" 2>&1
echo "stack rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/pytest_stack.log" | cut -c1-300
grep -E "^\| 32768 \| (1|64) \| 1 \|" "$OUT/bench/bench.md" | head
