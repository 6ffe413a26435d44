#!/usr/bin/env bash
# 2026-12-03 (tenth entry), call 4: the full tier's long tests alone (-m gpu_full), spread
# test by test over 8 workers (--dist load), verbose so a timeout still names what passed.
# carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 440 python3 -m pytest -v -p no:cacheprovider -n 8 --dist load -m gpu_full --junitxml "$OUT/pytest_full.xml" tests \
  > "$OUT/pytest_full.log" 2>&1
echo "full tier rc $? in $(($(date +%s) - T0)) s"
grep -E "PASSED|FAILED|ERROR" "$OUT/pytest_full.log" | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' | cut -c1-150
