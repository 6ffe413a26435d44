#!/usr/bin/env bash
# The GPU work the 2026-12-03 (fourth entry) session left unrun, in one device call:
# 1. the CUDA tests of graph steps with prompts and long calls (`test_mixed_graph_replay_
#    equals_eager_on_cuda`) and the other BatchGraphs / batch / tc_mm GPU tests, one process;
# 2. `bench --parts batch`: decode and verify rows (k = 1, 2, 4) at B = 1, 64 over 4K with
#    bf16 caches, and the chunked prefill (g), eager against graphs, at 4K and 32K.
# Results under $OUT (at most 8 files come back); a short table last.
#   carry: [".golden"]; run: bash scripts/sessions/dev_next.sh
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
el() { echo "$(($(date +%s) - T0)) s"; }
timeout "${TEST_S:-200}" python3 -m pytest -q -p no:cacheprovider -rfEs -m gpu tests/runtime/test_batch_graphs.py \
  tests/runtime/test_batch.py tests/kernels/test_tc_mm.py > "$OUT/pytest.log" 2>&1
echo "pytest rc $? at $(el)"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest.log" | tail -6
timeout "${BENCH_S:-300}" python3 -m attnv41 bench --parts batch --weights bf16 --batch-sizes 1,64 \
  --batch-contexts 4096,32768 --batch-kv-formats bf16 --verify-lens 1,2,4 --no-progress --out "$OUT/bench" \
  > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(el)"
rm -f "$OUT/bench/"*.png
sed -n '/^(f)/,$p' "$OUT/bench.log" | head -30
