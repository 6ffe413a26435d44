#!/usr/bin/env bash
# Session 53, for the next session's first call (carry nothing, timeout ~300): issue 15's blocker
# on the current code (the B = 1 and 64, 32K FP8 steps over bf16 and packed caches, with the Gluon
# index kernel's afrag default and with the Triton index kernel), then the index tests edited
# after this session's last GPU run (`test_indexer_gluon.py`, `test_indexer_packed.py`).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$OUT/gpu.txt"
timeout -k 5 "${AB_S:-150}" python3 scripts/ab_steps.py --context 32768 --batches 1,64 --kv bf16,packed \
  --weights fp8 --rounds 3 --variants "new;index triton" > "$OUT/ab_kv_fp8.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_kv_fp8.log"
timeout -k 5 "${TEST_S:-120}" python3 -m pytest -q -p no:cacheprovider -rfE -n 8 \
  tests/kernels/test_indexer_gluon.py tests/kernels/test_indexer_packed.py tests/kernels/test_indexer_paged.py \
  > "$OUT/tests.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head
echo "done at $(($(date +%s) - T0)) s"
