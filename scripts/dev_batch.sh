#!/usr/bin/env bash
# One device call for the batched step (issue 14): the GPU tests of continuations, rollback
# and batches, `attnv41 check --batch 8 --prefill-chunk 64` on every golden file on CUDA, and
# `attnv41 bench --parts batch` (bf16). Results under $OUT; a short table last.
set -u
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ATTNV41_GOLDEN_DIR="$PWD/.golden"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; T0=$(date +%s)
timeout ${TEST_S:-150} python3 -m pytest -v -s -m gpu -p no:cacheprovider ${TESTS:-tests/runtime/test_batch.py tests/test_golden_batched.py tests/test_golden_chunked.py tests/runtime/test_continuation.py} > "$OUT/pytest.log" 2>&1
echo "pytest rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
for g in ${GOLDENS:-tiny headdim fp8}; do
  timeout 120 python3 -m attnv41 check --golden .golden/v41_$g.safetensors --device cuda --batch ${BATCH:-8} --prefill-chunk ${CHUNK:-64} > "$OUT/check_batch_$g.log" 2>&1
  echo "check $g rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
done
timeout ${BENCH_S:-300} python3 -m attnv41 bench --parts ${PARTS:-batch} --weights bf16 ${BENCH_ARGS:-} --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
rm -f "$OUT/bench/decode_step.png"
cat "$OUT/times.txt"; grep -E "PASSED|FAILED|ERROR|passed|failed|batch invariance on CUDA" "$OUT/pytest.log" | tail -25
for f in "$OUT"/check_batch_*.log; do tail -1 "$f"; done
sed -n '/^(f)/,$p' "$OUT/bench.log" | head -30
