#!/usr/bin/env bash
# Device call (twenty-third entry, second): more FP8 split rules in whole BatchGraphs steps,
# then bench (f) + (g) (the chunked prefill) with FP8 weights under the default rule and KP.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
T0=$(date +%s)
timeout 150 python3 scripts/ab_steps.py --context 4096 --batches 1,8,64 --kv bf16 --weights fp8 --rounds 2 \
  --variants "new;tc fp8 396/5;tc fp8 640/8;tc fp8 1024/5;tc fp8 1024/4;tc fp8 320/5" > "$OUT/split_fp8b.log" 2>&1
echo "fp8 rc $? in $(($(date +%s) - T0)) s"
args=(--parts batch --weights fp8 --batch-sizes 1,64 --batch-contexts 4096 --batch-kv-formats bf16)
timeout 150 python3 -m attnv41 bench "${args[@]}" --out "$OUT/b_def" > "$OUT/bench_def.log" 2>&1
echo "bench default rc $? in $(($(date +%s) - T0)) s"
# (call 3 ran this with the one-level rule of its commit, `_KIND_PLAN={2: (396, 5)}`; the same
# plans at every m are now the fine split with fine programs at every m)
timeout 150 python3 scripts/with_knobs.py "attnv41.kernels.tc_mm._FINE_PLAN=${KP:-{'fp8': (396, 5)\}}" \
  "attnv41.kernels.tc_mm._FINE_MAX_M={'fp8': 1073741824}" -- \
  attnv41 bench "${args[@]}" --out "$OUT/b_kp" > "$OUT/bench_kp.log" 2>&1
echo "bench KP rc $? in $(($(date +%s) - T0)) s"
grep "^|" "$OUT/split_fp8b.log" || tail -5 "$OUT/split_fp8b.log"
for f in def kp; do echo "== $f"; grep -E "^(4096|with_knobs)" "$OUT/bench_$f.log" || tail -5 "$OUT/bench_$f.log"; done
