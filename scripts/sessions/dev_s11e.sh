#!/usr/bin/env bash
# 2026-12-04 (eleventh entry), call 7: register caps (ptxas .maxnreg) over packed rows in the
# batched attention. The packed kernels' GPU tests (packed == bf16 bytes, the capped shape
# among them), then whole B = 64 steps at 32K (ab_steps.py). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 70 python3 scripts/ab_steps.py --context 32768 --batches 64 --kv packed --rounds 2 \
  --variants 'new;batch packed logits cap 96;batch packed logits 96 combine 8 warps 128' \
  > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 50 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 -m gpu tests/kernels/test_sparse_attn_packed.py -k 'batch' \
  > "$OUT/pytest_packed.log" 2>&1
echo "packed tests rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/pytest_packed.log" | cut -c1-300
grep -E "^\||ms$" "$OUT/ab_batch.log" | cut -c1-120
