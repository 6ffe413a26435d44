#!/usr/bin/env bash
# Session 45, call 4, not run (the next session's first call; carry [".golden"], timeout
# 360): on the session's final tree (the head weights scaled in the index-query chain; the
# top-k's workspace back to a memset per call), the single-sequence FP8 step against the head
# weights scaled by a kernel of their own ("hw apart", as before the forty-second entry; 4K /
# 32K / 128K, 3 rounds), then the quick tier.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 100 python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 --kv bf16 --rounds 3 \
  --variants "new;hw apart" > "$OUT/ab_hw.log" 2>&1
echo "ab hw rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_hw.log"
TIER_S="${TIER_S:-250}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
echo "done at $(($(date +%s) - T0)) s"
