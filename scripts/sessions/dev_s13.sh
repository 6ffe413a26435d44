#!/usr/bin/env bash
# 2026-12-04 (thirteenth entry), call 1: where the single-sequence decode step goes now
# (step_profile.py, DecodeGraphs at 32K, FP8 and bf16 weights, bf16 caches), and each
# decode kernel alone (bench --parts kernels, FP8 and bf16). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
for w in fp8 bf16; do
  OUT=$OUT timeout -k 5 150 python3 scripts/step_profile.py --context 32768 --weights $w --steps 3 \
    > "$OUT/profile_s1_$w.log" 2>&1
  echo "profile $w rc $? at $(($(date +%s) - T0)) s"
done
timeout -k 5 200 python3 -m attnv41 bench --parts kernels --weights both --contexts 32768 --out "$OUT/bench_k" \
  > "$OUT/bench_k.log" 2>&1
echo "bench kernels rc $? at $(($(date +%s) - T0)) s"
for w in fp8 bf16; do echo "== $w"; grep -E "^\| " "$OUT/profile_s1_$w.log" | head -40 | cut -c1-120; done
grep -E "^\| " "$OUT/bench_k/bench.md" | grep -i -E "decode|m=1|kernel" | head -60 | cut -c1-160
