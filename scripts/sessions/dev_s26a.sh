#!/usr/bin/env bash
# 2026-12-05 (twenty-sixth entry, written for the next session with a device; run after
# dev_s25a.sh, whose quick tier now holds tests/runtime/test_gpu_tp.py): tensor parallelism
# at the Flash geometry, rank 0 of 8 (8 heads, one output group) against the whole model
# in the same run: the decode step (a) and the attention beside FlashMLA (c; the share's
# heads padded to 64 for it, as engines do). carry: [".golden", ".whl"]; install the peer
# wheel first (scripts/device_bench.sh does it the same way) and export PYTHONPATH=/tmp/site.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" ATTNV41_GOLDEN_DIR="$PWD/.golden"
for tp in 8 1; do
  timeout -k 5 "${BENCH_S:-240}" python3 -m attnv41 bench --parts decode,peer --weights bf16 --tp $tp \
    --contexts "${CONTEXTS:-4096,32768}" --kv-formats bf16 --batches 1,64 --no-progress --out "$OUT/bench_tp$tp" \
    > "$OUT/bench_tp$tp.log" 2>&1
  echo "bench tp $tp rc $? at $(($(date +%s) - T0)) s"
  rm -f "$OUT/bench_tp$tp/decode_step.png"
done
for tp in 8 1; do
  echo "== tp $tp"; sed -n '/^(a)/,/^$/p;/^(c)/,/^$/p' "$OUT/bench_tp$tp.log" | head -30
  grep -m1 "^peer:" "$OUT/bench_tp$tp.log"
done
