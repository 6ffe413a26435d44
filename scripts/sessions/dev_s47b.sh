#!/usr/bin/env bash
# Session 47, the lean form of dev_s47a.sh for a short device budget (carry [".golden"], timeout
# ≥ 430): the decisive measurement first (the single-sequence FP8 step with the per-row top-k on
# for rows up to 16K / 32K positions, against production), then the quick tier (its per-row tests
# run `per_row=True` explicitly), then the selections alone (topk_tune.py) if time is left.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 110 python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 --kv bf16 --rounds 3 \
  --variants "new;topk row 16K;topk row 32K" > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_single.log"
TIER_S="${TIER_S:-250}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
timeout -k 5 60 python3 scripts/topk_tune.py --lbs 4096,16384,32768 --ms 1,64 --row-warps 8,16 --lean \
  --budget 30 > "$OUT/topk_tune.log" 2>&1
echo "tune rc $? at $(($(date +%s) - T0)) s"
grep "^|" "$OUT/topk_tune.log" | head -40
echo "done at $(($(date +%s) - T0)) s"
