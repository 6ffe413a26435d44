#!/usr/bin/env bash
# FP8 decode GEMV segments of at most 5 chunks (`gemv._SEG_CHUNKS_FP8`, production) (carry
# [".golden"], timeout 480): the quick tier on it (the golden files through the runtime on
# CUDA among it), then the single-sequence FP8 step against the rule before (one chunk per
# program) and other caps, 4K / 32K / 128K, 3 rounds; bf16 weights' splits (their rule
# unchanged) at 4K / 32K, 2 rounds.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
TIER_S="${TIER_S:-250}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
timeout -k 5 110 python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 --kv bf16 --rounds 3 \
  --variants "new;fp8 one chunk;x 5;fp8 seg 4;fp8 seg 8" > "$OUT/ab_fp8.log" 2>&1
echo "ab fp8 rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 90 python3 scripts/ab_steps.py --single 4096,32768 --weights bf16 --kv bf16 --rounds 2 \
  --variants "new;bf16 wo_b 8;bf16 wo_a 4;bf16 x 5" > "$OUT/ab_bf16.log" 2>&1
echo "ab bf16 rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_fp8.log" "$OUT/ab_bf16.log"
echo "done at $(($(date +%s) - T0)) s"
