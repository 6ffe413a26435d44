#!/usr/bin/env bash
# For the thirty-ninth entry, its second call (carry [".golden"], timeout 600): the top-k's
# shape rule by positions (m·Lb) as committed: 1. its rows on the first call's grid against
# tile 2048 at 4 warps (the rest of the grid is the first call's); 2. the whole steps with the
# rule against the fixed shape before it (`ab_steps.py` "topk fixed shape"): the
# single-sequence FP8 step at 4K, 32K and 128K, the batched FP8 step at 32K, B = 1 and 64.
# The quick tier follows in its own call (dev_tier.sh).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 100 python3 scripts/topk_tune.py --lean --ms 1,2,4,8,16,64 --lbs 4096,32768,131072,1048576 \
  --tiles 2048 --warps 4 --budget 80 > "$OUT/topk_rule.log" 2>&1
echo "topk_tune rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 220 python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 --kv bf16 --rounds 2 \
  --variants "new;topk fixed shape" > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 220 python3 scripts/ab_steps.py --context 32768 --batches 1,64 --weights fp8 --kv bf16,packed \
  --rounds 2 --variants "new;topk fixed shape" > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
echo "--- top-k rule rows"; grep -E "^\| [0-9]+ \| [0-9]+ \| triton topk \|" "$OUT/topk_rule.log" | cut -c1-90
tail -12 "$OUT/ab_single.log"; tail -12 "$OUT/ab_batch.log"
echo "done at $(($(date +%s) - T0)) s"
