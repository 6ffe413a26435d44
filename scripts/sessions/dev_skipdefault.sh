#!/usr/bin/env bash
# 2026-12-03 (seventh entry), call 2: the index scores' skip=True made the default shape
# (both _TUNE and _PAGED_TUNE) after call 1 (scripts/sessions/dev_skip.sh) showed it faster with the
# same bytes. 1. the quick tier; 2. part batch at 32K (bf16): the chunked 32K prompt (g)
# against the fifth entry's 2,563 ms, and the decode steps at B = 1 and 64 (8.45 ms before).
#   carry: [".golden"]; run: bash scripts/sessions/dev_skipdefault.sh
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile --junitxml "$OUT/pytest.xml" \
  -m "gpu and not gpu_full" tests > "$OUT/pytest_quick.log" 2>&1
echo "quick tier rc $? in $(($(date +%s) - T0)) s"
tail -4 "$OUT/pytest_quick.log"
timeout -k 5 200 python3 -m attnv41 bench --parts batch --weights bf16 --batch-sizes 1,64 --batch-contexts 32768 \
  --batch-kv-formats bf16 --no-progress --out "$OUT/bench_batch" > "$OUT/bench_batch.log" 2>&1
echo "bench batch rc $? at $(($(date +%s) - T0)) s"
sed -n '/^(f)/,$p' "$OUT/bench_batch.log" | head -40
