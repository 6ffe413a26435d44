#!/usr/bin/env bash
# Session 51, third call (carry [".golden"], timeout ~300): the Gluon index kernel's direct
# form (`stages = 0`: code words loaded one per thread straight into registers, no cp.async,
# the Triton kernel's 24.7 KiB of shared memory). 1. the Gluon GPU tests; 2. the probe's
# `direct` set on a B = 64, 32K step's own inputs; 3. the B = 64, 32K FP8 step over packed
# caches, production against the direct form (AB_S; AB_VARIANTS); 4. the quick tier if TIER_S.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout -k 5 "${TEST_S:-90}" python3 -m pytest -q -p no:cacheprovider -rfEs tests/kernels/test_indexer_gluon.py \
  > "$OUT/test_gluon.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/test_gluon.log" | cut -c1-300
grep -E "^(FAILED|ERROR)" "$OUT/test_gluon.log" | head -8 | cut -c1-300
timeout -k 5 "${PROBE_S:-90}" python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv packed \
  --attn-set production --index-set direct --index-call 3 > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/probe.log" | grep index | cut -c1-200
if [ "${AB_S:-90}" != 0 ]; then
  timeout -k 5 "${AB_S:-90}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv packed \
    --weights fp8 --rounds 3 --variants "${AB_VARIANTS:-new;index gluon direct;index gluon direct sub4}" \
    > "$OUT/ab_batch_fp8.log" 2>&1
  echo "ab rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_batch_fp8.log"
fi
if [ "${TIER_S:-0}" != 0 ]; then
  bash scripts/dev_tier.sh
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_quick.log" | head -10 | cut -c1-250
fi
echo "done at $(($(date +%s) - T0)) s"
