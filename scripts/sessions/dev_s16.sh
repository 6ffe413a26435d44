#!/usr/bin/env bash
# (The packed Gluon kernel these calls ran was removed after call 5; commit 5d1891c has it and its probes.)
# 2026-12-04 (sixteenth entry), call 1: the Gluon attention over packed rows: its GPU tests,
# the probe against the Triton kernels (bytes, time) at B = 1, 32, 64 (and mixed blocks),
# then whole BatchGraphs steps over packed caches with it on / off. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -rfEs -x tests/kernels/test_sparse_attn_gluon.py \
  > "$OUT/gluon_tests.log" 2>&1
echo "gluon tests rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/gluon_tests.log" | cut -c1-300
grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gluon_tests.log" | head -12 | cut -c1-400
timeout -k 5 120 python3 scripts/gluon_attn_probe.py --packed --batches 1,32,64 > "$OUT/probe.md" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; cat "$OUT/probe.md" | cut -c1-200
timeout -k 5 60 python3 scripts/gluon_attn_probe.py --packed --batches 64 --window 100 > "$OUT/probe_mixed.md" 2>&1
echo "probe mixed rc $? at $(($(date +%s) - T0)) s"; grep packed "$OUT/probe_mixed.md" | cut -c1-200
timeout -k 5 200 python3 scripts/ab_steps.py --context 32768 --batches 64 --kv packed,bf16 --rounds 2 \
  --variants "new;gluon packed" > "$OUT/ab_steps.log" 2>&1
echo "ab_steps rc $? at $(($(date +%s) - T0)) s"; grep "^|" "$OUT/ab_steps.log"
