#!/usr/bin/env bash
# 2026-12-04 (fifteenth entry), call 5: the quick tier after the one-block fix, then
# scripts/gluon_attn_probe.py (Triton BATCH_TUNE against Gluon over batch sizes). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 300 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile --junitxml "$OUT/pytest.xml" \
  -m "gpu and not gpu_full" tests > "$OUT/pytest_quick.log" 2>&1
echo "quick tier rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/pytest_quick.log" | cut -c1-300
grep -E "^(FAILED|ERROR)" "$OUT/pytest_quick.log" | head -20 | cut -c1-400
timeout -k 5 150 python3 scripts/gluon_attn_probe.py --batches 1,8,16,24,32,64,128 > "$OUT/probe.md" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep -v "^(sparse" "$OUT/probe.md" | grep "| 0 |\|rror"; grep -c "bytes: True" "$OUT/probe.md"
