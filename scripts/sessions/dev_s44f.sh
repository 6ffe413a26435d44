#!/usr/bin/env bash
# Production's per-shape FP8 splits (`gemv._PLAN_SEGS`: wo_b 8, wq_b 1, indexer.wq_b 1)
# (carry [".golden"], timeout 370): the single-sequence FP8 step against the rule alone and
# with indexer.wq_b split again (4K / 32K / 128K, 3 rounds), then the quick tier (its log
# under $OUT as it runs, should the call's limit cut it).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 120 python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 --kv bf16 --rounds 3 \
  --variants "new;fp8 one chunk;indexer.wq_b split" > "$OUT/ab_final.log" 2>&1
echo "ab final rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_final.log"
TIER_S="${TIER_S:-250}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
