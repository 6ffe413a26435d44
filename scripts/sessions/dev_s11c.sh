#!/usr/bin/env bash
# 2026-12-04 (eleventh entry), call 3 (final code: BATCH_TUNE's loop combine in 8 warps over
# bf16 rows, 4 over packed rows; rsplit a tuning option, off): the quick tier, the step A/B
# against the previous combine warps, then `bench --parts peer,batch` at 32K.
# carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile --junitxml "$OUT/pytest.xml" \
  -m "gpu and not gpu_full" tests > "$OUT/pytest_quick.log" 2>&1
echo "quick tier rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/pytest_quick.log" | cut -c1-300
timeout -k 5 130 python3 scripts/ab_steps.py --context 32768 --batches 64 --rounds 3 \
  --variants 'new;batch combine warps=4' > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 150 python3 -m attnv41 bench --parts peer,batch --batch-sizes 1,64 --batch-contexts 32768 \
  --contexts 4096,32768 --no-progress --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
rm -f "$OUT/bench/decode_step.png"
grep -E "^\|" "$OUT/ab_batch.log" | cut -c1-120
grep -E "^\| 32768 \| (1|64) \| 1 \||sparse|FlashMLA|flash_mla" "$OUT/bench/bench.md" | head -20
