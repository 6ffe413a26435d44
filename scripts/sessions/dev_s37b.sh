#!/usr/bin/env bash
# Thirty-sixth entry: reindex layers over their candidates only (runtime/ops.compacts). On a
# fresh machine: the new GPU tests and the index / top-k kernels' (compiles them), then whole
# steps at 32K with FP8 weights, the compact form ("new") against the full form ("full
# reindex"): BatchGraphs B = 1 and 64 over both caches, DecodeGraphs single-sequence; then
# the quick tier in the time left. carry: [".golden"]; timeout_s 600.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 "${TEST_S:-120}" python3 -m pytest -q -p no:cacheprovider -rfE -n 8 \
  tests/kernels/test_indexer_gather.py tests/kernels/test_select_gather.py tests/runtime/test_compact_reindex.py \
  tests/kernels/test_topk.py tests/kernels/test_indexer_paged.py > "$OUT/tests.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; grep -E "FAILED|ERROR|passed|failed" "$OUT/tests.log" | tail -8
timeout -k 5 "${AB_S:-170}" python3 scripts/ab_steps.py --batches 1,64 --context 32768 --kv bf16,packed \
  --weights fp8 --rounds "${ROUNDS:-3}" --variants "new;full reindex" > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"; grep -E "^[|]" "$OUT/ab_batch.log"
timeout -k 5 "${SINGLE_S:-90}" python3 scripts/ab_steps.py --single 32768 --kv bf16,packed --weights fp8 --rounds 2 \
  --variants "new;full reindex" > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"; grep -E "^[|]" "$OUT/ab_single.log"
LEFT=$(( ${TOTAL_S:-585} - ($(date +%s) - T0) ))
echo "quick tier gets $LEFT s"
TIER_S=$LEFT bash scripts/dev_tier.sh
