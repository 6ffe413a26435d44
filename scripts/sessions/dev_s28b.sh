#!/usr/bin/env bash
# (Record: `gemv._AHEAD8` and `gemv._WORDS8`, which these variants set, were removed after
# dev_s28c.sh lost on an H100; commit acd56e1 has them. dev_s28a/b never ran.)
# 2026-12-05 (twenty-eighth entry), call 2 (after dev_s28a.sh): the FP8 GEMV with the weight's
# chunks loaded ahead made the default (`gemv._AHEAD8`, set by AHEAD, default 2) is checked
# and timed: the GEMV GPU tests and decode invariance; the FP8 golden file through the
# runtime on CUDA; `attnv41 bench --parts decode --weights both` at 4K and 32K (graphs,
# bf16 caches; the gate runs the tiny golden file first). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
sed -i "s/^_AHEAD8 = 0 /_AHEAD8 = ${AHEAD:-1} /; s/^_WORDS8 = False /_WORDS8 = ${WORDS:-True} /" src/attnv41/kernels/gemv.py
grep -n "^_AHEAD8\|^_WORDS8" src/attnv41/kernels/gemv.py
timeout -k 5 "${TEST_S:-200}" python3 -m pytest -q -p no:cacheprovider -rfEs -n 6 --dist loadfile -m "gpu" \
  tests/kernels/test_gemv.py tests/kernels/test_gemv_fp8.py tests/kernels/test_gemv_rope.py \
  tests/kernels/test_decode_invariance.py tests/runtime/test_fp8.py > "$OUT/pytest_gemv.log" 2>&1
echo "gemv tests rc $? at $(($(date +%s) - T0)) s"
tail -3 "$OUT/pytest_gemv.log"
timeout -k 5 120 python3 -m attnv41 check --golden .golden/v41_fp8.safetensors --device cuda > "$OUT/check_fp8.log" 2>&1
echo "check fp8 rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/check_fp8.log"
timeout -k 5 "${BENCH_S:-220}" python3 -m attnv41 bench --parts decode --weights both --contexts 4096,32768 \
  --no-progress --out "$OUT/bench" > "$OUT/bench_decode.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
rm -f "$OUT/bench/decode_step.png"
grep -E "^FAILED|^ERROR" "$OUT/pytest_gemv.log" | head -10
sed -n '/^(a)/,/^$/p' "$OUT/bench_decode.log" | head -20
