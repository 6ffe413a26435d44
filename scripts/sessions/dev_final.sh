#!/usr/bin/env bash
# One device call: the quick tier (device_run.sh), the attention combines side by side over
# batch sizes, the bench (decode, kernels, peer, index), the decode step's breakdown under
# the profiler (bf16 and fp8). Results under $OUT; a short table last.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
T0=$(date +%s)
[ "${DO_QUICK:-1}" = 1 ] && OUT="$OUT/quick" TIER=quick SKIP_SANITIZER=1 BUDGET_S=${QUICK_S:-420} bash scripts/device_run.sh > "$OUT/quick.log" 2>&1
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ "${DO_ATTN:-1}" = 1 ] && timeout 90 python3 scripts/attn_tune.py --set blocks --batches ${BATCHES:-1,2,4,8,16,64} --context 32768 > "$OUT/attn_tune.log" 2>&1
timeout 170 python3 -m attnv41 bench --parts ${PARTS:-decode,kernels,peer,index} --contexts 4096,32768,131072 --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
for wt in bf16 fp8; do timeout 60 python3 scripts/step_profile.py --weights $wt --context 32768 > "$OUT/profile_$wt.log" 2>&1; done
rm -f "$OUT/bench/decode_step.png"  # the device tool brings back at most 8 files
echo "== $(( $(date +%s) - T0 )) s"; cat "$OUT/quick/summary.txt" 2>/dev/null
grep -E "^\| [0-9]+ \| (bf16|fp8) \| graphs" "$OUT/bench.log"; grep -E "^\| [0-9]+ \| (1|64) \| " "$OUT/bench.log" | cut -c1-110
grep -E "^\| [0-9]+ \| (split production|split combine|FlashMLA|fused)" "$OUT/attn_tune.log" | cut -c1-120
grep -E "^\| (wq_a|wkv|wq_b|wo_b|indexer.wq_b|wo_a)( fp8)? \| decode" "$OUT/bench.log" | cut -c1-120
for wt in bf16 fp8; do grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/profile_$wt.log" | head -2; done
