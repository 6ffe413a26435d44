#!/usr/bin/env bash
# 2026-12-04 (twelfth entry), call 8 (leftover device time): bench (a), the single-sequence
# decode step through DecodeGraphs at 4K and 32K, bf16 and FP8 weights, bf16 and packed
# caches, on the final code (the FP8 step was last timed in the tenth entry). carry: []
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src"
T0=$(date +%s)
for w in fp8 bf16; do
  timeout -k 5 120 python3 -m attnv41 bench --parts decode --weights $w --contexts 4096,32768 \
    --kv-formats bf16,packed --no-progress --out "$OUT/bench_$w" > "$OUT/bench_$w.log" 2>&1
  echo "bench $w rc $? at $(($(date +%s) - T0)) s"
  rm -f "$OUT/bench_$w/decode_step.png"
  grep -E "^\| (4096|32768) " "$OUT/bench_$w/bench.md" | head -8 | cut -c1-160
done
