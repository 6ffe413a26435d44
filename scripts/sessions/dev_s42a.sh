#!/usr/bin/env bash
# For the fortieth entry, its first call (carry [".golden"], timeout 600): the decode steps'
# second stream under capture (`runtime.decode.SIDE_STREAM`, built in the thirty-ninth entry
# without device time; turned on before its first run, so this call decides): 1. its GPU
# tests (the Flash replays with the flag on, the default, and off == eager forward; batched
# graph steps with it on and off == eager twins); 2. `ab_steps.py` on against off ("one
# stream"): the single-sequence FP8 step at 4K and 32K, the batched FP8 step at 32K, B = 1
# and 64 (packed caches); 3. the quick tier (every graph test with the flag on).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/runtime/test_gpu.py tests/runtime/test_batch_graphs.py \
  -k "side_stream or replay_short or one_stream" > "$OUT/side_test.log" 2>&1
echo "side-stream tests rc $? at $(($(date +%s) - T0)) s"; tail -5 "$OUT/side_test.log" | cut -c1-200
timeout -k 5 110 python3 scripts/ab_steps.py --single 4096,32768 --weights fp8 --kv bf16 --rounds 3 \
  --variants "new;one stream" > "$OUT/ab_side_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 100 python3 scripts/ab_steps.py --context 32768 --batches 1,64 --weights fp8 --kv packed --rounds 2 \
  --variants "new;one stream" > "$OUT/ab_side_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_side_single.log" "$OUT/ab_side_batch.log"
TIER_S="${TIER_S:-270}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
echo "done at $(($(date +%s) - T0)) s"
