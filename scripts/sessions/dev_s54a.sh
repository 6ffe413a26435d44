#!/usr/bin/env bash
# Session 54's first call (carry nothing, timeout ~480): `dev_s53c.sh` (issue 15's blocker: the
# 32K FP8 steps at B = 1 and 64 over bf16 and packed caches, production (the Gluon afrag index
# kernel) and `index triton`; then the index tests edited after the last GPU run), followed by
# the single-sequence FP8 step at 4K / 32K / 128K over both cache formats (`SINGLE_S`, 0 skips).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
bash scripts/sessions/dev_s53c.sh
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
if [ "${SINGLE_S:-130}" -gt 0 ]; then
  timeout -k 5 "${SINGLE_S:-130}" python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 \
    --kv bf16,packed --rounds 3 --variants new > "$OUT/ab_single.log" 2>&1
  echo "ab single rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_single.log"
fi
echo "all done at $(($(date +%s) - T0)) s"
