#!/usr/bin/env bash
# 2026-12-04 (fifteenth entry), call 7: the Gluon attention's GPU tests (PDL on / off bytes),
# then whole batched steps (ab_steps.py, BatchGraphs at 32K, B = 32 and 64): Gluon with PDL,
# without, and off. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider -rfEs -n 4 tests/kernels/test_sparse_attn_gluon.py \
  tests/kernels/test_decode_invariance.py > "$OUT/pytest_gluon.log" 2>&1
echo "gluon tests rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/pytest_gluon.log" | cut -c1-300
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gluon.log" | head -10 | cut -c1-300
timeout -k 5 300 python3 scripts/ab_steps.py --context 32768 --batches 32,64 --rounds 2 \
  --variants "new;gluon without pdl;gluon off" > "$OUT/ab_steps.log" 2>&1
echo "ab_steps rc $? at $(($(date +%s) - T0)) s"; grep "^|" "$OUT/ab_steps.log"
