#!/usr/bin/env bash
# 2026-12-05 (twenty-ninth entry): 1. does a tile-major FP8 weight speed the m = 1 decode GEMV
# on this GPU (scripts/gemv_shape_probe.py PARTS=tiled: wo_b, wq_b, a wo_a-sized weight through
# a copy of the lane loop, row-major against tile-major, same bits) and the twenty-eighth
# entry's shapes sweep on this card; 2. the quick tier on the committed code (d8eddbf's fork
# bookkeeping has not run on a GPU). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
PARTS=tiled,shapes BUDGET_S=150 timeout -k 5 190 python3 scripts/gemv_shape_probe.py > "$OUT/gemv_shape_probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
TIER_S="${TIER_S:-330}" bash scripts/dev_tier.sh
echo "done at $(($(date +%s) - T0)) s"
grep -E "^(tiled|shapes) |copy" "$OUT/gemv_shape_probe.log"
