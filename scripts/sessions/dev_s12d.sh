#!/usr/bin/env bash
# 2026-12-04 (twelfth entry), call 4: packed rows' scale words (WORDS = 3). The GPU tests of
# the loaders, the index scores, the packed attention (its scale-word variants) and the
# decode invariance; the index kernels alone (batch_kernel_probe.py, `--index-set inner`);
# then whole B = 64, 32K steps (ab_steps.py) against the scale tile and with the
# attention's scale words. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 -m gpu tests/kernels/test_packed_rows.py \
  tests/kernels/test_indexer.py tests/kernels/test_indexer_paged.py tests/kernels/test_indexer_packed.py \
  tests/kernels/test_sparse_attn_packed.py tests/kernels/test_decode_invariance.py > "$OUT/pytest_words.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/pytest_words.log" | cut -c1-300
OUT=$OUT timeout -k 5 120 python3 scripts/batch_kernel_probe.py --context 32768 --batch 64 --index-call 3 \
  --single-keys 1048000 --index-set inner --attn-set production --kv packed > "$OUT/probe_index.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 230 python3 scripts/ab_steps.py --context 32768 --batches 64 --rounds 2 \
  --variants 'new;index scale tile;attn scale word' > "$OUT/ab_words.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
grep -E "^\|" "$OUT/probe_index.log" | grep -i "index\|config" | cut -c1-140
grep -E "^\|" "$OUT/ab_words.log" | cut -c1-120
