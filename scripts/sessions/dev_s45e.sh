#!/usr/bin/env bash
# Session 45, call 4 (carry [".golden"], timeout 170; dev_s45d.sh no longer fit the device
# time left): on the session's final tree, the single-sequence FP8 step against "hw apart"
# (4K / 32K / 128K, 2 rounds), then the GPU tests of the files over the changed code (the
# fused chains, the top-k, the runtimes' index paths, graphs and golden files on CUDA).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 60 python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 --kv bf16 --rounds 2 \
  --variants "new;hw apart" > "$OUT/ab_hw.log" 2>&1
echo "ab hw rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_hw.log"
timeout -k 5 $((160 - $(date +%s) + T0)) python3 -m pytest -q -p no:cacheprovider -rfE -n 8 --dist loadfile \
  -m "gpu and not gpu_full" tests/kernels/test_fused.py tests/kernels/test_topk.py tests/runtime/test_gpu.py \
  tests/runtime/test_gpu_golden.py tests/test_golden_batched.py tests/runtime/test_batch_graphs.py \
  tests/runtime/test_compact_reindex.py tests/kernels/test_decode_invariance.py > "$OUT/pytest_sub.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"
tail -3 "$OUT/pytest_sub.log"
grep -E "FAILED|ERROR" "$OUT/pytest_sub.log" | head -10 | cut -c1-200
