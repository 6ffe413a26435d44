#!/usr/bin/env bash
# Device calls for the Gluon FP8 product (`kernels/tc_fp8.py`, BENCHMARKS.md 2026-12-04
# twentieth entry), each within the 10-minute limit; the table last.
#   bash scripts/dev_tc_fp8.sh probe   # its GPU tests (tc_fp8, the renamed qdq and norm round trip, the
#                                      # tc_mm switch, the FP8 golden file through BatchV41 with it on), then the
#                                      # probe of every variant (subprocesses with a time limit)
#   bash scripts/dev_tc_fp8.sh step    # the batched FP8 step (bench (f), 4K, B = 1 and 64, bf16
#                                      # caches) with tc_mm.FP8_GLUON off, then on (TUNE, default {})
# carry: [".golden"] (the golden tests and bench's gate). OUT: logs, JSON, bench folders.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
case "${1:-probe}" in
  probe)
    timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -rfEs -m "gpu and not gpu_full" \
      tests/kernels/test_tc_fp8.py tests/kernels/test_qdq.py tests/kernels/test_tc_mm.py tests/kernels/test_norm.py \
      "tests/test_golden_batched.py::test_batched_fp8_golden_through_the_gluon_fp8_product" \
      > "$OUT/pytest_tc_fp8.log" 2>&1
    echo "tests rc $? in $(($(date +%s) - T0)) s: $(tail -1 "$OUT/pytest_tc_fp8.log")"
    # the warp-specialized forms (full tier until a run has passed: a wrong barrier phase hangs)
    timeout "${WS_TESTS_S:-90}" python3 -m pytest -q -p no:cacheprovider -rfEs -v -m gpu_full \
      tests/kernels/test_tc_fp8.py > "$OUT/pytest_tc_fp8_ws.log" 2>&1
    echo "ws tests rc $? in $(($(date +%s) - T0)) s: $(tail -1 "$OUT/pytest_tc_fp8_ws.log")"
    timeout "${PROBE_S:-360}" python3 scripts/tc_fp8_probe.py > "$OUT/probe.log" 2>&1
    echo "probe rc $? in $(($(date +%s) - T0)) s"
    grep -v "^check\|^time" "$OUT/probe.log" | tail -40
    ;;
  step)
    args=(--parts batch --weights fp8 --batch-sizes 1,64 --batch-contexts 4096 --batch-kv-formats bf16)
    timeout 270 python3 -m attnv41 bench "${args[@]}" --out "$OUT/bench_off" > "$OUT/bench_off.log" 2>&1
    echo "switch off rc $? in $(($(date +%s) - T0)) s"
    timeout 270 python3 scripts/with_knobs.py "attnv41.kernels.tc_mm.FP8_GLUON=${TUNE:-{\}}" -- \
      attnv41 bench "${args[@]}" --out "$OUT/bench_on" > "$OUT/bench_on.log" 2>&1
    echo "switch on rc $? in $(($(date +%s) - T0)) s"
    for f in off on; do echo "== $f"; grep -i "batchgraphs\|ms/step\|| *[0-9]" "$OUT/bench_$f.log" | tail -8; done
    ;;
  *) echo "part: probe or step (got $1)"; exit 2 ;;
esac
