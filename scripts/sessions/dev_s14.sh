#!/usr/bin/env bash
# 2026-12-04 (fourteenth entry), call 1: the decode GEMV's chunk loads pipelined through
# shared memory. gemv_pipe_probe.py (every weight alone, launch knobs, production bytes
# checked), then bench (a) at 32K, both weight kinds, production knobs against the
# pipelined ones (scripts/with_knobs.py). carry: none
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src"
T0=$(date +%s)
OUT=$OUT BUDGET_S=${PROBE_S:-270} timeout -k 5 330 python3 scripts/gemv_pipe_probe.py > "$OUT/pipe_probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
G=attnv41.kernels.gemv
for knobs in "" "$G._LOOP_STAGES8=3 $G._X1=True" "$G._LOOP_STAGES8=3 $G._X1=True $G._LOOP_STAGES=3"; do
  tag=$(echo "$knobs" | tr -c 'A-Za-z0-9=\n' '_' | sed 's/attnv41_kernels_gemv__//g'); tag=${tag:-prod}
  timeout -k 5 110 python3 scripts/with_knobs.py $knobs -- attnv41 bench --parts decode --weights both --contexts 32768 \
    --kv-formats bf16 --out "$OUT/bench_$tag" > "$OUT/bench_$tag.log" 2>&1
  echo "bench [$tag] rc $? at $(($(date +%s) - T0)) s"
  grep -E "^\| " "$OUT/bench_$tag/bench.md" | head -6 | cut -c1-150
done
echo "== probe"; grep -v "^with_knobs" "$OUT/pipe_probe.log" | cut -c1-120
