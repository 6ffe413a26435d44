#!/usr/bin/env bash
# Thirty-third entry, call 1 (H200 wanted; an H100 also answers): packed fp4 rows by the
# table-lookup PTX (`packed_rows`, WORDS = 4; `lut` in the index and attention tunes) and
# the index epilogue in bf16 pairs (`epi2`). Their GPU tests (the same bytes as the forms
# before), the index kernel alone on a B = 64 step's own ratio-1 call and at m = 1 over 1M
# keys, then whole B = 64 steps at 32K. About 420 s. carry: [".golden"]; timeout_s ≥ 480.
# (Not run in its session: no machine started until 300 s of device time were left;
# `dev_s34d.sh` ran instead, on an H100. For an H200 session: the same questions there,
# and `prefetch` (the index loop's next block loaded ahead), built after the H100 call.)
# Ran 2026-12-06 (thirty-fourth entry, H100): prefetch slower, removed afterwards, so its
# A/B variant and probe rows no longer exist (ab_steps.py rejects the variant name).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 "${TEST_S:-150}" python3 -m pytest -q -p no:cacheprovider -rfE -n 4 \
  tests/kernels/test_packed_rows.py tests/kernels/test_indexer_paged.py tests/kernels/test_indexer_packed.py \
  tests/kernels/test_sparse_attn_packed.py > "$OUT/tests.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -4 "$OUT/tests.log"
timeout -k 5 "${PROBE_S:-110}" python3 scripts/batch_kernel_probe.py --index-set lut --attn-set production \
  --index-call 3 --single-keys 1048000 > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep "^|" "$OUT/probe.log" | head -40
timeout -k 5 "${AB_S:-240}" python3 scripts/ab_steps.py --batches 64 --context 32768 --kv bf16,packed \
  --weights fp8 --rounds 2 --variants "new;index lut epi2;index lut epi2 prefetch;attn lut" > "$OUT/ab_b64.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"; grep "^|" "$OUT/ab_b64.log"
