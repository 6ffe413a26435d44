#!/usr/bin/env bash
# For the next session (written 2026-12-03, seventh entry, not yet run): where a long
# prompt's 2,048-token chunk spends its time. With the index scores skipping keys past a
# token's visible rows, a 1M-bucket chunk still costs about 535 ms at no visible rows
# (extrapolated) against 153 ms in the 16K bucket: the top-k over the bucket's width and the
# candidate mask are the suspects. scripts/step_profile.py --chunk profiles one graph-
# replayed chunk per step (PDL off): a 16,384 context (the 32K bucket), 786,432 (1M bucket,
# 75 % visible), bf16 and packed caches. Then scripts/index_prefill_probe.py, which now also
# times the top-k over a chunk tile's scores with `neg_inf_past=True` (tiles wholly past a
# token's visible rows counted without a read; interpreter-tested, compiled offline: the
# default top-k's sm_90 SASS byte-identical, the option 64-86 registers, no local memory).
# If it is faster with the same selections, pass neg_inf_past=True where the runtime's
# selections take the index scores (runtime/attn.py, runtime/batch.py) and run the quick tier.
#   carry: [".golden"]; run: bash scripts/sessions/dev_chunk_profile.sh
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" OUT
T0=$(date +%s)
for spec in 16384:bf16 786432:bf16 786432:packed; do
  ctx=${spec%%:*}; kvf=${spec##*:}
  timeout -k 5 240 python3 scripts/step_profile.py --chunk 2048 --context "$ctx" --kv-format "$kvf" --steps 3 \
    > "$OUT/chunk_profile_${ctx}_${kvf}.log" 2>&1
  echo "chunk profile $ctx $kvf rc $? at $(($(date +%s) - T0)) s"
  grep -E "^\| [0-9]+ \|" "$OUT/chunk_profile_${ctx}_${kvf}.log" | head -3
  grep -E "^\| " "$OUT/chunk_profile_${ctx}_${kvf}.log" | sed -n '/kernel | per step/,$p' | head -16
done
OUT="$OUT" timeout -k 5 150 python3 scripts/index_prefill_probe.py > "$OUT/index_prefill_probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
grep -E "^\|" "$OUT/index_prefill_probe.log"
