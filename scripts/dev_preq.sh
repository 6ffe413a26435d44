#!/usr/bin/env bash
# One device call for the FP8 GEMV's input round trip made by its producer (xq): the GEMV
# sweep (in-kernel quantization against xq, alone and after one fp8_qdq launch, launch
# knobs), the changed kernels' GPU tests, the FP8 golden checks through the runtime, the
# decode-step bench and the FP8 step under the profiler. Results under $OUT; table last.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
T0=$(date +%s)
[ "${DO_SWEEP:-1}" = 1 ] && KINDS=${KINDS:-xq,qdq+xq} BUDGET_S=${SWEEP_S:-100} OUT="$OUT" timeout 150 python3 scripts/fp8_gemv_tune.py > "$OUT/sweep.log" 2>&1
echo "sweep done $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
timeout ${TEST_S:-200} python3 -m pytest -q -m gpu -p no:cacheprovider ${TESTS:-tests/kernels/test_gemv_fp8.py tests/kernels/test_norm.py tests/kernels/test_fp8_linear.py tests/kernels/test_decode_invariance.py tests/runtime/test_fp8.py tests/runtime/test_graphs.py} > "$OUT/pytest.log" 2>&1
echo "pytest rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
for mode in forward split; do
  timeout 100 python3 -m attnv41 check --golden .golden/v41_fp8.safetensors --impl runtime --device cuda --decode $mode > "$OUT/check_fp8_$mode.log" 2>&1
  echo "check fp8 $mode rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
done
timeout ${BENCH_S:-150} python3 -m attnv41 bench --parts ${PARTS:-decode} --contexts ${CONTEXTS:-4096,32768,131072} --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
[ "${DO_PROFILE:-1}" = 1 ] && timeout 60 python3 scripts/step_profile.py --weights fp8 --context 32768 > "$OUT/profile_fp8.log" 2>&1
rm -rf "$OUT/bench/decode_step.png"
echo "== $(( $(date +%s) - T0 )) s"; cat "$OUT/times.txt"
grep -E "^(wq_|wo_|wkv|x->|indexer)" "$OUT/sweep.log" | cut -c1-110
tail -3 "$OUT/pytest.log"; for f in "$OUT"/check_fp8_*.log; do tail -1 "$f"; done
grep -E "^\| [0-9]+ \| (bf16|fp8) \| graphs" "$OUT/bench.log"
grep -E "^\| (_gemv_kernel|_qdq_kernel|_rms_norm_kernel|nvjet)" "$OUT/profile_fp8.log" | head; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/profile_fp8.log" | head -2
