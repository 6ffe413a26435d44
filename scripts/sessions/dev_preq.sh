#!/usr/bin/env bash
# One device call for the FP8 GEMV's input round trip made by its producer (xq): the GEMV
# sweep (in-kernel quantization against xq, alone and after one fp8_qdq launch, launch
# knobs), the changed kernels' GPU tests, the FP8 golden checks through the runtime, the
# decode-step bench and the FP8 step under the profiler. Results under $OUT; table last.
set -u
FINAL="${OUT:-/tmp/out}"; export OUT=/tmp/res; mkdir -p "$OUT" "$FINAL"  # everything in one tarball at the end (the tool returns <= 8 files)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
[ "${DO_SWEEP:-1}" = 1 ] && KINDS=${KINDS:-xq,qdq+xq} BUDGET_S=${SWEEP_S:-100} OUT="$OUT" timeout 150 python3 scripts/fp8_gemv_tune.py > "$OUT/sweep.log" 2>&1
echo "sweep done $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
timeout ${TEST_S:-200} python3 -m pytest -q -m "${MARK:-gpu}" -p no:cacheprovider ${TESTS:-tests/kernels/test_gemv_fp8.py tests/kernels/test_norm.py tests/kernels/test_fp8_linear.py tests/kernels/test_decode_invariance.py tests/runtime/test_fp8.py tests/runtime/test_graphs.py} > "$OUT/pytest.log" 2>&1
echo "pytest rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
for g in ${GOLDENS:-fp8}; do for mode in forward split; do
  timeout 100 python3 -m attnv41 check --golden .golden/v41_$g.safetensors --impl runtime --device cuda --decode $mode > "$OUT/check_${g}_$mode.log" 2>&1
  echo "check $g $mode rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
done; done
timeout ${BENCH_S:-150} python3 -m attnv41 bench --parts ${PARTS:-decode} --contexts ${CONTEXTS:-4096,32768,131072} --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
[ "${DO_PROFILE:-1}" = 1 ] && for wt in ${PROFILE_WEIGHTS:-fp8}; do timeout 60 python3 scripts/step_profile.py --weights $wt --context 32768 > "$OUT/profile_$wt.log" 2>&1; done
rm -rf "$OUT/bench/decode_step.png"
echo "== $(( $(date +%s) - T0 )) s"; cat "$OUT/times.txt"
grep -E "^(wq_|wo_|wkv|x->|indexer)" "$OUT/sweep.log" | cut -c1-110
tail -3 "$OUT/pytest.log"; for f in "$OUT"/check_*.log; do tail -1 "$f"; done
grep -E "^\| [0-9]+ \| (bf16|fp8) \| graphs" "$OUT/bench.log"
grep -E "^\| [0-9]+ \| (1|64) \| " "$OUT/bench.log" | cut -c1-110
for f in "$OUT"/profile_*.log; do grep -E "^\| (_gemv_kernel|_rope_kernel|_rms_norm_kernel|_logits_kernel|_pv_blocks_kernel|nvjet)" "$f" | head; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$f" | head -2; done
tar czf "$FINAL/results.tgz" -C "$OUT" . && cp "$OUT"/bench.log "$OUT"/pytest.log "$FINAL"/ 2>/dev/null
