#!/usr/bin/env bash
# One device call for the batched step (issues 14, 15): the GPU tests of continuations,
# rollback, batches, batch graphs and packed caches, `attnv41 check --batch 8 --prefill-chunk
# 64 --kv-format bf16|packed` on every golden file on CUDA, and
# `attnv41 bench --parts batch` (bf16), and with PROFILE_BATCHES="1 64" scripts/step_profile.py --batch. Results under $OUT; a short table last.
set -u
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ATTNV41_GOLDEN_DIR="$PWD/.golden"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; T0=$(date +%s)
timeout ${TEST_S:-150} python3 -m pytest -v -s -m gpu -p no:cacheprovider ${TESTS:-tests/runtime/test_batch.py tests/runtime/test_batch_graphs.py tests/runtime/test_batch_packed.py tests/kernels/test_sparse_attn_packed.py tests/kernels/test_indexer_packed.py tests/test_golden_batched.py tests/test_golden_chunked.py tests/runtime/test_continuation.py} > "$OUT/pytest.log" 2>&1
echo "pytest rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
for g in ${GOLDENS:-tiny headdim fp8}; do
  for f in ${KV_FORMATS:-bf16 packed}; do
    timeout 120 python3 -m attnv41 check --golden .golden/v41_$g.safetensors --device cuda --batch ${BATCH:-8} --prefill-chunk ${CHUNK:-64} --kv-format $f > "$OUT/check_batch_${g}_$f.log" 2>&1
    echo "check $g $f rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
  done
done
timeout ${BENCH_S:-300} python3 -m attnv41 bench --parts ${PARTS:-batch} --weights bf16 ${BENCH_ARGS:-} --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
rm -f "$OUT/bench/decode_step.png"
for b in ${PROFILE_BATCHES:-}; do
  OUT=$OUT timeout 120 python3 scripts/step_profile.py --context ${PROFILE_CTX:-4096} --batch $b --steps 3 > "$OUT/profile_b$b.log" 2>&1
  echo "profile b$b rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
done
cat "$OUT/times.txt"; grep -E "PASSED|FAILED|ERROR|passed|failed|batch invariance on CUDA" "$OUT/pytest.log" | tail -25
for f in "$OUT"/check_batch_*.log; do tail -1 "$f"; done
sed -n '/^(f)/,$p' "$OUT/bench.log" | head -30
for f in "$OUT"/profile_b*.log; do [ -f "$f" ] && head -30 "$f"; done
