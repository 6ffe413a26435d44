#!/usr/bin/env bash
# (Record: `gemv._AHEAD8` and `gemv._WORDS8`, which it sets, were removed after this call
# lost on an H100; commit acd56e1 has them. Calls 2-4 of the entry were typed commands:
# BENCHMARKS.md, twenty-eighth entry.)
# 2026-12-05 (twenty-eighth entry): two planned calls merged into one
# (device time went on refused starts). 1. the FP8 GEMV's chunks ahead, bytes and words
# (scripts/gemv_shape_probe.py, wo_b and wq_b) and a streaming read of the same bytes;
# 2. the single-sequence FP8 step with each form (ab_steps.py --single 4096, bf16 caches);
# 3. the GEMV GPU tests (they run every form), then with the word form and one chunk ahead
# made the default: decode invariance and the FP8 golden file through the runtime on CUDA.
# carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
PARTS=stream,ahead timeout -k 5 130 python3 scripts/gemv_shape_probe.py > "$OUT/gemv_shape_probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 "${AB_S:-170}" python3 scripts/ab_steps.py --single 4096 --weights fp8 --kv bf16 --rounds 2 \
  --variants "new;gemv words ahead 1;gemv words ahead 2" > "$OUT/ab_fp8_gemv.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 100 python3 -m pytest -q -p no:cacheprovider -rfEs -n 6 --dist load -m gpu \
  tests/kernels/test_gemv.py tests/kernels/test_gemv_fp8.py > "$OUT/pytest_gemv.log" 2>&1
echo "gemv tests rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/pytest_gemv.log"
sed -i "s/^_AHEAD8 = 0 /_AHEAD8 = ${AHEAD:-1} /; s/^_WORDS8 = False /_WORDS8 = True /" src/attnv41/kernels/gemv.py
grep -n "^_AHEAD8\|^_WORDS8" src/attnv41/kernels/gemv.py
timeout -k 5 90 python3 -m pytest -q -p no:cacheprovider -rfEs -n 6 --dist load -m gpu \
  tests/kernels/test_decode_invariance.py tests/kernels/test_gemv_rope.py > "$OUT/pytest_inv_words.log" 2>&1
echo "invariance (words) rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/pytest_inv_words.log"
timeout -k 5 90 python3 -m attnv41 check --golden .golden/v41_fp8.safetensors --device cuda > "$OUT/check_fp8_words.log" 2>&1
echo "check fp8 (words) rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/check_fp8_words.log"
grep -E "^FAILED|^ERROR" "$OUT"/pytest_*.log | head -8
grep -E "^(stream|ahead) " "$OUT/gemv_shape_probe.log"
grep "^|" "$OUT/ab_fp8_gemv.log" || tail -5 "$OUT/ab_fp8_gemv.log"
