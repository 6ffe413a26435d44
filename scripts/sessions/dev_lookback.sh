#!/usr/bin/env bash
# The look-back decode attention (`combine="lookback"`: the block-parallel combine with the
# logits in the same launch, its programs waiting on flags set by lower programs of the same
# launch) on the H200, one device call (2026-12-03, sixth entry). It gave production's bytes
# everywhere and replayed in a CUDA graph, but lost to the two-kernel split (22.3 against
# 16.3 µs at batch 1, bf16 rows) and was removed after this run (BENCHMARKS.md says what it
# was); the script stays as the record and no longer runs as is. Every step had a hard
# timeout: a wrong wait would hang, not fail.
# 1. its GPU tests: the same bytes as the loop at the Flash shapes, graph replay, packed rows;
# 2. `batch_kernel_probe.py --attn-set lookback` at B = 1 (32K, bf16 and packed), B = 8 and 64
#    (bf16): each shape timed and compared byte for byte with production.
#   carry: [".golden"]; run: bash scripts/sessions/dev_lookback.sh
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
el() { echo "$(($(date +%s) - T0)) s"; }
timeout -k 5 "${TEST_S:-150}" python3 -m pytest -q -p no:cacheprovider -rfEs tests/kernels/test_sparse_attn_split.py \
  tests/kernels/test_sparse_attn_packed.py -k "flash_shapes or lookback or equals_loop or packed_rows" \
  > "$OUT/pytest_lookback.log" 2>&1
echo "pytest rc $? at $(el)"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest_lookback.log" | tail -8
for spec in "1 bf16,packed" "8 bf16" "64 bf16"; do
  set -- $spec
  OUT="$OUT" timeout -k 5 "${PROBE_S:-120}" python3 scripts/batch_kernel_probe.py --context 32768 --batch "$1" \
    --kv "$2" --attn-set lookback --no-index > "$OUT/probe_lookback_b$1.log" 2>&1
  echo "probe B=$1 rc $? at $(el)"
  [ -f "$OUT/batch_kernel_probe.json" ] && mv "$OUT/batch_kernel_probe.json" "$OUT/probe_lookback_b$1.json"
  grep -E "^\|" "$OUT/probe_lookback_b$1.log" | tail -24
done
