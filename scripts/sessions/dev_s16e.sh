#!/usr/bin/env bash
# (The packed Gluon kernel these calls ran was removed after call 5; commit 5d1891c has it and its probes.)
# 2026-12-04 (sixteenth entry), call 5: the packed Gluon kernel with its logits replicated in
# both warpgroups (no exchange before the weighted sum): probe, GPU tests, BatchGraphs steps. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 100 python3 scripts/gluon_attn_probe.py --packed --batches 1,32,64 --tunes '[{}]' --ptunes '[{"nsplit": 2},
 {}, {"nsplit": 4}, {"nsplit": 2, "diag": 1}, {"nsplit": 2, "diag": 2}]' > "$OUT/probe.md" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep -v "^(sparse" "$OUT/probe.md" | grep -v "| 100 |" | cut -c1-150
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -rfEs -x -n 4 tests/kernels/test_sparse_attn_gluon.py \
  > "$OUT/gluon_tests.log" 2>&1
echo "gluon tests rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/gluon_tests.log" | cut -c1-300
grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gluon_tests.log" | head -12 | cut -c1-400
timeout -k 5 150 python3 scripts/ab_steps.py --context 32768 --batches 64 --kv packed --rounds 2 \
  --variants "new;gluon packed nsplit=2;gluon packed" > "$OUT/ab_steps.log" 2>&1
echo "ab_steps rc $? at $(($(date +%s) - T0)) s"; grep "^|" "$OUT/ab_steps.log"
