#!/usr/bin/env bash
# Session 53 (carry nothing, timeout 590): packed rows and keys straight into the MMA's A
# fragment, in the Gluon index kernel (`afrag`, `slice_out`, `row0`, `ahead`) and in a Gluon
# logits kernel (`sparse_attn_split`'s `gluon_logits`): 1. their GPU tests (bytes equal to the
# Triton kernels'); 2. the probe's `glogits` and `afrag` sets on a B = 64, 32K step's inputs
# (its attention, its ratio-1 index call; packed, L2 flushed); 3. the B = 64, 32K FP8 step
# over bf16 and packed caches (production: on an H200 issue 15's blocker re-measured), then
# over packed caches with the index kernel's afrag form and the Gluon logits (AB1_S, AB2_S;
# AB2_S=0 skips the second).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$OUT/gpu.txt"
timeout -k 5 "${TEST_S:-150}" python3 -m pytest -q -p no:cacheprovider -rfE -n 4 \
  tests/kernels/test_indexer_gluon.py tests/kernels/test_sparse_attn_logits_gluon.py \
  -k "${TEST_K:-afrag or zero_code or same_bytes_as or logits or mixed or unaligned or graph_replay_with or refuses}" \
  > "$OUT/tests.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/tests.log" | cut -c1-250
timeout -k 5 "${PROBE_S:-140}" python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv packed \
  --attn-set glogits --index-set afrag --index-call 3 > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/probe.log" | cut -c1-200
# issue 15's blocker (production, both cache formats), then the afrag forms over packed caches
timeout -k 5 "${AB1_S:-130}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv bf16,packed \
  --weights fp8 --rounds 3 --variants new > "$OUT/ab_kv_fp8.log" 2>&1
echo "ab kv rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_kv_fp8.log"
if [ "${AB2_S:-160}" != 0 ]; then
  timeout -k 5 "${AB2_S:-160}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv packed --weights fp8 \
    --rounds 3 --variants "${AB_VARIANTS:-new;index gluon afrag;attn gluon logits}" \
    > "$OUT/ab_afrag_fp8.log" 2>&1
  echo "ab afrag rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_afrag_fp8.log"
fi
echo "done at $(($(date +%s) - T0)) s"
