#!/usr/bin/env bash
# Session 50 (carry [".golden"], timeout 450; TOTAL_S bounds the ncu part): the Gluon index scores over packed keys
# (`kernels/indexer_gluon.py`, cp.async stages). 1. its GPU tests (bytes against the Triton
# kernel); 2. `batch_kernel_probe.py --index-set gluon` on a B = 64, 32K step's own inputs (the
# ratio-1 source's call, 32K keys per sequence; each row's bytes against production); 3. the
# batched 32K B = 64 FP8 step, bf16 against packed caches, production against "index gluon"
# (issue 15's target on an H200); 4. with time left, Nsight Compute on both index kernels.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$card"
timeout -k 5 "${TEST_S:-120}" python3 -m pytest -q -p no:cacheprovider -rfEs -x tests/kernels/test_indexer_gluon.py \
  > "$OUT/test_gluon.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/test_gluon.log" | cut -c1-300
grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/test_gluon.log" | head -8 | cut -c1-300
timeout -k 5 "${PROBE_S:-120}" python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv packed,bf16 \
  --attn-set production --index-set gluon --index-call 3 > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/probe.log" | cut -c1-200
if [ "${AB_S:-180}" != 0 ]; then
  timeout -k 5 "${AB_S:-180}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv bf16,packed \
    --weights fp8 --rounds 3 --variants "${AB_VARIANTS:-new;index gluon}" > "$OUT/ab_batch_fp8.log" 2>&1
  echo "ab rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_batch_fp8.log"
fi
for k in gl tri; do  # the Gluon kernel's first launch; the step's 4th index call (the probe's input)
  left=$((${TOTAL_S:-430} - $(date +%s) + T0))
  [ "$left" -gt 60 ] || break
  if [ $k = gl ]; then sel=(-k regex:_index_gl_kernel -c 1); else sel=(-k regex:_index_scores_kernel --launch-skip 3 -c 1); fi
  timeout -k 5 "$left" ncu --clock-control none "${sel[@]}" \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv packed --attn-set production \
      --index-set gluon --index-call 3 --reps 1 > "$OUT/ncu_$k.txt" 2>&1
  echo "ncu $k rc $? at $(($(date +%s) - T0)) s"
  grep -E "^  _index|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Warp Cycles Per Issued|Stall" \
    "$OUT/ncu_$k.txt" | head -30 | cut -c1-150
done
echo "done at $(($(date +%s) - T0)) s"
