#!/usr/bin/env bash
# One device call for the decode GEMV launch knobs (issue 13): the knob tests on CUDA,
# the knob sweep (scripts/gemv_knobs.py) and the decode step's real breakdown under the
# profiler (scripts/step_profile.py), bf16 and fp8. Results under $OUT; a short table last.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
left() { echo $(( ${BUDGET_S:-540} - ($(date +%s) - T0) )); }
run() { local name=$1 lim=$2; shift 2; local l; l=$(left); (( lim > l - 10 )) && lim=$((l - 10));
  if (( lim < 15 )); then echo "$name SKIP (time)" | tee -a "$OUT/summary.txt"; return; fi
  local t=$(date +%s); timeout -k 5 "$lim" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t ))s" | tee -a "$OUT/summary.txt"; }
run pytest_knobs 120 python3 -m pytest -q -x tests/kernels/test_gemv.py tests/kernels/test_gemv_fp8.py
for wt in bf16 fp8; do run profile_$wt 90 python3 scripts/step_profile.py --weights $wt --context 32768; done
BUDGET_S=${KNOBS_S:-200} run gemv_knobs 280 python3 scripts/gemv_knobs.py
echo "== summary"; cat "$OUT/summary.txt"
echo "== pytest"; tail -3 "$OUT/pytest_knobs.log"
for wt in bf16 fp8; do echo "== profile $wt"; grep -E "^\| [0-9]+ \|" "$OUT/profile_$wt.log" | head -3; grep -E "^\| " "$OUT/profile_$wt.log" | sed -n '/kernel | per step/,$p' | head -16 | cut -c1-120; done
echo "== knobs"; sed -n '/== summary/,$p' "$OUT/gemv_knobs.log" | cut -c1-110
