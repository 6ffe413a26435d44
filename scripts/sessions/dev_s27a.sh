#!/usr/bin/env bash
# 2026-12-05 (twenty-seventh entry, for the next session with a device): the rest of the
# full tier on the committed code. That entry ran the quick tier (1,410 passed) and 29 of the
# 32 other full-tier tests; not run: the three Flash tests of tests/runtime/test_gpu.py
# (one xdist worker under loadfile, so they ran in sequence past the limit), the
# 1M-position packed test (test_seed_packed.py), the bench smoke test (test_bench.py) and
# the two 10,000-step replays (dev_s27b.sh: each takes most of a call). Here the tests are
# spread one per worker (`--dist load`) and `-v` keeps each result in the log if the limit
# hits. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
timeout -k 10 "${TIER_S:-540}" python3 -m pytest -v -p no:cacheprovider -rfEs -n 5 --dist load \
  -m gpu_full -k "test_flash_stack_runtime_vs_reference or test_flash_graph_replay_short or test_flash_step_time_eager_vs_graph or test_seed_packed or test_bench" \
  tests > "$OUT/full_rest.log" 2>&1
echo "full tier (rest) rc $? in $(($(date +%s) - T0)) s"
grep -E "PASSED|FAILED|ERROR" "$OUT/full_rest.log" | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | sort
tail -3 "$OUT/full_rest.log"
