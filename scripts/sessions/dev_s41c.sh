#!/usr/bin/env bash
# For the thirty-ninth entry, its last call (carry [".golden"], timeout 420): on an H200,
# `dev_s41b.sh` (the steps with the top-k rule against the fixed shape: the issues' FP8 and
# packed B = 64 figures on the card they name); on an H100, the 1,048,000-token prompt over
# packed caches with FP8 weights (`bench --parts long`), whose prompt tiles' top-k now launch
# 4 warps (the rule by positions), against the thirty-eighth entry's 197.9 s past captures.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
case "$GPU" in *H200*) exec bash scripts/sessions/dev_s41b.sh ;; esac
LEFT=${TOTAL_S:-460}
if [ "$LEFT" -lt 300 ]; then echo "an H100 and $LEFT s: too short for the 1M prompt, nothing run"; exit 0; fi
timeout -k 5 "$((LEFT - 5))" python3 -m attnv41 bench --parts long --long-context 1048000 --long-kv-formats packed \
  --long-budget-s "$((LEFT - 60))" --weights fp8 --out "$OUT/long" > "$OUT/long.log" 2>&1
echo "long rc $? at $(($(date +%s) - T0)) s"; grep -A3 "^context" "$OUT/long.log" | cut -c1-220
tail -5 "$OUT/long.log" | cut -c1-300
