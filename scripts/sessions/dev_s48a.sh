#!/usr/bin/env bash
# Session 48, not run there (no machine, then too little budget): the next session's first call
# (carry [".golden"], timeout 450; `AB_S=100 SINGLE_S=90 BENCH_S=0` fits 230 s). After
# dev_s46b.sh ran on an H200 (its `long` part cut at 200 s, 30 of 31 passed, the CUDA bench
# test left): issue 15's open measurement on the H200 (the batched 32K B=64 step, bf16 against
# packed caches), the single-sequence FP8 step at 4K/32K/128K, then that CUDA bench test.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 "${AB_S:-120}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv bf16,packed \
  --rounds 3 --variants new > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_batch.log"
timeout -k 5 "${SINGLE_S:-110}" python3 scripts/ab_steps.py --single 4096,32768,131072 --weights fp8 \
  --kv bf16 --rounds 3 --variants new > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_single.log"
if [ "${BENCH_S:-190}" -gt 0 ]; then  # BENCH_S=0 skips the bench test on a short budget
  timeout -k 5 "${BENCH_S:-190}" python3 -m pytest -v -p no:cacheprovider -rfEs -m gpu_full \
    "tests/test_bench.py::test_bench_command_on_cuda_small" > "$OUT/bench_test.log" 2>&1
  echo "bench test rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/bench_test.log" | cut -c1-300
fi
echo "done at $(($(date +%s) - T0)) s"
