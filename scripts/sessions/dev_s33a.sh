#!/usr/bin/env bash
# For the next session with a device (written 2026-12-05, thirty-second entry, a session
# without one): the quick tier on the code that added the engine ops over packed pools
# (`attnv41.ops`: kv_rows, index_key_rows, index_queries, rms_norm, rope, candidate_mask,
# topk; the fused chains' slot-mapped writes) and their GPU tests (tests/test_ops.py: a
# layer over packed pools as a CUDA graph; tests/test_ops_engine.py: the example stack on
# CUDA), then the example itself on CUDA, then the batched m = 1 logits shapes of
# dev_s32c.sh plus bh 64 with rsplit 4 (each row dequantized once, 4 programs per block).
# About 360 s. carry: [".golden"]; give timeout_s ≥ 420.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
TIER_S="${TIER_S:-300}" bash scripts/dev_tier.sh
for kv in bf16 packed; do
  timeout -k 5 60 python3 examples/paged_engine.py --device cuda --kv-format "$kv" --steps 60 2>&1 | tail -2
done
echo "example done at $(($(date +%s) - T0)) s"
timeout -k 5 "${AB_S:-110}" python3 scripts/ab_steps.py --batches 1 --context 32768 --kv bf16,packed --weights fp8 \
  --rounds 2 --variants "new;batch m=1 rsplit=4;new, batch m=1 bh=64;batch m=1 bh=64 rsplit=4" > "$OUT/ab_batch1_packed.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
grep "^|" "$OUT/ab_batch1_packed.log"
