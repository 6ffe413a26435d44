#!/usr/bin/env bash
# The quick GPU tier alone, timed on a fresh machine (2026-12-03, fifth entry): pytest -m
# "gpu and not gpu_full" over 8 xdist workers (loadfile), every case (the runtime golden
# cases included: no CLI checks first). carry: [".golden"]; run: bash scripts/dev_tier.sh
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout "${TIER_S:-330}" python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile --junitxml "$OUT/pytest.xml" \
  -m "gpu and not gpu_full" tests > "$OUT/pytest_quick.log" 2>&1
echo "quick tier rc $? in $(($(date +%s) - T0)) s"
tail -4 "$OUT/pytest_quick.log"
