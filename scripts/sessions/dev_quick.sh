#!/usr/bin/env bash
# One device call (2026-12-03, fifth entry): the quick GPU tier as re-tiered (device_run.sh:
# CLI golden checks, then pytest -m "gpu and not gpu_full" over 8 xdist workers; no
# memcheck), then the batch-1 attention's logits tiles on one batched step's own inputs
# (`batch_kernel_probe.py --batch 1 --attn-set single`, 32K).
#   carry: [".golden"]; run: bash scripts/sessions/dev_quick.sh
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
OUT="$OUT/quick" SKIP_SANITIZER=1 BUDGET_S="${QUICK_BUDGET_S:-420}" bash scripts/device_run.sh > "$OUT/quick_run.log" 2>&1
echo "device_run rc $? at $(($(date +%s) - T0)) s"
PYTHONPATH="$PWD/src:$PWD/tests" OUT="$OUT" timeout 150 python3 scripts/batch_kernel_probe.py --context 32768 --batch 1 \
  --kv bf16 --attn-set single --no-index > "$OUT/probe_single_b1.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
rm -rf "$OUT/quick/report"
grep -E "^\|" "$OUT/probe_single_b1.log"
tail -12 "$OUT/quick_run.log"
