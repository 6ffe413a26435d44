#!/usr/bin/env bash
# Session 49, for the next session's first call (carry [".golden"], timeout 300; `AB_S=120
# SINGLE_S=90` fits 230 s). Session 49 ran dev_s48a.sh on an H100 (named nvidia-h200, an
# H100 came) with the batched step's default bf16 weights; issue 15's blocker is measured
# with FP8 weights (8.538 packed against 8.138 ms bf16 caches on the H200 before the second
# stream; session 49 measured it on an H100 only: packed 8.500 against bf16 8.568 ms). So: the
# batched 32K B = 64 step with FP8 weights, bf16 against packed caches, then the
# single-sequence FP8 step at 4K/32K/128K with both cache formats. Worth its device time on an
# H200; nvidia-smi names the card: quote each figure with it.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 "${AB_S:-130}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv bf16,packed \
  --weights fp8 --rounds 3 --variants new > "$OUT/ab_batch_fp8.log" 2>&1
echo "ab batch fp8 rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_batch_fp8.log"
timeout -k 5 "${SINGLE_S:-110}" python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 \
  --kv bf16,packed --rounds 3 --variants new > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_single.log"
echo "done at $(($(date +%s) - T0)) s"
