#!/usr/bin/env bash
# Thirtieth entry, call 2 (written 2026-12-05): the decode GEMV's new production rule
# (`gemv._SPLIT_FORM = "launch"`, `_TARGET_PROGRAMS_FP8 = 16384`): the quick tier (golden
# files through the runtime on CUDA, the invariance tests), then the single-sequence step
# with FP8 and bf16 weights against the rule before ("gemv counter"), and the batched step at
# B = 1 and 64. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
TIER_S="${TIER_S:-300}" bash scripts/dev_tier.sh
timeout -k 5 150 python3 scripts/ab_steps.py --single 4096,32768 --weights fp8 --kv bf16 --rounds 2 \
  --variants "new;gemv counter" > "$OUT/ab_single_fp8.log" 2>&1
echo "ab fp8 rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 100 python3 scripts/ab_steps.py --single 4096 --weights bf16 --kv bf16 --rounds 2 \
  --variants "new;gemv counter;gemv 4096" > "$OUT/ab_single_bf16.log" 2>&1
echo "ab bf16 rc $? at $(($(date +%s) - T0)) s"
grep -E "^FAILED|^ERROR" "$OUT"/pytest_quick.log | head -8
grep "^|" "$OUT"/ab_single_*.log
