#!/usr/bin/env bash
# Session 17, call 2: the full tier's failing test with its traceback, the rest of
# runtime/test_gpu.py's full tier, and the two replay tests at ATTNV41_REPLAY_STEPS,
# as parallel processes (each its own log under $OUT).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
L="${LIMIT:-430}"
pt() { timeout -k 5 "$L" python3 -m pytest -v -p no:cacheprovider -p no:xdist -rfEs --tb=long "$@"; }
T0=$(date +%s)
pt tests/test_bench.py -k test_bench_command_on_cuda_small -m gpu_full > "$OUT/bench_small.log" 2>&1 &
ATTNV41_STACK_STEPS="${STACK_STEPS:-50}" pt tests/runtime/test_gpu.py -m gpu_full \
  -k "stack_runtime_vs_reference" > "$OUT/stack.log" 2>&1 &
pt tests/runtime/test_gpu.py -m gpu_full -k "graph_replay_short or step_time" -s > "$OUT/short.log" 2>&1 &
for k in own released; do
  ATTNV41_REPLAY_STEPS="${REPLAY_STEPS:-5000}" pt tests/runtime/test_gpu.py -m gpu_full \
    -k "10k_steps and $k" > "$OUT/replay_$k.log" 2>&1 &
done
wait
echo "all done at $(($(date +%s) - T0)) s"
for f in "$OUT"/*.log; do echo "== $(basename "$f"): $(tail -1 "$f" | cut -c1-200)"; done
grep -hE "^E |Error|assert" "$OUT/bench_small.log" | head -40 | cut -c1-300
grep -h "40-layer decode step" "$OUT/short.log"
