#!/usr/bin/env bash
# 2026-12-04 (twelfth entry), call 3: the quick tier with the index scores' new production
# shape (inner_cvt, packed cap 80), then whole B = 64, 32K steps (ab_steps.py) against the
# uncapped packed index and a paged packed index of 4 blocks per program. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 220 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile --junitxml "$OUT/pytest.xml" \
  -m "gpu and not gpu_full" tests > "$OUT/pytest_quick.log" 2>&1
echo "quick tier rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/pytest_quick.log" | cut -c1-300
timeout -k 5 230 python3 scripts/ab_steps.py --context 32768 --batches 64 --rounds 2 \
  --variants 'new;index packed uncapped;index paged packed sub 4' > "$OUT/ab_index.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
grep -E "^\|" "$OUT/ab_index.log" | cut -c1-120
