#!/usr/bin/env bash
# 2026-12-03 (tenth entry), call 2: the quick tier with fp4_asm on in the attention, then
# whole-step A/B of the packed rows' column chunk (BatchGraphs B = 64 at 32K), then `bench
# --parts batch,decode,peer` (FlashMLA beside our attention when its wheel is carried).
# carry: [".golden", ".whl"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
T0=$(date +%s)
TIER_S=${TIER_S:-250} bash scripts/dev_tier.sh
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout -k 5 90 python3 scripts/ab_steps.py --context 32768 --batches 64 --kv packed --rounds 2 \
  --variants 'new;attn fp32 dequant;batch packed dk=64;batch packed dk=64 keys_m' > "$OUT/ab_batch.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 "${BENCH_S:-230}" python3 -m attnv41 bench --parts peer,batch,decode --contexts 4096,32768 \
  --batch-sizes 1,64 --batch-contexts 32768 --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
rm -f "$OUT/bench/decode_step.png"
grep -E "^\|" "$OUT/ab_batch.log" | cut -c1-120
grep -E "^\| " "$OUT/bench.log" | grep -E "graphs|BatchGraphs|FlashMLA|split|sparse|\| (1|64) \|" | cut -c1-170 | head -40
