#!/usr/bin/env bash
# For the fortieth entry, its second call (carry [".golden"], timeout 600): the second stream
# carries more (`runtime.decode.SIDE_WKV`: wkv's product beside wq_a's; `SIDE_INDEX`: an
# index source's index path beside wq_b's product; both on as the working tree has them):
# 1. `ab_steps.py`, each fork against the step without it and
# against one stream: the single-sequence FP8 step at 4K and 32K (bf16 caches), the batched
# FP8 step at 32K, B = 1 and 64 (packed caches); 2. the quick tier (its stream tests: Flash
# replays with each fork on and off == eager forward, batched graph steps == eager twins).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 75 python3 scripts/ab_steps.py --single 4096,32768 --weights fp8 --kv bf16 --rounds 2 \
  --variants "new;wkv with wq_a;index after wq_b;one stream" > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 80 python3 scripts/ab_steps.py --context 32768 --batches 1,64 --weights fp8 --kv packed --rounds 2 \
  --variants "new;wkv with wq_a;one stream" > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_single.log" "$OUT/ab_batch.log"
TIER_S="${TIER_S:-230}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
echo "done at $(($(date +%s) - T0)) s"
