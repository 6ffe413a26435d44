#!/usr/bin/env bash
# Thirty-sixth entry, the call after the quick tier (`TIER_S=560 bash scripts/dev_tier.sh` on a
# fresh machine), while warm: where the H200's packed B = 64 step loses. The attention's two
# work-cutting forms (`lut`, `fmt_loops`: each, both, neither) in whole steps, and the same
# steps without programmatic dependent launch (does PDL's overlap favour bf16 caches?).
# About 200 s. carry: [".golden"].
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 "${AB_S:-120}" python3 scripts/ab_steps.py --batches 64 --context 32768 --kv bf16,packed \
  --weights fp8 --rounds "${ROUNDS:-3}" --variants "new;attn lut;attn fmt loops;attn lut fmt loops" > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"; grep -E "^[|]" "$OUT/ab_batch.log"
ATTNV41_PDL=0 timeout -k 5 "${NOPDL_S:-90}" python3 scripts/ab_steps.py --batches 64 --context 32768 --kv bf16,packed \
  --weights fp8 --rounds "${ROUNDS:-3}" --variants "new" > "$OUT/ab_nopdl.log" 2>&1
echo "ab no-pdl rc $? at $(($(date +%s) - T0)) s"; grep -E "^[|]" "$OUT/ab_nopdl.log"
