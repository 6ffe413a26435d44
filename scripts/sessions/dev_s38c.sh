#!/usr/bin/env bash
# Thirty-seventh entry, call 4: the index scores' `tokens` launch option (a prompt's
# consecutive tokens sharing each block of keys; runtime.ops.PROMPT_TOKENS = 4 in the prompt
# paths). 1. scripts/index_prefill_probe.py (one token per program against tokens 2-16 at a
# prompt chunk's shapes, bf16 and packed keys, the bytes compared); 2. the quick tier (its new
# GPU tests: tests/kernels/test_indexer_tokens.py, tests/runtime/test_prompt_tokens.py);
# 3. with the time left, a 131,072-token prompt (bench --parts long, FP8 weights) with
# PROMPT_TOKENS 4 and 1. carry: [".golden"]; timeout_s ≤ 545.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 "${PROBE_S:-150}" python3 scripts/index_prefill_probe.py > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
grep "^| " "$OUT/probe.log" | head -40
TIER_S="${TIER_S:-300}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
echo "tier done at $(($(date +%s) - T0)) s"
for tok in 4 1; do
  LEFT=$((${TOTAL_S:-535} - ($(date +%s) - T0)))
  [ "$LEFT" -lt 45 ] && { echo "long tokens=$tok: skipped, $LEFT s left"; continue; }
  timeout -k 5 "$((LEFT - 3))" python3 -c "
import sys, attnv41.runtime.ops as o
o.PROMPT_TOKENS = $tok
from attnv41.cli import main
sys.exit(main(sys.argv[1:]))" bench --parts long --long-context "${LONG:-131072}" --long-budget-s "$((LEFT - 25))" \
    --weights fp8 --out "$OUT/long-t$tok" > "$OUT/long_t$tok.log" 2>&1
  echo "long tokens=$tok rc $? at $(($(date +%s) - T0)) s"; grep -A3 "^context" "$OUT/long_t$tok.log" | cut -c1-200
done
