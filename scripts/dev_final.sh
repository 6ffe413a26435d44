#!/usr/bin/env bash
# One device call: the quick tier (device_run.sh), the bench (decode, kernels, peer, index),
# kernel counts, the FP8 GEMV sweep; a short table last. Results under $OUT.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
T0=$(date +%s)
[ "${DO_QUICK:-1}" = 1 ] && OUT="$OUT/quick" TIER=quick SKIP_SANITIZER=1 BUDGET_S=${QUICK_S:-300} bash scripts/device_run.sh > "$OUT/quick.log" 2>&1
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout 150 python3 -m attnv41 bench --parts ${PARTS:-decode,kernels,peer,index} --contexts 4096,32768,131072 --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
for wt in bf16 fp8; do timeout 60 python3 scripts/kernel_count.py --weights $wt --label now > "$OUT/kc_$wt.log" 2>&1; done
[ "${DO_TUNE8:-1}" = 1 ] && BUDGET_S=40 timeout 90 python3 scripts/fp8_gemv_tune.py > "$OUT/fp8_gemv_tune.log" 2>&1
echo "== $(( $(date +%s) - T0 )) s"; cat "$OUT/quick/summary.txt" 2>/dev/null
grep -E "^\| [0-9]+ \| (bf16|fp8) \| graphs" "$OUT/bench.log"; grep -E "^\| [0-9]+ \| (1|64) \| " "$OUT/bench.log" | cut -c1-110
grep -E "^\| all" "$OUT"/kc_*.log; grep -E "m= 1 (blocks|lanes) (prod|one|sep)" "$OUT/fp8_gemv_tune.log" | cut -c1-110
grep -E "^\| (wq_a|wkv|wq_b|wo_b|indexer.wq_b|wo_a)( fp8)? \| decode" "$OUT/bench.log" | cut -c1-120
