#!/usr/bin/env bash
# For the next session with a device (written 2026-12-05, thirty-first entry): the full tier on
# wo_a's FP8 bytes by default (`d4e1451`; the quick tier passed on the H200, the full tier did
# not run on it): the parts outside runtime/test_gpu.py (`long`, about 150 s on an H100), then
# the 100-step Flash stack against the reference alone (219 s on an H100; with the short
# replays beside it on two workers it did not end in 400 s). About 400 s. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
LIMIT="${LONG_S:-200}" bash scripts/dev_full_tier.sh long
timeout -k 5 "${STACK_S:-280}" python3 -m pytest -v -p no:cacheprovider -rfEs -m gpu_full \
  "tests/runtime/test_gpu.py::test_flash_stack_runtime_vs_reference" > "$OUT/stack_alone.log" 2>&1
echo "stack alone rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/stack_alone.log" | cut -c1-200
