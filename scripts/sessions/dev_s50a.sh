#!/usr/bin/env bash
# Session 50's first call (carry [".golden"], timeout 560). Issue 15's last target is the H200's
# batched 32K B = 64 step, packed against bf16 caches (8.538 against 8.138 ms with FP8 weights
# before the second stream; not measured on an H200 since). 1. that A/B on whichever card
# comes; 2. Nsight Compute on the B = 64 step's eight index-score launches over packed and
# over bf16 keys (never profiled: the packed launch reads its bytes at about a quarter of the
# copy rate, the bf16 one near it; stall reasons and occupancy say whether more bytes in
# flight would pay); 3. on an H200, the single-sequence FP8 step at 4K/32K/128K.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$card"
if [ "${AB_S:-120}" != 0 ]; then  # AB_S=0 skips it
  timeout -k 5 "${AB_S:-120}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv bf16,packed \
    --weights fp8 --rounds 3 --variants new > "$OUT/ab_batch_fp8.log" 2>&1
  echo "ab batch fp8 rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_batch_fp8.log"
fi
for kv in packed bf16; do
  timeout -k 5 "${NCU_S:-150}" ncu --clock-control none -k regex:_index_scores_kernel -c 8 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv "$kv" --attn-set production \
    --index-set production --reps 3 > "$OUT/ncu_index_$kv.txt" 2>&1
  echo "ncu $kv rc $? at $(($(date +%s) - T0)) s"
  grep -E "^  _index_scores_kernel|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Warp Cycles Per Issued|No Eligible" "$OUT/ncu_index_$kv.txt" | head -60 | cut -c1-150
done
case "$card" in
  *H200*)
    timeout -k 5 90 python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 \
      --kv bf16,packed --rounds 3 --variants new > "$OUT/ab_single.log" 2>&1
    echo "ab single rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_single.log" ;;
esac
echo "done at $(($(date +%s) - T0)) s"
