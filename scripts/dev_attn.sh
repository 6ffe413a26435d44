#!/usr/bin/env bash
# One device call for the block-parallel decode attention combine (issue 13): its tile
# sweep beside the sequential loop and FlashMLA, the kernel and runtime tests it touches on
# CUDA, the FP8 golden checks through the runtime. Results under $OUT; a short table last.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
left() { echo $(( ${BUDGET_S:-400} - ($(date +%s) - T0) )); }
run() { local name=$1 lim=$2; shift 2; local l; l=$(left); (( lim > l - 10 )) && lim=$((l - 10));
  if (( lim < 15 )); then echo "$name SKIP (time)" | tee -a "$OUT/summary.txt"; return; fi
  local t=$(date +%s); timeout -k 5 "$lim" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t ))s" | tee -a "$OUT/summary.txt"; }
run attn_tune 150 python3 scripts/attn_tune.py --set blocks --context 32768
run pytest 150 python3 -m pytest -q -x tests/kernels/test_sparse_attn_split.py tests/kernels/test_decode_invariance.py tests/runtime/test_graphs.py tests/kernels/test_gemv_fp8.py tests/runtime/test_contract_gpu.py
for mode in forward split; do
  run check_fp8_$mode 90 python3 -m attnv41 check --golden .golden/v41_fp8.safetensors --impl runtime --device cuda --decode $mode
done
echo "== summary"; cat "$OUT/summary.txt"
echo "== attn"; grep -E "^\| (1|64) \|" "$OUT/attn_tune.log" | cut -c1-150
echo "== pytest"; tail -4 "$OUT/pytest.log"; for m in forward split; do tail -3 "$OUT/check_fp8_$m.log"; done
