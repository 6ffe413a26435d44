#!/usr/bin/env bash
# Thirty-first entry, call 4 (2026-12-05): the FP8 steps' profiles as bench builds them (wo_a
# from its FP8 bytes: step_profile.py left wo_a bf16 before, so its FP8 single-sequence
# profiles ran cuBLAS's bf16 wo_a), and wo_a's storage (bf16 / fp8) in the single-sequence and
# batched FP8 steps: which `load_model` default serves users. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
for args in "--weights fp8" "--weights fp8 --batch 1"; do
  tag=$(echo "$args" | tr -d ' -')
  timeout -k 5 "${PROF_S:-75}" python3 scripts/step_profile.py --context 32768 --steps 3 $args > "$OUT/prof_$tag.log" 2>&1
  echo "profile $args rc $? at $(($(date +%s) - T0)) s"
done
for woa in bf16 fp8; do
  timeout -k 5 90 python3 scripts/ab_steps.py --batches 1,64 --context 32768 --kv bf16 --weights fp8 --wo-a $woa \
    --rounds 2 --variants "new" > "$OUT/ab_batch_woa_$woa.log" 2>&1
  echo "ab batch wo_a $woa rc $? at $(($(date +%s) - T0)) s"
  timeout -k 5 60 python3 scripts/ab_steps.py --single 4096 --kv bf16 --weights fp8 --wo-a $woa \
    --rounds 2 --variants "new" > "$OUT/ab_single_woa_$woa.log" 2>&1
  echo "ab single wo_a $woa rc $? at $(($(date +%s) - T0)) s"
done
grep -h -B3 "^| new" "$OUT"/ab_*.log | grep -v "^|---"
