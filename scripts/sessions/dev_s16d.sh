#!/usr/bin/env bash
# (The packed Gluon kernel these calls ran was removed after call 5; commit 5d1891c has it and its probes.)
# 2026-12-04 (sixteenth entry), call 4: the packed Gluon kernel in 16 warps, TMA row copies
# (aligned), timing variants; its GPU tests; Nsight Compute stall reasons. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 150 python3 scripts/gluon_attn_probe.py --packed --batches 1,64 --tunes '[]' --ptunes '[{"nsplit": 2},
 {"warps": 16, "nsplit": 2}, {"warps": 16}, {"warps": 16, "nsplit": 4}, {"warps": 16, "nsplit": 2, "diag": 1},
 {"warps": 16, "nsplit": 2, "diag": 2}, {"nsplit": 2, "diag": 1}, {"nsplit": 2, "diag": 2},
 {"nsplit": 2, "tma": true}, {"warps": 16, "nsplit": 2, "tma": true}, {"warps": 16, "nsplit": 2, "tma": true, "diag": 1}]' > "$OUT/probe.md" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep -v "^(sparse" "$OUT/probe.md" | grep -v "| 100 |" | cut -c1-150
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -rfEs -x -n 4 tests/kernels/test_sparse_attn_gluon.py \
  > "$OUT/gluon_tests.log" 2>&1
echo "gluon tests rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/gluon_tests.log" | cut -c1-300
grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gluon_tests.log" | head -12 | cut -c1-400
M=""; for r in barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle membar \
  dispatch_stall no_instruction sleeping selected not_selected drain branch_resolving tex_throttle misc; do
  M="$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"; done
for tune in '{"nsplit": 2}' '{"warps": 16, "nsplit": 2}'; do
  timeout -k 5 100 ncu --clock-control none --kernel-name regex:_attn_gl_packed --launch-count 1 --metrics "${M:1}" \
    --section SchedulerStats python3 scripts/gluon_packed_ncu.py "$tune" > "$OUT/ncu_$(echo $tune | tr -dc 'a-z0-9').txt" 2>&1
  echo "ncu $tune rc $? at $(($(date +%s) - T0)) s"
  grep -E "stalled|Issued Warp|Eligible Warps" "$OUT/ncu_$(echo $tune | tr -dc 'a-z0-9').txt" | sed 's/smsp__average_warps_issue_stalled_//' | awk '{print $1, $NF}'
done
