#!/usr/bin/env bash
# 2026-12-03, call 1: the index scores with the keys as the MMA's rows (`keys_m`) and the
# hardware bf16 rounding (`ATTNV41_ROUND_BF16=cvt`), timed on one batched step's own inputs
# (B = 64 at 32K, bf16 and packed keys; m = 1 over 1,048,000 keys), the attention under both
# roundings; the kernel tests on the GPU under cvt (every twin comparison's bytes); then the
# top-k's neg_inf_past probe planned by the seventh entry. carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
for mode in bits cvt; do
  ATTNV41_ROUND_BF16=$mode timeout -k 5 170 python3 scripts/batch_kernel_probe.py --context 32768 --batch 64 \
    --kv bf16,packed --single-keys 1048000 > "$OUT/probe_$mode.log" 2>&1
  echo "probe $mode rc $? at $(($(date +%s) - T0)) s"
  [ -f "$OUT/batch_kernel_probe.json" ] && mv "$OUT/batch_kernel_probe.json" "$OUT/probe_$mode.json"
done
ATTNV41_ROUND_BF16=cvt timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -rfE -n 8 --dist loadfile \
  -m "gpu and not gpu_full" tests/kernels > "$OUT/kernels_cvt.log" 2>&1
echo "kernel tests (cvt) rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/kernels_cvt.log"
OUT="$OUT" timeout -k 5 100 python3 scripts/index_prefill_probe.py > "$OUT/index_prefill_probe.log" 2>&1
echo "prefill probe rc $? at $(($(date +%s) - T0)) s"
for mode in bits cvt; do echo "### $mode"; grep -E "^\| (bf16|packed) \|" "$OUT/probe_$mode.log"; done
grep -E "^\|" "$OUT/index_prefill_probe.log"
