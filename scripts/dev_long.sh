#!/usr/bin/env bash
# Issue 15's whole 1M-token prefill on the H200 (2026-12-03, sixth entry): `attnv41 bench
# --parts long`, one 1,048,000-token prompt through BatchGraphs in 2,048-token chunks (bf16
# weights and caches), then 20 decode steps at its end; the part stops launching chunks after
# LONG_BUDGET_S seconds (default 420) and its row says how far it got.
#   carry: [".golden"]; run: bash scripts/dev_long.sh
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 "${BENCH_S:-575}" python3 -m attnv41 bench --parts long --weights bf16 --contexts 4096 --prefill 2048 \
  --long-context "${LONG_CONTEXT:-1048000}" --long-kv-formats "${LONG_KV:-bf16}" --long-budget-s "${LONG_BUDGET_S:-420}" \
  --no-progress --out "$OUT/bench_long" > "$OUT/bench_long.log" 2>&1
echo "bench long rc $? in $(($(date +%s) - T0)) s"
grep -E "^(gate|ceilings|stack|long)" "$OUT/bench_long.log" | tail -30
sed -n '/^(h)/,/^$/p' "$OUT/bench_long.log"
tail -5 "$OUT/bench_long.log"
