#!/usr/bin/env bash
# Thirty-fourth entry, prepared for the next device call (H200 wanted; an H100 answers too):
# loads the pipeliner could not see, now visible to it. `fmt_loops`: the logits kernel's
# chunk loop per row format, so packed rows' loads are pipelined as bf16 rows' are (offline
# sm_90: 8 → 52 asynchronous copies at B = 64); the H200's packed B = 64 step lost 168 µs per
# step in this kernel (thirty-second entry). `skip_program` (with skip=False): the index
# scores' loop without its per-block branch, so its key loads are pipelined (0 → 16-32
# copies). Their GPU tests (the same bytes), the kernels alone on a B = 64 step's inputs and
# the m = 1 index over 1M keys, then whole steps at 32K, FP8 weights: B = 1 and 64 over bf16
# and packed caches, and the single-sequence runtime over packed caches.
# About 330 s. carry: [".golden"]; timeout_s ≥ 420.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 "${TEST_S:-100}" python3 -m pytest -q -p no:cacheprovider -rfE -n 8 \
  tests/kernels/test_sparse_attn_packed.py tests/kernels/test_sparse_attn_split.py \
  tests/kernels/test_indexer_paged.py tests/kernels/test_indexer_packed.py > "$OUT/tests.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; grep -E "FAILED|ERROR|passed|failed" "$OUT/tests.log" | tail -8
timeout -k 5 "${PROBE_S:-80}" python3 scripts/batch_kernel_probe.py --attn-set loops --index-set pipe \
  --index-call 3 --single-keys 1048000 > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep "^|" "$OUT/probe.log" | head -40
V="new;attn fmt loops;attn fmt loops 128;index skip program;index skip program, attn fmt loops"
timeout -k 5 "${AB_S:-150}" python3 scripts/ab_steps.py --batches 1,64 --context 32768 --kv bf16,packed \
  --weights fp8 --rounds "${ROUNDS:-3}" --variants "${VARIANTS:-$V}" > "$OUT/ab_batch.log" 2>&1
echo "ab batch rc $? at $(($(date +%s) - T0)) s"; grep -E "^[|]" "$OUT/ab_batch.log"
timeout -k 5 "${SINGLE_S:-110}" python3 scripts/ab_steps.py --single 32768 --kv bf16,packed --weights fp8 --rounds 2 \
  --variants "new;attn fmt loops;index skip program, attn fmt loops" > "$OUT/ab_single.log" 2>&1
echo "ab single rc $? at $(($(date +%s) - T0)) s"; grep -E "^[|]" "$OUT/ab_single.log"
