#!/usr/bin/env bash
# For the fortieth entry, its first call (carry [".golden"], timeout 600): the single-sequence
# step's second stream (`runtime.decode.SIDE_STREAM`, built in the thirty-ninth entry without
# device time): 1. its GPU test alone (graph replay with the flag on == eager forward, byte
# for byte); 2. `ab_steps.py --single` with it on and off (FP8 weights, bf16 and packed caches,
# 4K and 32K; then bf16 weights at 32K); 3. the quick tier (the flag off, as committed).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 120 python3 -m pytest -q -p no:cacheprovider -x tests/runtime/test_gpu.py \
  -k "side_stream or replay_short" > "$OUT/side_test.log" 2>&1
echo "side-stream test rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/side_test.log" | cut -c1-200
timeout -k 5 150 python3 scripts/ab_steps.py --single 4096,32768 --weights fp8 --kv bf16,packed --rounds 3 \
  --variants "new;side stream" > "$OUT/ab_side_fp8.log" 2>&1
echo "ab fp8 rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 80 python3 scripts/ab_steps.py --single 32768 --weights bf16 --kv bf16 --rounds 3 \
  --variants "new;side stream" > "$OUT/ab_side_bf16.log" 2>&1
echo "ab bf16 rc $? at $(($(date +%s) - T0)) s"
grep "^| " "$OUT/ab_side_fp8.log" "$OUT/ab_side_bf16.log" | cut -d: -f2-
TIER_S="${TIER_S:-280}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
echo "done at $(($(date +%s) - T0)) s"
