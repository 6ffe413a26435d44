#!/usr/bin/env bash
# 2026-12-04 (fourteenth entry), call 3: the block combine's rows gathered while the logits
# kernel runs (`early_rows`). Its GPU tests, whole single-sequence and batched steps A/B
# (ab_steps.py), then bench's attention beside FlashMLA with and without it (with_knobs.py).
# carry: [".golden", ".whl"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile -m gpu \
  tests/kernels/test_sparse_attn_split.py tests/kernels/test_sparse_attn_packed.py > "$OUT/pytest_attn.log" 2>&1
echo "attn tests rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/pytest_attn.log" | cut -c1-300
grep -E "^(FAILED|ERROR)" "$OUT/pytest_attn.log" | head -10 | cut -c1-300
timeout -k 5 120 python3 scripts/ab_steps.py --single 4096,32768 --rounds 3 --variants 'new;attn early rows' \
  > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"; grep -E "^\|" "$OUT/ab_single.log" | cut -c1-140
timeout -k 5 100 python3 scripts/ab_steps.py --context 32768 --batches 1 --rounds 2 --variants 'new;attn early rows' \
  > "$OUT/ab_batch1.log" 2>&1
echo "ab batch1 rc $? at $(($(date +%s) - T0)) s"; grep -E "^\|" "$OUT/ab_batch1.log" | cut -c1-140
for v in False True; do
  timeout -k 5 100 python3 scripts/with_knobs.py "attnv41.kernels.sparse_attn_split._TUNE['early_rows']=$v" -- \
    attnv41 bench --parts peer --contexts 4096,32768 --no-progress --out "$OUT/peer_$v" > "$OUT/peer_$v.log" 2>&1
  echo "bench peer early_rows=$v rc $? at $(($(date +%s) - T0)) s"; rm -f "$OUT/peer_$v/decode_step.png"
  grep -E "^\|" "$OUT/peer_$v/bench.md" | head -14 | cut -c1-170
done
