#!/usr/bin/env bash
# 2026-12-04 (eleventh entry), call 2: the logits kernel over sub-blocks of rows (`rsplit`).
# Its GPU tests (same bytes at the Flash shapes), the batch-1 probe's rsplit rows, then whole
# steps: DecodeGraphs at 4K and 32K, BatchGraphs B = 1 and 64 at 32K (ab_steps.py).
# carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 -m gpu tests/kernels/test_sparse_attn_split.py \
  tests/kernels/test_sparse_attn_packed.py tests/kernels/test_decode_invariance.py > "$OUT/pytest_kernels.log" 2>&1
echo "kernel tests rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/pytest_kernels.log" | cut -c1-300
timeout -k 5 45 python3 scripts/logits_split_probe.py --rounds 3 --only-new > "$OUT/logits_probe.md" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 130 python3 scripts/ab_steps.py --single 4096,32768 --kv bf16,packed --rounds 2 \
  --variants 'new;single rsplit=2;single rsplit=4' > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 220 python3 scripts/ab_steps.py --context 32768 --batches 1,64 --rounds 2 \
  --variants 'new;batch m=1 bh=64 rsplit=4;batch rsplit=2;batch combine warps=8;batch combine d=64' > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
cat "$OUT/logits_probe.md"
grep -E "^\|" "$OUT/ab_single.log" "$OUT/ab_batch.log" | cut -d: -f2- | cut -c1-120
