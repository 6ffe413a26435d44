#!/usr/bin/env bash
# Session 53 (carry nothing, timeout ~420): the Gluon index kernel's keys straight into the MMA's
# A fragment (`afrag`, `slice_out`): 1. its GPU tests (bytes equal to the Triton kernel's);
# 2. the probe's `afrag` set on a B = 64, 32K step's ratio-1 index call (packed keys, L2
# flushed); 3. the B = 64, 32K FP8 step over bf16 and packed caches, production against the
# runtime's gluon option with afrag (on an H200 this is also issue 15's blocker re-measured).
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
if [ "${AB_S:-200}" != 0 ]; then
  timeout -k 5 "${AB_S:-200}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv "${AB_KV:-packed,bf16}" \
    --weights fp8 --rounds 3 --variants "${AB_VARIANTS:-new;index gluon afrag}" > "$OUT/ab_batch_fp8.log" 2>&1
  echo "ab rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_batch_fp8.log"
fi
echo "done at $(($(date +%s) - T0)) s"
