#!/usr/bin/env bash
# 2026-12-05 (twenty-fifth entry, written for the next session with a device): the
# capability refusal and `attnv41 env` on the H200, then the quick tier (this entry changed
# `require_triton`, `pdl_launch` and `fp4_words_mode`, which every kernel launch passes
# through), then bench (f) with FP8 weights at B = 1, 64 (dev_s24b.sh's first half).
# carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
python3 -m attnv41 env > "$OUT/env.txt" 2>&1; echo "env rc $?"
python3 -m attnv41 env --json > "$OUT/env.json" 2>&1
cat "$OUT/env.txt"
TIER_S=${TIER_S:-300} bash scripts/dev_tier.sh
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
timeout -k 5 "${BENCH_S:-200}" python3 -m attnv41 bench --parts batch --weights fp8 --batch-sizes 1,64 \
  --batch-contexts 4096,32768 --no-progress --out "$OUT/bench" > "$OUT/bench_fp8.log" 2>&1
echo "bench fp8 rc $? at $(($(date +%s) - T0)) s"
rm -f "$OUT/bench/decode_step.png"
grep -E "^FAILED|^ERROR" "$OUT/pytest_quick.log" | head -10
sed -n '/^(f)/,$p' "$OUT/bench_fp8.log" | head -24
