#!/usr/bin/env bash
# 2026-12-03 (tenth entry), call 1: the logits as rows · qᵀ (`keys_m`) and the PTX
# dequantization with scales per 16-value block (no 16-bit shared stores) - the touched
# kernels' GPU tests, then whole-step A/B (ab_steps.py: BatchGraphs B = 1, 64 at 32K; the
# single-sequence DecodeGraphs at 4K), then the kernels alone (batch_kernel_probe.py).
# carry: nothing
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=src
T0=$(date +%s)
timeout -k 5 130 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_packed_rows.py \
  tests/kernels/test_sparse_attn_packed.py tests/kernels/test_indexer_packed.py tests/kernels/test_sparse_attn_split.py \
  tests/kernels/test_decode_invariance.py > "$OUT/pytest.log" 2>&1
echo "pytest rc $? at $(($(date +%s) - T0)) s"; tail -4 "$OUT/pytest.log" | cut -c1-300
timeout -k 5 200 python3 scripts/ab_steps.py --context 32768 --batches 1,64 --rounds 2 \
  --variants 'new;attn asm;attn keys_m;attn keys_m asm' > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 110 python3 scripts/batch_kernel_probe.py --attn-set keysm --index-set asm --single-keys 1048000 > "$OUT/probe_b64.log" 2>&1
echo "probe b64 rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 80 python3 scripts/ab_steps.py --single 4096 --kv bf16,packed --rounds 2 \
  --variants 'new;single asm;single keys_m;single keys_m asm' > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 45 python3 scripts/batch_kernel_probe.py --batch 1 --attn-set keysm --no-index > "$OUT/probe_b1.log" 2>&1
echo "probe b1 rc $? at $(($(date +%s) - T0)) s"
grep -E "^\|" "$OUT/ab_batch.log" "$OUT/ab_single.log" | cut -d: -f2- | cut -c1-120
grep -E "^\|" "$OUT/probe_b64.log" "$OUT/probe_b1.log" | grep -v -- "---" | cut -d: -f2- | cut -c1-140
