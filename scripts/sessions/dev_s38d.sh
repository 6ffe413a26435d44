#!/usr/bin/env bash
# Thirty-seventh entry, call 5 (the session's last 274 s): PROMPT_TOKENS = 16 with the
# PROMPT_MIN rule: the two new test files' GPU tests, then a 131,072-token prompt (bench
# --parts long, FP8 weights, bf16 caches) with PROMPT_TOKENS 16 and 1. carry: [".golden"].
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 70 python3 -m pytest -q -p no:cacheprovider -rfEs -n 4 -m gpu tests/kernels/test_indexer_tokens.py \
  tests/runtime/test_prompt_tokens.py > "$OUT/tests.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/tests.log" | cut -c1-200
for tok in 16 1; do
  LEFT=$((${TOTAL_S:-160} - ($(date +%s) - T0)))
  [ "$LEFT" -lt 25 ] && { echo "long tokens=$tok: skipped, $LEFT s left"; continue; }
  timeout -k 3 "$((LEFT - 2))" python3 -c "
import sys, attnv41.runtime.ops as o
o.PROMPT_TOKENS = $tok
from attnv41.cli import main
sys.exit(main(sys.argv[1:]))" bench --parts long --long-context 131072 --long-budget-s "$((LEFT - 12))" \
    --weights fp8 --out "$OUT/long-t$tok" > "$OUT/long_t$tok.log" 2>&1
  echo "long tokens=$tok rc $? at $(($(date +%s) - T0)) s"; grep -A3 "^context" "$OUT/long_t$tok.log" | cut -c1-200
done
