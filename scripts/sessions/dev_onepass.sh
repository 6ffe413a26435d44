#!/usr/bin/env bash
# The one-pass decode attention (`combine="onepass"`) on the H200, one device call
# (2026-12-03, fifth entry). The kernel lost to the two-kernel split at every shape and was
# removed after this run (BENCHMARKS.md says what it was); the script stays as the record:
# 1. its GPU tests (the same bytes as the loop combine at the Flash shapes, each head tile);
# 2. `batch_kernel_probe.py --attn-set onepass` on one batched step's own inputs: B = 64 at
#    32K (bf16 and packed rows) and B = 1 (bf16), each launch shape timed and compared
#    byte for byte with production.
# Results under $OUT; a short table last.   carry: [".golden"]; run: bash scripts/sessions/dev_onepass.sh
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
el() { echo "$(($(date +%s) - T0)) s"; }
timeout "${TEST_S:-150}" python3 -m pytest -q -p no:cacheprovider -rfEs tests/kernels/test_sparse_attn_split.py \
  -k "flash_shapes or equals_loop or rope_epilogue or fused_only" > "$OUT/pytest_onepass.log" 2>&1
echo "pytest rc $? at $(el)"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest_onepass.log" | tail -6
for spec in "64 bf16,packed" "1 bf16"; do
  set -- $spec
  OUT="$OUT" timeout "${PROBE_S:-200}" python3 scripts/batch_kernel_probe.py --context 32768 --batch "$1" --kv "$2" \
    --attn-set onepass --no-index > "$OUT/probe_onepass_b$1.log" 2>&1
  echo "probe B=$1 rc $? at $(el)"
  [ -f "$OUT/batch_kernel_probe.json" ] && mv "$OUT/batch_kernel_probe.json" "$OUT/probe_onepass_b$1.json"
  grep -E "^\|" "$OUT/probe_onepass_b$1.log" | tail -32
done
