#!/usr/bin/env bash
# One device call for the Gluon FP8 product (`kernels/tc_fp8.py`, BENCHMARKS.md 2026-12-04
# twentieth entry): its GPU tests, then the probe of every variant (each in a subprocess
# with a time limit) against tc_mm, the table last. No carry needed.
#   bash scripts/dev_tc_fp8.sh            # OUT: pytest_tc_fp8.log, probe.log, tc_fp8_probe.json
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
T0=$(date +%s)
timeout "${TESTS_S:-200}" python3 -m pytest -q -p no:cacheprovider -rfEs -m gpu \
  tests/kernels/test_tc_fp8.py tests/kernels/test_qdq.py > "$OUT/pytest_tc_fp8.log" 2>&1
echo "tests rc $? in $(($(date +%s) - T0)) s: $(tail -1 "$OUT/pytest_tc_fp8.log")"
timeout "${PROBE_S:-360}" python3 scripts/tc_fp8_probe.py > "$OUT/probe.log" 2>&1
echo "probe rc $? in $(($(date +%s) - T0)) s"
grep -v "^check\|^time" "$OUT/probe.log" | tail -40
