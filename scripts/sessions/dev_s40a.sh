#!/usr/bin/env bash
# For the thirty-eighth entry (a fresh machine; carry [".golden"],
# timeout 600): 1. scripts/index_prefill_probe.py (`sub_tokens` 1 against 2 and 4, batched
# steps mixing a chunk with decode tokens: one launch with tokens 16 against the runtime's cut,
# the top-k over a prompt tile under smaller tiles); 2. the quick tier (the batched runtime's
# GPU test over the cut launches); 3. with the time left, the 1,048,000-token prompt over
# packed caches with FP8 weights (220.5 s on an H100 with tokens 16 and sub 2 / 4).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 "${PROBE_S:-150}" python3 scripts/index_prefill_probe.py > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep "^| " "$OUT/probe.log" | head -100
TIER_S="${TIER_S:-300}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
LEFT=$((${TOTAL_S:-590} - ($(date +%s) - T0)))
echo "tier done at $(($(date +%s) - T0)) s; $LEFT s left"
if [ "$LEFT" -gt 120 ]; then
  timeout -k 5 "$((LEFT - 5))" python3 -m attnv41 bench --parts long --long-context 1048000 --long-kv-formats packed \
    --long-budget-s "$((LEFT - 60))" --weights fp8 --out "$OUT/long" > "$OUT/long.log" 2>&1
  echo "long rc $? at $(($(date +%s) - T0)) s"; grep -A3 "^context" "$OUT/long.log" | cut -c1-220
fi
