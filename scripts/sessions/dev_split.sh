#!/usr/bin/env bash
# Device call (BENCHMARKS.md 2026-12-05, twenty-third entry): finer split-K in the batched
# projections (`tc_mm.plan` target / segment floor) inside whole BatchGraphs steps at 4K,
# B = 1, 8, 64, FP8 then bf16 weights; the tables last. carry: nothing needed.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
T0=$(date +%s)
V8="${V8:-new;tc 264/4;tc 528/4;tc 528/2;tc 1056/4}"
V16="${V16:-new;tc 528/4;tc 528/2}"
timeout "${FP8_S:-300}" python3 scripts/ab_steps.py --context 4096 --batches 1,8,64 --kv bf16 --weights fp8 \
  --rounds 2 --variants "$V8" > "$OUT/split_fp8.log" 2>&1
echo "fp8 rc $? in $(($(date +%s) - T0)) s"
timeout "${BF16_S:-200}" python3 scripts/ab_steps.py --context 4096 --batches 1,8,64 --kv bf16 --weights bf16 \
  --rounds 1 --variants "$V16" > "$OUT/split_bf16.log" 2>&1
echo "bf16 rc $? in $(($(date +%s) - T0)) s"
for f in fp8 bf16; do echo "== $f"; grep "^|" "$OUT/split_$f.log" || tail -5 "$OUT/split_$f.log"; done
