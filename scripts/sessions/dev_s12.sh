#!/usr/bin/env bash
# 2026-12-04 (twelfth entry), call 1: the quick tier on the eleventh entry's final code (the
# packed register caps in BATCH_TUNE; not run there), where the B = 64, 32K step goes with
# each cache format (step_profile.py), and the index scores' packed register caps in whole
# B = 64 steps (ab_steps.py). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile --junitxml "$OUT/pytest.xml" \
  -m "gpu and not gpu_full" tests > "$OUT/pytest_quick.log" 2>&1
echo "quick tier rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/pytest_quick.log" | cut -c1-300
for kvf in packed bf16; do
  OUT=$OUT timeout -k 5 100 python3 scripts/step_profile.py --context 32768 --batch 64 --steps 3 --kv-format $kvf \
    > "$OUT/profile_b64_$kvf.log" 2>&1
  echo "profile $kvf rc $? at $(($(date +%s) - T0)) s"
done
timeout -k 5 120 python3 scripts/ab_steps.py --context 32768 --batches 64 --kv packed --rounds 2 \
  --variants 'new;index packed cap 80;index packed cap 64' > "$OUT/ab_index.log" 2>&1
echo "ab index rc $? at $(($(date +%s) - T0)) s"
grep -E "^\||ms$" "$OUT/ab_index.log" | cut -c1-120
for kvf in packed bf16; do echo "== $kvf"; grep -E "^\| " "$OUT/profile_b64_$kvf.log" | head -16 | cut -c1-110; done
