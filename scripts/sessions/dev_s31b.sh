#!/usr/bin/env bash
# Thirty-first entry, call 3 (2026-12-05): where the batched step at B = 1 spends its time
# against the single-sequence step (FP8 weights, 32K, PDL off), and issue 15's comparison
# with bf16 weights (packed against bf16 caches, 32K, B = 1 / 64) on the machine that came.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
for args in "--weights fp8" "--weights fp8 --batch 1" "--weights fp8 --batch 1 --kv-format packed" \
            "--weights fp8 --batch 64" "--weights fp8 --batch 64 --kv-format packed"; do
  tag=$(echo "$args" | tr -d ' -')
  timeout -k 5 "${PROF_S:-75}" python3 scripts/step_profile.py --context 32768 --steps 3 $args > "$OUT/prof_$tag.log" 2>&1
  echo "profile $args rc $? at $(($(date +%s) - T0)) s"
done
timeout -k 5 "${AB_S:-120}" python3 scripts/ab_steps.py --batches 1,64 --context 32768 --kv bf16,packed \
  --weights bf16 --rounds 2 --variants "new" > "$OUT/ab_batch_bf16.log" 2>&1
echo "ab batch bf16 rc $? at $(($(date +%s) - T0)) s"
grep "^|" "$OUT"/ab_*.log
