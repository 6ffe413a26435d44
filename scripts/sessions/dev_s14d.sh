#!/usr/bin/env bash
# 2026-12-04 (fourteenth entry), call 4 (run at commit ddbf6f0; the option was then removed):
# the decode GEMV's first weight chunk loaded before
# its PDL wait (`gemv._EARLY_WEIGHTS`), with early_rows in production. The GEMV GPU tests with
# it on (with_knobs.py), then bench (a) at 4K / 32K, both weight kinds, off / on twice.
# carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
K=attnv41.kernels.gemv._EARLY_WEIGHTS
timeout -k 5 120 python3 scripts/with_knobs.py $K=True -- pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile \
  -m "gpu and not gpu_full" tests/kernels/test_gemv.py tests/kernels/test_gemv_fp8.py tests/kernels/test_gemv_rope.py \
  tests/kernels/test_decode_invariance.py > "$OUT/pytest_gemv_early.log" 2>&1
echo "gemv tests (early weights) rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/pytest_gemv_early.log" | cut -c1-300
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gemv_early.log" | head -10 | cut -c1-300
for r in 1 2; do for v in False True; do
  timeout -k 5 80 python3 scripts/with_knobs.py $K=$v -- attnv41 bench --parts decode --weights both \
    --contexts 4096,32768 --kv-formats bf16 --no-progress --out "$OUT/bench_${v}_$r" > "$OUT/bench_${v}_$r.log" 2>&1
  echo "bench early_weights=$v round $r rc $? at $(($(date +%s) - T0)) s"; rm -f "$OUT/bench_${v}_$r/decode_step.png"
  grep -E "^\| [0-9]+ \| (bf16|fp8) \| bf16 \| graphs" "$OUT/bench_${v}_$r/bench.md" | cut -c1-60
done; done
