#!/usr/bin/env bash
# Session 45, call 4 (carry [".golden"], timeout 330): the quick tier on the session's final
# tree (the head weights scaled in the index-query chain; the top-k's workspace reverted to
# a memset per call).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
TIER_S="${TIER_S:-250}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
echo "done at $(($(date +%s) - T0)) s"
