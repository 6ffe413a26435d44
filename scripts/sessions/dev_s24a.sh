#!/usr/bin/env bash
# 2026-12-05 (twenty-fourth entry), call 1: the last entry's final code on a GPU. The quick
# tier, then `attnv41 bench --parts batch --weights both` at B = 1, 64 over 4K and 32K with
# bf16 and packed caches. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
TIER_S=${TIER_S:-300} bash scripts/dev_tier.sh
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
timeout -k 5 "${BENCH_S:-270}" python3 -m attnv41 bench --parts batch --weights both --batch-sizes 1,64 \
  --batch-contexts 4096,32768 --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
rm -f "$OUT/bench/decode_step.png"
grep -E "^FAILED|^ERROR" "$OUT/pytest_quick.log" | head -10
sed -n '/^(f)/,$p' "$OUT/bench.log" | head -40
