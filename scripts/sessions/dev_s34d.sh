#!/usr/bin/env bash
# Thirty-third entry, the last call (about 480 s of device time were left after refused
# starts): the new forms' GPU tests (every code and scale by the table-lookup PTX; the
# index scores with `lut` / `epi2` against the forms before, NaN, inf, −0 and ±2^-140 dots;
# the attention with `lut`), then whole B = 64 steps at 32K, FP8 weights, bf16 and packed
# caches. About 320 s. carry: [".golden"].
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 "${TEST_S:-120}" python3 -m pytest -q -p no:cacheprovider -rfE -n 8 \
  tests/kernels/test_packed_rows.py tests/kernels/test_indexer_paged.py tests/kernels/test_indexer_packed.py \
  tests/kernels/test_sparse_attn_packed.py > "$OUT/tests.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; grep -E "FAILED|ERROR|passed|failed" "$OUT/tests.log" | tail -12
timeout -k 5 "${AB_S:-200}" python3 scripts/ab_steps.py --batches 64 --context 32768 --kv bf16,packed \
  --weights fp8 --rounds "${ROUNDS:-2}" --variants "${VARIANTS:-new;index lut epi2;index lut epi2, attn lut}" > "$OUT/ab_b64.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"; grep -E "^[|]| ms$" "$OUT/ab_b64.log"
