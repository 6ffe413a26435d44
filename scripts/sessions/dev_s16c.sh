#!/usr/bin/env bash
# (The packed Gluon kernel these calls ran was removed after call 5; commit 5d1891c has it and its probes.)
# 2026-12-04 (sixteenth entry), call 3: the packed Gluon kernel's TMA row copies and timing
# variants (no dequantization / no MMAs), its GPU tests, an Nsight Compute attempt. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 120 python3 scripts/gluon_attn_probe.py --packed --batches 1,64 --tunes '[]' --ptunes '[{"nsplit": 2},
 {"nsplit": 2, "tma": true}, {"tma": true}, {"nsplit": 2, "diag": 1}, {"nsplit": 2, "diag": 2},
 {"nsplit": 2, "tma": true, "diag": 1}, {"nsplit": 2, "tma": true, "diag": 2}, {"nsplit": 4, "tma": true}]' > "$OUT/probe.md" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep -v "^(sparse" "$OUT/probe.md" | grep -v "| 100 |" | cut -c1-150
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -rfEs -x -n 4 tests/kernels/test_sparse_attn_gluon.py \
  > "$OUT/gluon_tests.log" 2>&1
echo "gluon tests rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/gluon_tests.log" | cut -c1-300
grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gluon_tests.log" | head -12 | cut -c1-400
timeout -k 5 150 ncu --clock-control none --kernel-name regex:_attn_gl_packed --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section MemoryWorkloadAnalysis python3 scripts/gluon_packed_ncu.py '{"nsplit": 2}' > "$OUT/ncu.txt" 2>&1
echo "ncu rc $? at $(($(date +%s) - T0)) s"; grep -E "Duration|Throughput|Stall|Issued|Eligible|Active Warps|No Eligible|One or More|Warp Cycles|L2 Hit|Mem Busy|Max Bandwidth|==PROF==|ERR" "$OUT/ncu.txt" | head -40 | cut -c1-150
