#!/usr/bin/env bash
# Session 50, second call (carry [".golden"], timeout 300). The first call (dev_s50b.sh, an
# H100) found the packed index kernel bound by its L1/TEX pipe (ncu: 80 % L1/TEX, 37 % DRAM),
# not by DRAM latency, and the Gluon cp.async form slower. 1. the Gluon tests with the
# NaN/inf case's fix (its vis clamp read unallocated table entries); 2. the probe's `l1`
# set (keys as the MMA's B operand: no shared-to-register load of the dequantized tile);
# 3. ncu's memory tables (shared against global wavefronts) on the production call over
# packed and over bf16 keys.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
if [ "${TESTS:-1}" != 0 ]; then  # TESTS=0 skips them
  timeout -k 5 90 python3 -m pytest -q -p no:cacheprovider -rfEs tests/kernels/test_indexer_gluon.py > "$OUT/test_gluon.log" 2>&1
  echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/test_gluon.log" | cut -c1-300
fi
timeout -k 5 "${PROBE_S:-100}" python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv packed,bf16 \
  --attn-set production --index-set l1 --index-call 3 > "$OUT/probe_l1.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/probe_l1.log" | grep index | cut -c1-160
for kv in packed bf16; do
  left=$((${TOTAL_S:-280} - $(date +%s) + T0)); [ "$left" -gt 30 ] || break
  timeout -k 5 "$left" ncu --clock-control none -k regex:_index_scores_kernel --launch-skip 3 -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section InstructionStats python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv "$kv" \
    --attn-set production --index-set production --index-call 3 --reps 1 > "$OUT/ncu_mem_$kv.txt" 2>&1
  echo "ncu $kv rc $? at $(($(date +%s) - T0)) s"
  grep -E "Duration|DRAM Throughput|L1/TEX Cache Throughput|Shared|Executed Instructions  |Issued Instructions  " \
    "$OUT/ncu_mem_$kv.txt" | head -24 | cut -c1-150
done
echo "done at $(($(date +%s) - T0)) s"
