#!/usr/bin/env bash
# 2026-12-05 (twenty-seventh entry, for a later call): one of the full tier's 10,000-step
# Flash graph replays per call (INDEX_KEYS=own or released; each near the 10-minute limit
# on the H200, eighteenth entry). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
timeout -k 10 "${TIER_S:-570}" python3 -m pytest -v -p no:cacheprovider -rfEs -m gpu_full \
  -k "test_flash_graph_replay_10k_steps and ${INDEX_KEYS:-own}" tests/runtime/test_gpu.py > "$OUT/replay10k.log" 2>&1
echo "10k replay (${INDEX_KEYS:-own}) rc $? in $(($(date +%s) - T0)) s"
tail -5 "$OUT/replay10k.log"
