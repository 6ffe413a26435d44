#!/usr/bin/env bash
# Session 45, call 2 (carry [".golden"], timeout 300): over production, fewer segments for the
# decode GEMV launches whose split needs a sum launch (the x launch, wo_a, wo_b) and the FP8
# row tile at 8 rows: the single-sequence FP8 step at 32K, 3 rounds (scripts/ab_steps.py).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 280 python3 scripts/ab_steps.py --single 32768 --weights fp8 --kv bf16 --rounds 3 \
  --variants "new;x 1;x 2;x 4;x 1 hw 1;x 1 acc8 8;acc8 8;wo_a 1;wo_a 2;wo_b 2;x 1 wo_a 1" > "$OUT/ab_segs.log" 2>&1
echo "ab segs rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_segs.log"
tail -3 "$OUT/ab_segs.log"
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fused.py 2>&1 | tail -2
echo "done at $(($(date +%s) - T0)) s"
