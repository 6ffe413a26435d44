#!/usr/bin/env bash
# 2026-12-05 (twenty-fourth entry), call 2: `attnv41 bench --parts batch --weights fp8` (the
# batch part now runs every weight format asked) at B = 1, 64 over 4K and 32K with bf16 and
# packed caches; then three A/B rounds of the bf16 step (two levels against one level: the
# last entry's +0.07 ms at B = 1 was one round). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
timeout -k 5 "${BENCH_S:-200}" python3 -m attnv41 bench --parts batch --weights fp8 --batch-sizes 1,64 \
  --batch-contexts 4096,32768 --no-progress --out "$OUT/bench" > "$OUT/bench_fp8.log" 2>&1
echo "bench fp8 rc $? at $(($(date +%s) - T0)) s"
rm -f "$OUT/bench/decode_step.png"
timeout 150 python3 scripts/ab_steps.py --context 4096 --batches 1,64 --kv bf16 --weights bf16 --rounds 3 \
  --variants "new;one level" > "$OUT/ab_bf16.log" 2>&1
echo "ab bf16 rc $? at $(($(date +%s) - T0)) s"
sed -n '/^(f)/,$p' "$OUT/bench_fp8.log" | head -24
grep "^|" "$OUT/ab_bf16.log" || tail -5 "$OUT/ab_bf16.log"
