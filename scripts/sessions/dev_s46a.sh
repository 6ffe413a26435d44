#!/usr/bin/env bash
# Session 46, call 1 (carry [".golden"], timeout 200): where the production single-sequence
# FP8 step goes now (32K, bf16 caches, PDL off for per-kernel times, then on for the span);
# on an H200 also the issues' step figures (single FP8 4K / 32K / 128K; batched FP8 32K,
# B = 1 / 64, bf16 against packed caches).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 120 python3 scripts/step_profile.py --context 32768 --weights fp8 --steps 3 > "$OUT/prof_pdl0.log" 2>&1
echo "prof pdl0 rc $? at $(($(date +%s) - T0)) s"
ATTNV41_PDL=1 timeout -k 5 120 python3 scripts/step_profile.py --context 32768 --weights fp8 --steps 3 > "$OUT/prof_pdl1.log" 2>&1
echo "prof pdl1 rc $? at $(($(date +%s) - T0)) s"
head -60 "$OUT/prof_pdl0.log" | grep "^|" | head -45
grep -A5 "| step |" "$OUT/prof_pdl1.log"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout -k 5 100 python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 --kv bf16 --rounds 3 \
    --variants "new" > "$OUT/ab_single.log" 2>&1
  echo "ab single rc $? at $(($(date +%s) - T0)) s"
  timeout -k 5 150 python3 scripts/ab_steps.py --context 32768 --batches 1,64 --weights fp8 --kv bf16,packed --rounds 2 \
    --variants "new" > "$OUT/ab_batch.log" 2>&1
  echo "ab batch rc $? at $(($(date +%s) - T0)) s"
  grep -h "^| " "$OUT/ab_single.log" "$OUT/ab_batch.log"
fi
echo "done at $(($(date +%s) - T0)) s"
