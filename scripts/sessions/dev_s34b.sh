#!/usr/bin/env bash
# Thirty-third entry, call 2: the quick tier on the final code (the index scores' packed
# keys by the table lookup and its epilogue in bf16 pairs by default), then the single-
# sequence steps and the B = 64 steps against the forms before (`index pairs fp32
# epilogue`). About 480 s. carry: [".golden"]; timeout_s ≥ 540.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
TIER_S="${TIER_S:-300}" bash scripts/dev_tier.sh
echo "tier done at $(($(date +%s) - T0)) s"
timeout -k 5 "${SINGLE_S:-90}" python3 scripts/ab_steps.py --single 4096,32768 --kv bf16,packed --weights fp8 \
  --rounds 2 --variants "new;index pairs fp32 epilogue" > "$OUT/ab_single.log" 2>&1
echo "single rc $? at $(($(date +%s) - T0)) s"; grep "^|" "$OUT/ab_single.log"
timeout -k 5 "${AB_S:-110}" python3 scripts/ab_steps.py --batches 64 --context 32768 --kv bf16,packed \
  --weights fp8 --rounds 2 --variants "new;index pairs fp32 epilogue" > "$OUT/ab_b64.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"; grep "^|" "$OUT/ab_b64.log"
