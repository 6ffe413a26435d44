#!/usr/bin/env bash
# Thirty-third entry, the one call left (device time short after refused starts): the
# quick tier (it holds the new forms' GPU tests: every code and scale by the table-lookup
# PTX; the index scores with `lut` / `epi2` against the forms before, NaN, inf, −0 and
# ±2^-140 dots; the attention with `lut`), then whole B = 64 steps at 32K, the index's
# and the attention's LUT forms against production. About 470 s. carry: [".golden"].
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
TIER_S="${TIER_S:-270}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -20
echo "tier done at $(($(date +%s) - T0)) s"
timeout -k 5 "${AB_S:-180}" python3 scripts/ab_steps.py --batches 64 --context 32768 --kv bf16,packed \
  --weights fp8 --rounds 2 --variants "new;index lut epi2;index lut epi2, attn lut" > "$OUT/ab_b64.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"; grep -E "^[|]| ms$" "$OUT/ab_b64.log"
