#!/usr/bin/env bash
# 2026-12-03 (ninth entry; run twice: the second after ab_steps.py): the quick tier after the launch-shape change (dk by row format,
# head blocks of 16 at batch 1, fp4 PTX dequant in the index scores), then the batched
# bench at 32K (B = 1, 64; bf16 and packed caches; FlashMLA as the peer when carried) and
# the single-sequence decode bench at 4K / 32K. carry: [".golden", ".whl"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
T0=$(date +%s)
TIER_S=300 bash scripts/dev_tier.sh
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout 150 python3 -m attnv41 bench --parts batch --batch-sizes 1,64 --batch-contexts 32768 --no-progress --out "$OUT/batch" > "$OUT/batch.log" 2>&1
echo "batch rc $?"
timeout 100 python3 -m attnv41 bench --parts decode --contexts 4096,32768 --no-progress --out "$OUT/decode" > "$OUT/decode.log" 2>&1
echo "decode rc $?"
rm -f "$OUT"/*/*.png
echo "== $(( $(date +%s) - T0 )) s"
grep -E "^\|" "$OUT/batch.log" | head -30 | cut -c1-160
grep -E "^\| [0-9]+ \| (bf16|fp8) \| graphs" "$OUT/decode.log"
