#!/usr/bin/env bash
# Session 45, call 2 (carry [".golden"], timeout 560): the index head weights scaled in the
# index-query chain and the top-k's self-clearing histograms (production), against the
# histograms zeroed per call ("hist memset"), and over production fewer segments for the
# decode GEMV launches whose split needs a sum launch (the x launch, wo_a, wo_b) and the
# FP8 row tile at 8 rows: the single-sequence FP8 step at 32K (3 rounds), the batched FP8
# step at 32K (B = 1, 64, bf16 caches); then the quick tier (the changed kernels' tests on CUDA among it).
# Ran on 80cc422 (the tree with the self-clearing workspace of 837294a); the workspace
# measured no faster and was reverted, with ab_steps.py's "hist memset" (forty-second entry).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 200 python3 scripts/ab_steps.py --single 32768 --weights fp8 --kv bf16 --rounds 3 \
  --variants "new;hist memset;x 1;x 2;x 4;x 1 hw 1;x 1 acc8 8;acc8 8;wo_a 1;wo_a 2;wo_b 2;x 1 wo_a 1" \
  > "$OUT/ab_segs.log" 2>&1
echo "ab segs rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 90 python3 scripts/ab_steps.py --context 32768 --batches 1,64 --weights fp8 --kv bf16 --rounds 2 \
  --variants "new;hist memset" > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_segs.log" "$OUT/ab_batch.log"
TIER_S="${TIER_S:-250}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
echo "done at $(($(date +%s) - T0)) s"
