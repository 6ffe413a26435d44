#!/usr/bin/env bash
# Session 52, last call (carry nothing, timeout ~150): issue 15's blocker re-measured where an
# H200 comes: the B = 64, 32K FP8 step over bf16 and packed caches (ab_steps.py, 3 rounds).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout -k 5 "${AB_S:-120}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv bf16,packed \
  --weights fp8 --rounds 3 --variants new > "$OUT/ab_kv_fp8.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_kv_fp8.log"
