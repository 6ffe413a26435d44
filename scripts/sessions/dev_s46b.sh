#!/usr/bin/env bash
# Session 46, not run in sessions 46 to 48 (no device time left, or no machine started;
# the next session's first call; carry [".golden"], timeout 480): the full tier's parts
# that fit one call on the code of the thirty-seventh to forty-second entries (prompt
# tokens, the top-k's launch shape, the second stream by default, per-shape GEMV splits, hw
# in the index-query chain; the full tier last ran on the thirty-second / thirty-sixth
# entries' code): the `long` part (gpu_full outside runtime/test_gpu.py), a 1,000-step
# replay segment of each index-key mode, then where the production single-sequence FP8 step
# goes (32K, PDL off for per-kernel times).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
LIMIT="${LONG_S:-200}" bash scripts/dev_full_tier.sh long
REPLAY_STEPS="${REPLAY_STEPS:-1000}" LIMIT="${REPLAY_S:-130}" bash scripts/dev_full_tier.sh replays
echo "tiers at $(($(date +%s) - T0)) s"
if [ "${PROF_S:-100}" -gt 0 ]; then  # PROF_S=0 skips the profile on a short budget
  timeout -k 5 "${PROF_S:-100}" python3 scripts/step_profile.py --context 32768 --weights fp8 --steps 3 \
    > "$OUT/prof_pdl0.log" 2>&1
  echo "prof rc $? at $(($(date +%s) - T0)) s"
  grep "^|" "$OUT/prof_pdl0.log" | head -30
fi
echo "done at $(($(date +%s) - T0)) s"
