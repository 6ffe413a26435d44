#!/usr/bin/env bash
# The next session's first call (carry [".golden"], timeout 480): the forty-first entry's
# production (the second stream, the FP8 GEMV's per-shape splits) on the card the call gets
# (an H200 gives the issues' figures): the single-sequence FP8 step against the rule alone
# and one stream (4K / 32K / 128K, 3 rounds), the batched FP8 step at 32K (B = 1, 64; both
# cache formats; against one stream), then the quick tier.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 120 python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 --kv bf16 --rounds 3 \
  --variants "new;fp8 one chunk;one stream" > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 120 python3 scripts/ab_steps.py --context 32768 --batches 1,64 --weights fp8 --kv bf16,packed --rounds 2 \
  --variants "new;one stream" > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_single.log" "$OUT/ab_batch.log"
TIER_S="${TIER_S:-250}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
echo "done at $(($(date +%s) - T0)) s"
