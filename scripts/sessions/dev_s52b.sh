#!/usr/bin/env bash
# Session 52, one call for everything (carry [".golden"], timeout 590): 1. the probe's `rows`
# set (the Triton index kernel's code words one per thread: `one_word`, `row0`) on a B = 64,
# 32K step's own inputs; 2. the B = 64, 32K FP8 step over packed caches, production against
# row0 and row0 + one_word (AB_S); 3. the quick tier (every kernel test on the GPU, the new
# ones' bytes against production included) in what is left of TOTAL_S.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout -k 5 "${PROBE_S:-100}" python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv packed \
  --attn-set production --index-set rows --index-call 3 > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/probe.log" | grep index | cut -c1-200
if [ "${AB_S:-190}" != 0 ]; then
  timeout -k 5 "${AB_S:-190}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv packed \
    --weights fp8 --rounds 3 --variants "${AB_VARIANTS:-new;index row0;index row0 one_word}" \
    > "$OUT/ab_batch_fp8.log" 2>&1
  echo "ab rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_batch_fp8.log"
fi
left=$((${TOTAL_S:-575} - $(date +%s) + T0))
if [ "$left" -gt 120 ]; then
  TIER_S=$left bash scripts/dev_tier.sh
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_quick.log" | head -10 | cut -c1-250
fi
echo "done at $(($(date +%s) - T0)) s"
