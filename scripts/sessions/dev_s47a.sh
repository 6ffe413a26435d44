#!/usr/bin/env bash
# Session 47, call 1 (the next session's first call; carry [".golden"], timeout 560): the top-k's
# one program per row (`topk._topk_row_kernel`), built in session 46 and off in production
# (`topk._ROW_WIDTH` = 0; no device time was left to run it): the selections timed against the
# tiled passes (topk_tune.py, each variant checked against the twin first), the single-sequence
# FP8 step with it on for rows up to 16K / 32K positions ("topk row 16K" / "32K"), the quick
# tier (its per-row tests run `per_row=True` explicitly), then the batched FP8 step at 32K.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 90 python3 scripts/topk_tune.py --lbs 4096,16384,32768 --ms 1,64 --row-warps 8,16 --lean \
  --budget 45 > "$OUT/topk_tune.log" 2>&1
echo "tune rc $? at $(($(date +%s) - T0)) s"
grep "^|" "$OUT/topk_tune.log" | head -40
timeout -k 5 120 python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 --kv bf16 --rounds 3 \
  --variants "new;topk row 16K;topk row 32K" > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_single.log"
TIER_S="${TIER_S:-250}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
timeout -k 5 120 python3 scripts/ab_steps.py --context 32768 --batches 1,64 --weights fp8 --kv bf16,packed --rounds 2 \
  --variants "new;topk row 16K" > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_batch.log"
echo "done at $(($(date +%s) - T0)) s"
