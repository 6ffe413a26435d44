#!/usr/bin/env bash
# 2026-12-04 (twelfth entry), call 5 (final code: index scores with inner_cvt, the packed
# cap of 80 and scale words): the quick tier, whole B = 64, 32K steps against a paged packed
# index of 4 blocks per program (ab_steps.py), then `attnv41 bench --parts peer,batch` with
# the FlashMLA wheel. carry: [".golden", ".whl"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile --junitxml "$OUT/pytest.xml" \
  -m "gpu and not gpu_full" tests > "$OUT/pytest_quick.log" 2>&1
echo "quick tier rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/pytest_quick.log" | cut -c1-300
timeout -k 5 100 python3 scripts/ab_steps.py --context 32768 --batches 64 --rounds 2 \
  --variants 'new;index paged packed sub 4' > "$OUT/ab_sub.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 200 python3 -m attnv41 bench --parts peer,batch --batch-sizes 1,64 --batch-contexts 32768 \
  --contexts 4096,32768 --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
rm -f "$OUT/bench/decode_step.png"
grep -E "^\|" "$OUT/ab_sub.log" | cut -c1-120
grep -E "^\| 32768 \| (1|64) \| 1 \||sparse|FlashMLA|flash_mla|kv_bytes" "$OUT/bench/bench.md" | head -20
