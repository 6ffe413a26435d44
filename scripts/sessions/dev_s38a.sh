#!/usr/bin/env bash
# For the session after the thirty-sixth entry (a fresh machine): the quick tier on the code
# whose compact-reindex paths came after that entry's device calls (prefills and
# continuations, tiled batched steps, the engine ops `candidate_ids` /
# `index_topk_candidates`), then a 262,144-token prompt in chunks (`bench --parts long`,
# FP8 weights, bf16 caches, 150 s budget each) with the compact form and without it
# (`COMPACT_REINDEX = False`): how much of a long prefill the reindex layers' full scoring
# took. carry: [".golden"]; timeout_s 600.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
TIER_S="${TIER_S:-330}" bash scripts/dev_tier.sh
echo "tier done at $(($(date +%s) - T0)) s"
ARGS="bench --parts long --long-context ${LONG:-262144} --long-budget-s ${BUDGET:-90} --weights fp8 --out $OUT/long"
for form in compact full; do
  flag=True; [ "$form" = full ] && flag=False
  timeout -k 5 "${LONG_S:-120}" python3 -c "
import sys, attnv41.runtime.ops as o
o.COMPACT_REINDEX = $flag
from attnv41.cli import main
sys.exit(main(sys.argv[1:]))" $ARGS-$form > "$OUT/long_$form.log" 2>&1
  echo "long $form rc $? at $(($(date +%s) - T0)) s"; grep -A3 "^context" "$OUT/long_$form.log" | cut -c1-200
done
