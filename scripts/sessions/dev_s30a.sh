#!/usr/bin/env bash
# For the next session with a device (written 2026-12-05, twenty-ninth entry): can the m = 1
# FP8 GEMV run one chunk per program (the [163840, 256] shape's 19.0 µs against wo_b's 25.2
# on the H100) once its partials are added by a launch of their own instead of the arrival
# counter? 1. scripts/gemv_shape_probe.py PARTS=split2 (wo_b at 4 / 8 / 32 segments, wq_b at
# 5, a wo_a-sized weight at 8 / 16 / 32; counter against partials + `_sum_parts`, each row bit
# for bit against gemv_torch), (the shapes sweep, with no H200 figures yet, waits for a later call);
# 2. the split forms' tests (tests/kernels/test_gemv_split_forms.py, CUDA: Flash wo_b / wo_a,
# eager and replayed, `gemv._SPLIT_FORM` "release" and "launch" against the counter);
# 3. the single-sequence FP8 step (ab_steps.py --single 4096, bf16 caches, 2 rounds):
# production, the release form at the production plans (same bits), the attention's block combine
# with the release form (`counter_release`, same bits), FP8 weights at 16384 target programs
# (one chunk per program; other bits) under the two new forms.
# carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
PARTS=split2 timeout -k 5 150 python3 scripts/gemv_shape_probe.py > "$OUT/gemv_shape_probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 120 python3 -m pytest -q -p no:cacheprovider -rfEs -n 4 --dist load -m gpu \
  tests/kernels/test_gemv_split_forms.py tests/kernels/test_gemv_fp8.py \
  tests/kernels/test_sparse_attn_split.py -k "not test_flash or split_forms" > "$OUT/pytest_sum.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/pytest_sum.log"
timeout -k 5 "${AB_S:-260}" python3 scripts/ab_steps.py --single 4096 --weights fp8 --kv bf16 --rounds 2 \
  --variants "new;gemv release;single release;gemv fp8 16384 release;gemv fp8 16384 sum" > "$OUT/ab_fp8_sum.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
grep -E "^FAILED|^ERROR" "$OUT"/pytest_*.log | head -8
grep -E "^(split2|shapes) |copy|FAILED" "$OUT/gemv_shape_probe.log"
grep "^|" "$OUT/ab_fp8_sum.log" || tail -5 "$OUT/ab_fp8_sum.log"
