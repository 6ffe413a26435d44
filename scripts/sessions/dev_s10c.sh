#!/usr/bin/env bash
# 2026-12-03 (tenth entry), call 3: BATCH_TUNE over packed rows in chunks of 64 with the
# logits as rows · qᵀ (keys_m_packed). The touched kernels' GPU tests, the step A/B against
# the previous packed shape, `bench --parts batch`, then the full tier's long tests
# (-m gpu_full: the Flash GEMVs at m = 16, headdim cases, the 1M-context test).
# carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 150 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/kernels/test_packed_rows.py \
  tests/kernels/test_sparse_attn_packed.py tests/kernels/test_sparse_attn_split.py tests/kernels/test_decode_invariance.py \
  > "$OUT/pytest_kernels.log" 2>&1
echo "kernel tests rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/pytest_kernels.log" | cut -c1-300
timeout -k 5 80 python3 scripts/ab_steps.py --context 32768 --batches 64 --rounds 2 \
  --variants 'new;batch packed dk=128 heads-major' > "$OUT/ab_batch.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 100 python3 -m attnv41 bench --parts batch --batch-sizes 1,64 --batch-contexts 32768 --no-progress \
  --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 "${FULL_S:-230}" python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile -m gpu_full \
  --junitxml "$OUT/pytest_full.xml" tests > "$OUT/pytest_full.log" 2>&1
echo "full-tier tests rc $? at $(($(date +%s) - T0)) s"; tail -4 "$OUT/pytest_full.log" | cut -c1-300
rm -f "$OUT/bench/decode_step.png"
grep -E "^\|" "$OUT/ab_batch.log" | cut -c1-120
grep -E "^\| 32768 \| (1|64) \| 1 \|" "$OUT/bench/bench.md"
