#!/usr/bin/env bash
# For the next session with a device (written 2026-12-05, twenty-ninth entry): does the m = 1
# FP8 GEMV at one chunk per program reach the no-split shape's time when its partials are
# summed by a second kernel instead of an arrival counter (scripts/gemv_shape_probe.py
# PARTS=split2: wo_b at 4 / 8 / 32 segments, wq_b at 5, a wo_a-sized weight at 8 / 16 / 32,
# counter against partials + `_sum_parts`, each row bit for bit against gemv_torch under its
# plan); then the shapes and progs sweeps on this card (H200 figures of them do not exist
# yet). If the two-kernel form at 32 segments comes near [163840, 256]'s time, a per-dtype
# plan with the partials' own kernel is the next step for wo_b and wo_a. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
PARTS=split2,shapes,progs BUDGET_S=240 timeout -k 5 300 python3 scripts/gemv_shape_probe.py > "$OUT/gemv_shape_probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
grep -E "^(split2|shapes|progs) |copy|FAILED" "$OUT/gemv_shape_probe.log"
