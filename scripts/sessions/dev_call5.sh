#!/usr/bin/env bash
# 2026-12-03, call 5: the logits kernel over packed rows running one dot per format present in
# a block (179 registers instead of 254; the bf16 kernel's SASS unchanged; reverted after this
# run: no faster, see BENCHMARKS.md eighth entry). The quick tier,
# the attention alone (batch_kernel_probe --attn-set logits --no-index, B = 64 and 1 at
# 32K, bf16 and packed rows), then `attnv41 bench --parts batch` (B = 1 and 64 at 32K, both
# cache formats). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
T0=$(date +%s)
TIER_S=${TIER_S:-240} bash scripts/dev_tier.sh
export PYTHONPATH="$PWD/src:$PWD/tests" PYTHONUNBUFFERED=1
for B in 64 1; do
  timeout -k 5 90 python3 scripts/batch_kernel_probe.py --context 32768 --batch $B --kv packed,bf16 --attn-set logits \
    --no-index > "$OUT/logits_b$B.log" 2>&1
  echo "probe B=$B rc $? at $(($(date +%s) - T0)) s"
  [ -f "$OUT/batch_kernel_probe.json" ] && mv "$OUT/batch_kernel_probe.json" "$OUT/logits_b$B.json"
done
timeout -k 5 "${BENCH_S:-100}" python3 -m attnv41 bench --parts batch --batch-sizes 1,64 --batch-contexts 32768 \
  --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
rm -f "$OUT/bench/decode_step.png"
for B in 64 1; do echo "### B=$B"; grep -E "^\| (bf16|packed) \| sparse_attn_batch \| (production|logits only|_TUNE) " "$OUT/logits_b$B.log"; done
sed -n '/^(f)/,$p' "$OUT/bench.log" | head -12
