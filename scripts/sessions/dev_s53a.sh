#!/usr/bin/env bash
# Session 53, first call (carry nothing, timeout ~330): issue 15's blocker and issue 13's FP8
# step re-measured on the current code: the batched 32K B = 64 FP8 step over bf16 and packed
# caches, then the single-sequence FP8 step at 4K/32K/128K over both (ab_steps.py, 3 rounds).
# Either card: the log names it; H100 figures are not the H200 targets'.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$OUT/gpu.txt"
timeout -k 5 "${AB_S:-130}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv bf16,packed \
  --weights fp8 --rounds 3 --variants new > "$OUT/ab_batch_fp8.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_batch_fp8.log"
timeout -k 5 "${SINGLE_S:-150}" python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 \
  --kv bf16,packed --rounds 3 --variants new > "$OUT/ab_single_fp8.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_single_fp8.log"
echo "done at $(($(date +%s) - T0)) s"
