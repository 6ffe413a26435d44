#!/usr/bin/env bash
# 2026-12-03, call 2: round_bf16's hardware form and the keys-major index scores as the
# production shapes. The quick tier, then `attnv41 bench --parts index,batch,decode,peer`
# (index scores + top-k up to 1M; BatchGraphs at B = 1 and 64, 32K, bf16 and packed
# caches; DecodeGraphs at 4K and 32K, bf16 and FP8 weights; sparse attention beside
# FlashMLA when its wheel is carried). carry: [".golden"] (and ".whl" for the peer)
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
T0=$(date +%s)
TIER_S=${TIER_S:-300} bash scripts/dev_tier.sh
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout -k 5 "${BENCH_S:-270}" python3 -m attnv41 bench --parts index,batch,decode,peer --contexts 4096,32768 \
  --batch-sizes 1,64 --batch-contexts 32768 --index-lengths 65536,1048576 --no-progress --out "$OUT/bench" \
  > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
rm -f "$OUT/bench/decode_step.png"
grep -E "^\| " "$OUT/bench.log" | grep -E "scores \+ top-k|index scores \(ours\)|top-k select \(ours|graphs|BatchGraphs|FlashMLA|split|\| (1|64) \|" | cut -c1-160 | head -40
