#!/usr/bin/env bash
# 2026-12-03 (ninth entry): packed fp4 rows dequantized by PTX into bf16
# (packed_rows.fp4_rows_bf16) - the kernels' GPU tests, then their time against the fp32
# form: the batched attention and index scores on a B = 64, 32K step's own inputs, the
# single-sequence index scores over 1M keys, the attention at B = 1 (single shape).
# carry: nothing
set -u
export PYTHONUNBUFFERED=1
PYTHONPATH=src timeout -k 5 150 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_packed_rows.py \
  tests/kernels/test_sparse_attn_packed.py tests/kernels/test_indexer_packed.py tests/kernels/test_fused_packed.py \
  tests/kernels/test_decode_invariance.py tests/kernels/test_sparse_attn_split.py 2>&1 | tail -5
echo "pytest rc ${PIPESTATUS[0]}"
timeout -k 5 200 python3 scripts/batch_kernel_probe.py --attn-set asm --index-set asm --single-keys 1048000 2>&1 | grep -v "^{" | tail -45
echo "probe rc ${PIPESTATUS[0]}"
timeout -k 5 100 python3 scripts/attn_ncu.py --batch 1 --base single --rounds 3 --time '[{"fp4_asm": false}, {"bh": 16}, {"bh": 16, "fp4_asm": false}, {"bh": 32}]' 2>&1 | grep "^|"
echo "attn_ncu rc ${PIPESTATUS[0]}"
