#!/usr/bin/env bash
# 2026-12-03, call 6: Nsight Compute on the batched decode attention's two kernels (B = 64,
# bf16 and packed rows, scripts/attn_ncu.py): speed of light, occupancy, warp stall reasons.
# Where the packed logits kernel (33.9 µs in the step against 20.0 over bf16 rows) waits.
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
timeout -k 5 "${NCU_S:-150}" "$NCU" --clock-control none -k regex:"_logits_kernel|_pv_combine_kernel" \
  --launch-skip 2 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
  --section MemoryWorkloadAnalysis python3 scripts/attn_ncu.py --batch 64 > "$OUT/ncu.txt" 2>&1
echo "ncu rc $?"
grep -E "^  [a-zA-Z_]+kernel|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|Compute \(SM\) Throughput|DRAM Throughput|Stall|cycles being stalled|Warp Cycles Per Issued|packed ==|finite|ERR|rror" "$OUT/ncu.txt" | head -80
