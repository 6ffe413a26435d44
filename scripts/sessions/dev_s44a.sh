#!/usr/bin/env bash
# This session's first call (carry [".golden"], timeout 590): the fortieth entry's final
# default (the second stream on, its forks `SIDE_WKV` / `SIDE_INDEX` off) as one quick tier,
# then the steps against one stream and against each fork on, on the card this call gets (an
# H200 gives the issues' figures: the FP8 single-sequence step at 4K / 32K / 128K, the
# batched FP8 step at 32K, B = 1 and 64, both cache formats). dev_s43a.sh plus the forks.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
TIER_S="${TIER_S:-250}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
timeout -k 5 110 python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 --kv bf16 --rounds 2 \
  --variants "new;one stream;index beside" > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 150 python3 scripts/ab_steps.py --context 32768 --batches 1,64 --weights fp8 --kv bf16,packed --rounds 2 \
  --variants "new;one stream;wkv beside" > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_single.log" "$OUT/ab_batch.log"
echo "done at $(($(date +%s) - T0)) s"
