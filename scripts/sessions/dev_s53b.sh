#!/usr/bin/env bash
# Session 53 (carry nothing, timeout ~520): the Gluon index kernel's keys straight into the MMA's
# A fragment (`afrag`, `slice_out`): 1. its GPU tests (bytes equal to the Triton kernel's);
# 2. the probe's `afrag` set on a B = 64, 32K step's ratio-1 index call (packed keys, L2
# flushed); 3. the B = 64, 32K FP8 step over bf16 and packed caches (production: on an H200
# issue 15's blocker re-measured), then over packed caches with the runtime's gluon option
# in its afrag forms (AB1_S, AB2_S; AB2_S=0 skips the second).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$OUT/gpu.txt"
timeout -k 5 "${TEST_S:-90}" python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_indexer_gluon.py \
  -k "${TEST_K:-afrag or same_bytes_as}" > "$OUT/tests.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/tests.log" | cut -c1-250
timeout -k 5 "${PROBE_S:-100}" python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv packed \
  --attn-set production --index-set afrag --index-call 3 > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/probe.log" | grep index | cut -c1-200
# issue 15's blocker (production, both cache formats), then the afrag forms over packed caches
timeout -k 5 "${AB1_S:-130}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv bf16,packed \
  --weights fp8 --rounds 3 --variants new > "$OUT/ab_kv_fp8.log" 2>&1
echo "ab kv rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_kv_fp8.log"
if [ "${AB2_S:-150}" != 0 ]; then
  timeout -k 5 "${AB2_S:-150}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv packed --weights fp8 \
    --rounds 3 --variants "${AB_VARIANTS:-new;index gluon afrag;index gluon afrag ahead row0}" \
    > "$OUT/ab_afrag_fp8.log" 2>&1
  echo "ab afrag rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_afrag_fp8.log"
fi
echo "done at $(($(date +%s) - T0)) s"
