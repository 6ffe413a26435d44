#!/usr/bin/env bash
# 2026-12-04 (twelfth entry), call 7 (leftover device time, no code change): the paged index
# over packed keys around the final shape in whole B = 64, 32K packed steps (ab_steps.py):
# 8 blocks per program, 3 pipeline stages, no register cap. carry: []
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src"
T0=$(date +%s)
timeout -k 5 250 python3 scripts/ab_steps.py --context 32768 --batches 64 --kv packed --rounds 2 \
  --variants 'new;index paged packed sub 8;index paged packed sub 4 stages 3;index paged packed sub 4 uncapped' \
  > "$OUT/ab_paged.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
grep -E "^\|" "$OUT/ab_paged.log" | cut -c1-120
