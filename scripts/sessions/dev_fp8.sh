#!/usr/bin/env bash
# One device call for the FP8 decode GEMV work: the sweeps first, then GPU tests of the
# changed kernels, the FP8 golden checks through the runtime, the decode-step bench.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - T0) )); }
run() { local name=$1 lim=$2; shift 2; local l; l=$(left); (( lim > l - 10 )) && lim=$((l - 10));
  if (( lim < 15 )); then echo "$name SKIP (time)" | tee -a "$OUT/summary.txt"; return; fi
  local t=$(date +%s); timeout -k 5 "$lim" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t ))s" | tee -a "$OUT/summary.txt"; }
[ -n "${DO_TUNE8:-1}" ] && [ "${DO_TUNE8:-1}" = 1 ] && BUDGET_S=${TUNE8_S:-120} run fp8_gemv_tune 200 python3 scripts/fp8_gemv_tune.py
[ "${DO_ATTN:-1}" = 1 ] && run attn_tune ${ATTN_S:-120} python3 scripts/attn_tune.py --context 32768
run pytest 200 python3 -m pytest -q -x ${PYTEST_ARGS:-tests/kernels/test_gemv_fp8.py tests/kernels/test_fp8_linear.py tests/kernels/test_gemv.py tests/kernels/test_decode_invariance.py tests/runtime/test_fp8.py tests/test_golden_fp8.py}
for mode in forward split; do
  run check_fp8_$mode 90 python3 -m attnv41 check --golden .golden/v41_fp8.safetensors --impl runtime --device cuda --decode $mode
done
[ "${DO_BENCH:-1}" = 1 ] && run bench 150 python3 -m attnv41 bench --parts decode --contexts ${CONTEXTS:-4096} --no-progress --out "$OUT/bench"
echo "== summary"; cat "$OUT/summary.txt"
for f in fp8_gemv_tune attn_tune; do echo "== $f (tail)"; tail -${TAILN:-45} "$OUT/$f.log" 2>/dev/null | cut -c1-150; done
echo "== pytest"; tail -4 "$OUT/pytest.log"; for m in forward split; do tail -2 "$OUT/check_fp8_$m.log"; done
echo "== bench"; grep -E "^\| [0-9]+ \| (bf16|fp8) \| graphs" "$OUT/bench.log" 2>/dev/null | head
