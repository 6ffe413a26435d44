#!/usr/bin/env bash
# 2026-12-03, call 3: the logits kernel's warps and stages on a batched step's own inputs
# (B = 64 and 1 at 32K, bf16 and packed rows; `batch_kernel_probe.py --attn-set logits`),
# then where the B = 64, 32K step goes with bf16 and packed caches (step_profile.py: one
# graph replay, PDL off). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
T0=$(date +%s)
for B in 64 1; do
  timeout -k 5 120 python3 scripts/batch_kernel_probe.py --context 32768 --batch $B --kv bf16,packed --attn-set logits \
    --no-index > "$OUT/logits_b$B.log" 2>&1
  echo "probe B=$B rc $? at $(($(date +%s) - T0)) s"
  [ -f "$OUT/batch_kernel_probe.json" ] && mv "$OUT/batch_kernel_probe.json" "$OUT/logits_b$B.json"
done
for kvf in packed bf16; do
  OUT=$OUT timeout -k 5 120 python3 scripts/step_profile.py --context 32768 --batch 64 --steps 3 --kv-format $kvf \
    > "$OUT/profile_b64_$kvf.log" 2>&1
  echo "profile $kvf rc $? at $(($(date +%s) - T0)) s"
done
for B in 64 1; do echo "### B=$B"; grep -E "^\| (bf16|packed) \|" "$OUT/logits_b$B.log"; done
for kvf in packed bf16; do echo "### profile $kvf"; grep -E "^\| " "$OUT/profile_b64_$kvf.log" | head -24 | cut -c1-150; done
