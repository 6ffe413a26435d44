#!/usr/bin/env bash
# For the next session with a device (written 2026-12-05, thirty-first entry): the batched
# runtime's B = 1 step over packed caches loses 3 % against bf16 caches, nearly all of it in
# the m = 1 logits kernel over packed rows (H100 profile, PDL off: 8.19 against 3.94 µs per
# layer; `_BATCH_SMALL_TUNE`, four 16-head programs per 64-row block). Two launch shapes of
# that kernel with the same bytes, not yet timed in the batched B = 1 step: 16 rows per
# program (rsplit 4), and all 64 heads per program (bh 64, once lost on the H200 ninth entry:
# 5.31 against 5.26). About 90 s. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 "${AB_S:-150}" python3 scripts/ab_steps.py --batches 1 --context 32768 --kv bf16,packed --weights fp8 \
  --rounds 2 --variants "new;batch m=1 rsplit=4;new, batch m=1 bh=64" > "$OUT/ab_batch1_packed.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
grep "^|" "$OUT/ab_batch1_packed.log"
