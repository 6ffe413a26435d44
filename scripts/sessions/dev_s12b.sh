#!/usr/bin/env bash
# 2026-12-04 (twelfth entry), call 2: the index scores' epilogue without the NaN select on
# its inner roundings (`inner_cvt`). The index GPU tests (bytes against the select form,
# with NaN and inf; packed == bf16), the kernels alone (batch_kernel_probe.py: m = 1 over
# 1M keys, and a B = 64 step's ratio-1 index call), then whole B = 64 steps at 32K
# (ab_steps.py) against the select form and with the packed cap of 80. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 120 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 -m gpu tests/kernels/test_indexer.py \
  tests/kernels/test_indexer_paged.py tests/kernels/test_indexer_packed.py tests/kernels/test_round.py \
  > "$OUT/pytest_index.log" 2>&1
echo "index tests rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/pytest_index.log" | cut -c1-300
OUT=$OUT timeout -k 5 120 python3 scripts/batch_kernel_probe.py --context 32768 --batch 64 --index-call 3 \
  --single-keys 1048000 --index-set inner --attn-set production > "$OUT/probe_index.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 200 python3 scripts/ab_steps.py --context 32768 --batches 64 --rounds 2 \
  --variants 'new;index nan-select;index packed cap 80' > "$OUT/ab_index.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
grep -E "^\|" "$OUT/probe_index.log" | grep -i "index\|config" | cut -c1-140
grep -E "^\|" "$OUT/ab_index.log" | cut -c1-120
