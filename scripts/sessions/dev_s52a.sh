#!/usr/bin/env bash
# Session 52 (carry [".golden"], timeout ~580): the Triton index kernel's code words one per
# thread (`one_word`, `row0`: the paged launch's bank conflicts and sector waste of its
# four-words layout). 1. the GPU tests of the index kernels and the packed loaders (bytes
# against production); 2. the probe's `rows` set on a B = 64, 32K step's own inputs; 3. the
# B = 64, 32K FP8 step over packed caches (AB_S; AB_VARIANTS); 4. ncu on the row0 launch (NCU_S).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout -k 5 "${TEST_S:-120}" python3 -m pytest -q -p no:cacheprovider -rfEs -n 4 tests/kernels/test_indexer_paged.py \
  tests/kernels/test_indexer_tokens.py tests/kernels/test_indexer_packed.py tests/kernels/test_packed_rows.py \
  > "$OUT/test_rows.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/test_rows.log" | cut -c1-300
grep -E "^(FAILED|ERROR)" "$OUT/test_rows.log" | head -8 | cut -c1-300
timeout -k 5 "${PROBE_S:-120}" python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv packed \
  --attn-set production --index-set rows --index-call 3 > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/probe.log" | grep index | cut -c1-200
if [ "${AB_S:-240}" != 0 ]; then
  timeout -k 5 "${AB_S:-240}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv packed \
    --weights fp8 --rounds 3 --variants "${AB_VARIANTS:-new;index row0;index one_word;index row0 one_word}" \
    > "$OUT/ab_batch_fp8.log" 2>&1
  echo "ab rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_batch_fp8.log"
fi
left=$((${TOTAL_S:-560} - $(date +%s) + T0))
if [ "${NCU_S:-1}" != 0 ] && [ "$left" -gt 60 ]; then
  timeout -k 5 "$left" ncu --clock-control none -k regex:_index_scores_kernel --launch-skip 3 -c 1 -o "$OUT/ncu_row0" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables \
    python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv packed --attn-set production \
      --index-set row0 --index-call 3 --reps 1 > "$OUT/ncu_row0.log" 2>&1
  echo "ncu rc $? at $(($(date +%s) - T0)) s"
  ncu --import "$OUT/ncu_row0.ncu-rep" --print-details all > "$OUT/ncu_row0.txt" 2>&1
  grep -E "^  _index|Duration|DRAM Throughput|L1/TEX Cache Throughput|bank|wavefronts|Sectors" "$OUT/ncu_row0.txt" \
    | head -16 | cut -c1-160
  rm -f "$OUT/ncu_row0.ncu-rep"
fi
echo "done at $(($(date +%s) - T0)) s"
