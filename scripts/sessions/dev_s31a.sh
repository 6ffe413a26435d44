#!/usr/bin/env bash
# For the next session with a device (written 2026-12-05, thirtieth entry): the quick tier on
# the final code of that entry (`tc_mm._SPLIT_FORM = "launch"` became production after its
# last GPU run; its bytes equal the counter's on the H100), then, ideally on an H200 (no H200
# figures of either launch form yet): the single-sequence FP8 step at 4K / 32K against the
# rule before ("gemv counter", H200 figures before: 3.14 / 3.16 ms), and the batched FP8 step
# at 32K, B = 1 / 64, bf16 and packed caches (issue 15: packed against bf16) against the
# counter form ("tc counter"). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
TIER_S="${TIER_S:-300}" bash scripts/dev_tier.sh
timeout -k 5 90 python3 scripts/ab_steps.py --single 4096,32768 --weights fp8 --kv bf16 --rounds 2 \
  --variants "new;gemv counter" > "$OUT/ab_single_fp8.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 "${AB_S:-150}" python3 scripts/ab_steps.py --batches 1,64 --context 32768 --kv bf16,packed \
  --weights fp8 --rounds 2 --variants "new;tc counter" > "$OUT/ab_batch_fp8.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
grep -E "^FAILED|^ERROR" "$OUT/pytest_quick.log" | head -8
grep "^|" "$OUT"/ab_*.log
