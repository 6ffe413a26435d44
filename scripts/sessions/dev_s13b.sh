#!/usr/bin/env bash
# 2026-12-04 (thirteenth entry), call 4: wo_a kept as the checkpoint's FP8 bytes. The quick
# tier; the wo_a kernels alone (wo_a_fp8_probe.py: cuBLAS bf16, group_gemv bf16 / fp8,
# tc_group_mm bf16 / fp8 at m = 1 and 64); the FP8 single-sequence step under the profiler;
# bench decode (FP8 and bf16 weights) and batch (FP8 weights, B = 1 and 64). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 230 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile --junitxml "$OUT/pytest.xml" \
  -m "gpu and not gpu_full" tests > "$OUT/pytest_quick.log" 2>&1
echo "quick tier rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/pytest_quick.log" | cut -c1-300
grep -E "^(FAILED|ERROR)" "$OUT/pytest_quick.log" | head -20 | cut -c1-300
timeout -k 5 60 python3 scripts/wo_a_fp8_probe.py > "$OUT/wo_a_probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; cat "$OUT/wo_a_probe.log" | tail -12
OUT=$OUT timeout -k 5 60 python3 scripts/step_profile.py --context 32768 --weights fp8 --steps 3 > "$OUT/profile_s1_fp8.log" 2>&1
echo "profile rc $? at $(($(date +%s) - T0)) s"; grep -E "^\| " "$OUT/profile_s1_fp8.log" | head -12 | cut -c1-110
timeout -k 5 150 python3 -m attnv41 bench --parts decode --weights both --contexts 4096,32768 --kv-formats bf16 \
  --out "$OUT/bench_d" > "$OUT/bench_d.log" 2>&1
echo "bench decode rc $? at $(($(date +%s) - T0)) s"
grep -E "^\| " "$OUT/bench_d/bench.md" | head -12 | cut -c1-160
timeout -k 5 120 python3 -m attnv41 bench --parts batch --weights fp8 --batch-sizes 1,64 --batch-contexts 32768 \
  --batch-kv-formats bf16 --out "$OUT/bench_b" > "$OUT/bench_b.log" 2>&1
echo "bench batch rc $? at $(($(date +%s) - T0)) s"
grep -E "^\| " "$OUT/bench_b/bench.md" | head -12 | cut -c1-160
