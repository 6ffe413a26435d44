#!/usr/bin/env bash
# Single FP8 weights' split counts in the single-sequence step (carry [".golden"], timeout
# 300): `gemv._PLAN_SEGS` overrides against the rule's one chunk per program (production),
# FP8 weights, bf16 caches, 4K and 32K, 3 rounds; then the split-override CPU test on CUDA.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 220 python3 scripts/ab_steps.py --single 4096,32768 --weights fp8 --kv bf16 --rounds 3 \
  --variants "new;wo_b 4;wo_b 8;wo_b 16;wo_a 4;wo_a 8;wq_b 1;x 10;x 5;wo_b 8 wo_a 8 wq_b 1" > "$OUT/ab_segs.log" 2>&1
echo "ab segs rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv_split_forms.py -k override \
  > "$OUT/pytest_override.log" 2>&1
echo "override test rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/pytest_override.log"
grep -h "^| " "$OUT/ab_segs.log"
echo "done at $(($(date +%s) - T0)) s"
