#!/usr/bin/env bash
# Thirty-fourth entry, an H200 call (if one is lent): the table-lookup forms where they were
# built for. On the H200 the packed B = 64 step loses in the dequantizing kernels (thirty-
# second entry: logits +168, combine +83 µs per step against bf16 rows), which the H100's
# slower memory hides; `lut` cuts the attention's fp4 instructions (logits 155 → 126 per
# chunk, combine 148 → 138) and `epi2` the index epilogue's. The kernels alone on a B = 64
# step's inputs, then whole B = 64 steps at 32K (FP8 weights) over bf16 and packed caches.
# About 160 s. carry: [".golden"]; timeout_s ≥ 240. Ran 2026-12-06 on an H100 only (thirty-
# fourth entry: no gain there); not yet on an H200.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 "${PROBE_S:-80}" python3 scripts/batch_kernel_probe.py --index-set lut --attn-set lut \
  --index-call 3 > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep "^|" "$OUT/probe.log" | head -40
timeout -k 5 "${AB_S:-150}" python3 scripts/ab_steps.py --batches 64 --context 32768 --kv bf16,packed \
  --weights fp8 --rounds "${ROUNDS:-3}" \
  --variants "${VARIANTS:-new;index epi2;attn lut;index epi2, attn lut;index lut epi2, attn lut}" > "$OUT/ab_b64.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"; grep -E "^[|]" "$OUT/ab_b64.log"
