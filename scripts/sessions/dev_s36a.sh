#!/usr/bin/env bash
# Thirty-fifth entry, second call: `_TUNE`'s fmt_loops on (the single-sequence runtime's
# packed step 3.257 → 3.213 ms at 32K in the first call). The quick GPU tier on it, then the
# single-sequence step at 4K and 32K over both caches with fmt_loops on ("new") and off.
# About 330 s. carry: [".golden"]; timeout_s ≥ 420.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
TIER_S="${TIER_S:-300}" bash scripts/dev_tier.sh
timeout -k 5 "${SINGLE_S:-100}" python3 scripts/ab_steps.py --single 4096,32768 --kv bf16,packed --weights fp8 --rounds 3 \
  --variants "new;attn fmt loops off" > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"; grep -E "^[|]" "$OUT/ab_single.log"
