#!/usr/bin/env bash
# For the next session's first device call (written 2026-12-03, sixth entry): the index
# scores' `skip=True` (a block of keys wholly past a token's visible rows stores −∞ without
# its dot), interpreter-tested and compiled for sm_90 offline only (126 registers paged bf16,
# no spills; the default shape's SASS byte-identical to before).
# 1. the indexer's GPU tests (skip keeps every score's bytes, paged and contiguous);
# 2. scripts/index_prefill_probe.py: production against skip on a chunk's tiles (1M bucket at
#    90 % and 55 % visible, a 32K chunk).
# If skip is faster and keeps the bits, make it the default (both _TUNE and _PAGED_TUNE) and
# run the quick tier; the whole 1M prompt then: LONG_BUDGET_S=540 BENCH_S=590 bash scripts/dev_long.sh
#   carry: [".golden"]; run: bash scripts/sessions/dev_skip.sh
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
el() { echo "$(($(date +%s) - T0)) s"; }
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -rfEs tests/kernels/test_indexer_paged.py \
  tests/kernels/test_indexer.py tests/kernels/test_indexer_packed.py > "$OUT/pytest_indexer.log" 2>&1
echo "pytest indexer rc $? at $(el)"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest_indexer.log" | tail -6
OUT="$OUT" timeout -k 5 150 python3 scripts/index_prefill_probe.py > "$OUT/index_prefill_probe.log" 2>&1
echo "probe rc $? at $(el)"
grep -E "^\|" "$OUT/index_prefill_probe.log"
