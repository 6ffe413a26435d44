#!/usr/bin/env bash
# The index scores' prefill regime on the H200 (2026-12-03, sixth entry), one device call
# (the record: the regime lost and was removed after it, BENCHMARKS.md; its probe now times
# `skip=True` instead, scripts/sessions/dev_skip.sh):
# 1. the indexer's GPU tests (the prefill regime's bytes equal the decode regime's, Flash
#    shapes included);
# 2. scripts/index_prefill_probe.py: the kernel alone on a 1M-context tile and a 32K chunk;
# 3. `bench --parts long` on a 131,072-token prompt (bf16), against the same prefix of the
#    1M run before the change (131,072 tokens in 37.3 s);
# 4. the quick GPU tier (the runtimes now launch the prefill regime for prompt chunks).
#   carry: [".golden"]; run: bash scripts/sessions/dev_prefill_index.sh
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
el() { echo "$(($(date +%s) - T0)) s"; }
timeout -k 5 120 python3 -m pytest -q -p no:cacheprovider -rfEs tests/kernels/test_indexer_paged.py \
  tests/kernels/test_indexer.py tests/kernels/test_indexer_packed.py > "$OUT/pytest_indexer.log" 2>&1
echo "pytest indexer rc $? at $(el)"
grep -E "^FAILED|^ERROR|passed|failed" "$OUT/pytest_indexer.log" | tail -6
OUT="$OUT" timeout -k 5 75 python3 scripts/index_prefill_probe.py > "$OUT/index_prefill_probe.log" 2>&1
echo "probe rc $? at $(el)"
grep -E "^\|" "$OUT/index_prefill_probe.log"
timeout -k 5 100 python3 -m attnv41 bench --parts long --weights bf16 --contexts 4096 --prefill 2048 \
  --long-context 131072 --long-budget-s 50 --no-progress --out "$OUT/bench_long" > "$OUT/bench_long.log" 2>&1
echo "bench long rc $? at $(el)"
grep -E "^long" "$OUT/bench_long.log" | tail -8
L=$((470 - ($(date +%s) - T0)))
echo "tier budget $L s"
timeout "$L" python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile --junitxml "$OUT/pytest.xml" \
  -m "gpu and not gpu_full" tests > "$OUT/pytest_quick.log" 2>&1
echo "quick tier rc $? at $(el)"
grep -E "^FAILED|^ERROR" "$OUT/pytest_quick.log" | head -20
tail -2 "$OUT/pytest_quick.log"
