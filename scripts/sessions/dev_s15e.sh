#!/usr/bin/env bash
# 2026-12-04 (fifteenth entry), call 11 (final code: the Gluon attention opt-in): the quick
# tier, then `attnv41 bench --parts peer` (4K / 32K, B = 1 and 64) with the FlashMLA wheel,
# which times the Gluon kernel beside the Triton kernels and FlashMLA. carry: [".golden", ".whl"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 260 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile --junitxml "$OUT/pytest.xml" \
  -m "gpu and not gpu_full" tests > "$OUT/pytest_quick.log" 2>&1
echo "quick tier rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/pytest_quick.log" | cut -c1-300
grep -E "^(FAILED|ERROR)" "$OUT/pytest_quick.log" | head -20 | cut -c1-300
timeout -k 5 200 python3 -m attnv41 bench --parts peer --contexts 4096,32768 --no-progress --out "$OUT/bench" \
  > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"; rm -f "$OUT/bench/decode_step.png"
grep -E "decode \(split|batched runtime|Gluon|FlashMLA|copy|matmul" "$OUT/bench/bench.md" | cut -c1-170 | head -20
