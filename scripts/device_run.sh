#!/usr/bin/env bash
# One call on the GPU machine: every GPU test, the golden checks through the runtime on
# CUDA, and (when present) the benchmarks; logs and JSON under $OUT, a short table last.
# Usage there: bash scripts/device_run.sh   (the golden files travel in .golden/, carried)
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export ATTNV41_GOLDEN_DIR="$PWD/.golden" ATTNV41_REPORT_DIR="$OUT/report"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
status=0
for g in tiny headdim; do
  for mode in forward split; do
    python3 -m attnv41 check --golden ".golden/v41_$g.safetensors" --impl runtime --device cuda --decode $mode \
      > "$OUT/check_${g}_$mode.txt" 2>&1 || status=1
    tail -1 "$OUT/check_${g}_$mode.txt"
  done
done
python3 -m pytest -q -p no:cacheprovider -rA ${PYTEST_ARGS:-tests} 2>&1 | tee "$OUT/pytest.txt" | tail -40
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "== summary"
grep -E "^(PASS|FAIL)" "$OUT"/check_*.txt
tail -1 "$OUT/pytest.txt"
exit $status
