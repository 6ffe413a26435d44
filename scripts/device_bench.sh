#!/usr/bin/env bash
# On the device machine (see /work/.library/device): install the carried FlashMLA wheel
# when `.whl/` holds one (never a dependency: a speed reference), run `attnv41 bench`,
# then optionally pytest. Everything lands under $OUT.
#   OUT=$OUT BENCH_ARGS="--parts peer" PYTEST_ARGS="tests/test_bench.py" bash scripts/device_bench.sh
set -o pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 ATTNV41_GOLDEN_DIR="$PWD/.golden" ATTNV41_REPORT_DIR="$OUT/report"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
rc=0
if [ "${BENCH_ARGS:-}" != "skip" ]; then
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-3000}" python3 -m attnv41 bench --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
  rc=$?
fi
if [ -n "${PYTEST_ARGS:-}" ]; then
  # shellcheck disable=SC2086
  python3 -m pytest -q -p no:cacheprovider -o addopts="-ra --import-mode=importlib" $PYTEST_ARGS 2>&1 | tee "$OUT/pytest.log"
  prc=$?
  [ $rc -eq 0 ] && rc=$prc
fi
echo "device_bench rc=$rc"
exit $rc
