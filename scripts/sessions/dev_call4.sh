#!/usr/bin/env bash
# 2026-12-03, call 4: the final code (round_bf16 cvt, keys-major index scores, the batched
# logits kernel at 2 stages): the quick tier, then `attnv41 bench --parts index,batch,peer`
# (index scores + top-k to 1M; BatchGraphs B = 1 and 64 at 32K, bf16 and packed caches;
# sparse attention beside FlashMLA). carry: [".golden", ".whl"]
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
T0=$(date +%s)
TIER_S=${TIER_S:-260} bash scripts/dev_tier.sh
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout -k 5 "${BENCH_S:-150}" python3 -m attnv41 bench --parts index,batch,peer --contexts 4096,32768 \
  --batch-sizes 1,64 --batch-contexts 32768 --index-lengths 65536,1048576 --no-progress --out "$OUT/bench" \
  > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
rm -f "$OUT/bench/decode_step.png"
sed -n '/^(c)/,$p' "$OUT/bench.log" | head -50
