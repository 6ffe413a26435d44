#!/usr/bin/env bash
# 2026-12-04 (eleventh entry), calls 8 and 9, run as commands on a warm machine after the
# register caps became BATCH_TUNE's packed shape (warps_b_packed=8, maxnreg_a_packed=96,
# maxnreg_b_packed=128); the record of what ran. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
# call 8: m-invariance (bf16 and packed), packed == bf16 bytes, the batched golden files on CUDA
timeout -k 5 70 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 -m gpu tests/kernels/test_decode_invariance.py \
  tests/kernels/test_sparse_attn_packed.py tests/test_golden_batched.py -k "not released" > "$OUT/t.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/t.log" | cut -c1-300
# call 9: bench (f) at 32K, B = 1 and 64
timeout -k 3 75 python3 -m attnv41 bench --parts batch --batch-sizes 1,64 --batch-contexts 32768 --no-progress \
  --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "rc $?"; rm -f "$OUT"/bench/*.png
grep -E "^\| 32768 \| (1|64) \| 1 \|" "$OUT/bench/bench.md"
