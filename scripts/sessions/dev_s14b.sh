#!/usr/bin/env bash
# 2026-12-04 (fourteenth entry), call 2: weights asked into L2 ahead of their GEMV
# (kernels/prefetch.py). l2_prefetch_probe.py (GEMV cold / hot / behind a spin with and
# without the prefetch), then bench (a) at 32K with DECODE_L2_PREFETCH variants
# (scripts/with_knobs.py). carry: none
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src"
T0=$(date +%s)
OUT=$OUT timeout -k 5 120 python3 scripts/l2_prefetch_probe.py > "$OUT/l2_probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; cat "$OUT/l2_probe.log" | cut -c1-160
A=attnv41.runtime.attn.DECODE_L2_PREFETCH
i=0
for v in "()" "('wo_a',)" "('wq_b','wo_a')" "('wq_b','wo_a','wo_b')"; do
  i=$((i+1)); w=fp8; [ $i -eq 1 ] || [ $i -eq 3 ] && w=both
  timeout -k 5 100 python3 scripts/with_knobs.py "$A=$v" -- attnv41 bench --parts decode --weights $w --contexts 32768 \
    --kv-formats bf16 --out "$OUT/bench_v$i" > "$OUT/bench_v$i.log" 2>&1
  echo "bench v$i $v rc $? at $(($(date +%s) - T0)) s"
  grep -E "^\| [0-9].*graphs" "$OUT/bench_v$i/bench.md" | cut -c1-100
done
