#!/usr/bin/env bash
# FP8 weights' splits that did not add up (carry [".golden"], timeout 240): over one chunk per
# program, wo_b at 8 segments alone and with wq_b, wo_a or the x launch split too, the
# segment cap of 5 chunks, single-sequence FP8 step at 4K / 32K, 3 rounds, one card.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 200 python3 scripts/ab_steps.py --single 4096,32768 --weights fp8 --kv bf16 --rounds 3 \
  --variants "fp8 one chunk;oc wo_b 8;oc wq_b 1;oc wo_b 8 wq_b 1;oc wo_b 8 wo_a 4;oc wo_b 8 x 5;new" > "$OUT/ab_pairs.log" 2>&1
echo "ab pairs rc $? at $(($(date +%s) - T0)) s"
grep -h "^| " "$OUT/ab_pairs.log"
