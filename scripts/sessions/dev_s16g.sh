#!/usr/bin/env bash
# 2026-12-04 (sixteenth entry), call 7: the full tier's long tests on the unchanged code,
# less the two 10k-step graph replays (device time left), 4 workers. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 400 python3 -m pytest -q -p no:cacheprovider -rfEs -n 4 --dist loadfile --durations 25 \
  --junitxml "$OUT/full.xml" -m gpu_full -k "not 10k_steps" tests > "$OUT/full_tier.log" 2>&1
echo "full tier (less the 10k replays) rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/full_tier.log" | cut -c1-300
grep -E "^(FAILED|ERROR)" "$OUT/full_tier.log" | head -20 | cut -c1-300
grep -E "^[0-9.]+s (call|setup)" "$OUT/full_tier.log" | head -25
