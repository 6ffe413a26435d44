#!/usr/bin/env bash
# For the session after the thirty-seventh entry (a fresh machine; carry [".golden"],
# timeout 600): 1. scripts/index_prefill_probe.py (the `tokens` option's shapes, 128-key
# blocks; the top-k over a prompt tile under other tiles and warps); 2. the quick tier (the
# batched runtime's GPU test with PROMPT_TOKENS 16 among it, cut by its limit last session);
# 3. with the time left, the 1,048,000-token prompt over packed caches with FP8 weights
# (the thirty-seventh entry's H100: 226.5 s before PROMPT_TOKENS; compare on the same card).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 "${PROBE_S:-120}" python3 scripts/index_prefill_probe.py > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep "^| " "$OUT/probe.log" | head -60
TIER_S="${TIER_S:-300}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
LEFT=$((${TOTAL_S:-590} - ($(date +%s) - T0)))
echo "tier done at $(($(date +%s) - T0)) s; $LEFT s left"
if [ "$LEFT" -gt 120 ]; then
  timeout -k 5 "$((LEFT - 5))" python3 -m attnv41 bench --parts long --long-context 1048000 --long-kv-formats packed \
    --long-budget-s "$((LEFT - 60))" --weights fp8 --out "$OUT/long" > "$OUT/long.log" 2>&1
  echo "long rc $? at $(($(date +%s) - T0)) s"; grep -A3 "^context" "$OUT/long.log" | cut -c1-220
fi
