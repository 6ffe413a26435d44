#!/usr/bin/env bash
# Session 46, call 4 (carry [".golden"], timeout 230; dev_s46c.sh cut to what 288 s of device
# time left could hold after refused starts): the top-k's one program per row timed against the
# tiled passes (topk_tune.py, each variant checked against the twin first; 16K / 32K rows, m 1 /
# 64), the single-sequence FP8 step at 32K against "topk tiled", then the GPU tests of the
# selections and of the runtime paths that call them (golden files on CUDA included).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 50 python3 scripts/topk_tune.py --lbs 16384,32768 --ms 1,64 --row-warps 8,16 --lean \
  --budget 25 > "$OUT/topk_tune.log" 2>&1
echo "tune rc $? at $(($(date +%s) - T0)) s"
grep "^|" "$OUT/topk_tune.log" | head -30
timeout -k 5 45 python3 scripts/ab_steps.py --single 32768 --weights fp8 --kv bf16 --rounds 2 \
  --variants "new;topk tiled" > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_single.log"
timeout -k 5 110 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile -m "gpu and not gpu_full" \
  tests/kernels/test_topk.py tests/kernels/test_select.py tests/kernels/test_select_gather.py \
  tests/kernels/test_decode_invariance.py tests/kernels/test_indexer_gather.py tests/runtime/test_compact_reindex.py \
  tests/runtime/test_gpu_golden.py > "$OUT/pytest_topk.log" 2>&1
echo "gpu tests rc $? at $(($(date +%s) - T0)) s"
tail -2 "$OUT/pytest_topk.log"; grep -E "FAILED|ERROR" "$OUT/pytest_topk.log" | head -10 | cut -c1-200
echo "done at $(($(date +%s) - T0)) s"
