#!/usr/bin/env bash
# One device call for the tensor-core batched projections: scripts/tc_tune.py, the GPU
# tests of tc_mm, batch graphs and batches (golden batched on CUDA), `check --batch` on
# the golden files, and a profile of a batch-64 graph step. Results under $OUT; summary last.
set -u
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ATTNV41_GOLDEN_DIR="$PWD/.golden"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; T0=$(date +%s)
OUT=$OUT BUDGET_S=${TUNE_S:-150} timeout $(( ${TUNE_S:-150} + 60 )) python3 scripts/tc_tune.py > "$OUT/tc_tune.log" 2>&1
echo "tune rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
timeout ${TEST_S:-170} python3 -m pytest -v -m gpu -p no:cacheprovider ${TESTS:-tests/kernels/test_tc_mm.py tests/runtime/test_batch_graphs.py tests/runtime/test_batch.py tests/test_golden_batched.py} > "$OUT/pytest.log" 2>&1
echo "pytest rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
for g in ${GOLDENS:-tiny headdim fp8}; do
  timeout 60 python3 -m attnv41 check --golden .golden/v41_$g.safetensors --device cuda --batch 8 --prefill-chunk 64 > "$OUT/check_batch_$g.log" 2>&1
  echo "check $g rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
done
for b in ${PROFILE_BATCHES:-64}; do
  OUT=$OUT timeout 120 python3 scripts/step_profile.py --context 4096 --batch $b --steps 3 > "$OUT/profile_b$b.log" 2>&1
  echo "profile b$b rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
done
cat "$OUT/times.txt"; grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest.log" | tail -12
for f in "$OUT"/check_batch_*.log; do tail -1 "$f"; done
sed -n '/^| m | kernel/,$p' "$OUT/tc_tune.log"; grep -i "fail\|error" "$OUT/tc_tune.log" | head -5
for f in "$OUT"/profile_b*.log; do [ -f "$f" ] && head -24 "$f"; done
