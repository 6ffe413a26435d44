#!/usr/bin/env bash
# Session 51, one call for all (carry [".golden"], timeout ~560): dev_s51a.sh's Gluon tests,
# probe and A/B (TEST_S, PROBE_S, AB_S), then the quick tier (TIER_S; the session's CPU-side
# test changes and the Gluon option), then dev_s51a.sh's ncu part while TOTAL_S allows.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
TOTAL="${TOTAL_S:-540}"
TOTAL_S=0 bash scripts/sessions/dev_s51a.sh
left=$((TOTAL - $(date +%s) + T0 - 20))
if [ "${TIER_S:-280}" != 0 ] && [ "$left" -gt 60 ]; then
  tier=$(( left < ${TIER_S:-280} ? left : ${TIER_S:-280} ))
  TIER_S=$tier bash scripts/dev_tier.sh
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_quick.log" | head -10 | cut -c1-250
fi
left=$((TOTAL - $(date +%s) + T0))
if [ "$left" -gt 80 ]; then
  TEST_S=0 PROBE_S=0 AB_S=0 TOTAL_S=$left NCU_ONLY=1 bash scripts/sessions/dev_s51a.sh
fi
echo "all done at $(($(date +%s) - T0)) s"
