#!/usr/bin/env bash
# One device call for the packed caches and the 1M context (issue 15) and the batched
# runtime (issue 14): the quick GPU tier over pytest-xdist workers (device_run.sh, golden
# runtime cases inside pytest), compute-sanitizer memcheck on the tiny golden file through
# the runtime with packed caches, `check --kv-format packed` on two other golden files
# (CHECKS, default "headdim:forward fp8:split"),
# then `bench --parts decode,batch` (bf16 weights): decode at 4K and ~1M contexts with bf16
# and packed caches, batched decode at B = 1, 64 over 4K and 32K. Every log goes into ONE
# archive ($OUT/results.tgz: the device tool brings back at most 8 files); a short table
# last (also $OUT/summary.txt).
#
# Knobs: QUICK_S (the quick tier's budget, default 270), BENCH_S (default 200), CONTEXTS
# (default 4096,1048000), BATCH_SIZES (default 1,64), BATCH_CONTEXTS (default 4096,32768),
# BENCH_PARTS (default decode,batch), FULL_TESTS (full-tier node ids, FULL_S), PROFILES
# (context:batch:kv_format ...), PROBES (context:batch:kv_formats ..., scripts/batch_kernel_probe.py,
# PROBE_S; SINGLE_KEYS=L adds index_scores at m = 1 over L keys; batch 0: only that), PYTEST_SUBSET (test paths run after the quick tier,
# SUBSET_S their budget), WEIGHTS (bench weight formats, default bf16; e.g. "bf16 fp8"),
# SKIP_QUICK=1, SKIP_SANITIZER=1, SKIP_BENCH=1.
set -u
OUT="${OUT:-/tmp/out}"
W=/tmp/session
rm -rf "$W"
mkdir -p "$OUT" "$W"
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
S="$W/summary.txt"
note() { echo "$(printf '%4d' $(( $(date +%s) - T0 ))) s  $*" | tee -a "$S"; }

if [ "${SKIP_QUICK:-0}" != 1 ]; then
  OUT="$W/quick" TIER=quick SKIP_CHECKS=1 SKIP_SANITIZER=1 BUDGET_S="${QUICK_S:-270}" bash scripts/device_run.sh > "$W/quick.log" 2>&1
  note "quick tier rc $?: $(grep -E '^pytest_quick' "$W/quick/summary.txt" 2>/dev/null | tr -s ' ')"
fi

if [ -n "${PYTEST_SUBSET:-}" ]; then # a few test files on the GPU, one process (the kernels being tuned)
  # shellcheck disable=SC2086
  timeout "${SUBSET_S:-240}" python3 -m pytest -q -p no:cacheprovider -rfEs $PYTEST_SUBSET > "$W/subset.log" 2>&1
  note "pytest subset rc $?: $(grep -E '[0-9]+ (passed|failed)' "$W/subset.log" | tail -1)"
fi

SAN=$(command -v compute-sanitizer 2>/dev/null || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ] && [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  timeout 120 "$SAN" --tool memcheck --error-exitcode 99 --print-limit 20 python3 -m attnv41 check \
    --golden .golden/v41_tiny.safetensors --impl runtime --decode split --kv-format packed --device cuda > "$W/memcheck_packed.log" 2>&1
  note "memcheck packed rc $?: $(grep -oE 'ERROR SUMMARY: [0-9]+ errors?' "$W/memcheck_packed.log" | tail -1); $(grep -E '^(PASS|FAIL)' "$W/memcheck_packed.log" | cut -c1-150)"
fi
for gd in ${CHECKS-headdim:forward fp8:split}; do
  g=${gd%%:*} d=${gd##*:}
  timeout 90 python3 -m attnv41 check --golden ".golden/v41_$g.safetensors" --impl runtime --decode "$d" --kv-format packed --device cuda > "$W/check_${g}_${d}_packed.log" 2>&1
  note "check $g $d packed rc $?: $(grep -E '^(PASS|FAIL)' "$W/check_${g}_${d}_packed.log" | cut -c1-170)"
done

if [ -n "${FULL_TESTS:-}" ]; then # full-tier tests by node id (e.g. the 1M context), one process
  # shellcheck disable=SC2086
  timeout "${FULL_S:-200}" python3 -m pytest -q -p no:cacheprovider -rfEs -m gpu_full $FULL_TESTS > "$W/full.log" 2>&1
  note "full-tier tests rc $?: $(grep -E '[0-9]+ (passed|failed|skipped|deselected)' "$W/full.log" | tail -1)"
fi
for prof in ${PROFILES:-}; do # context:batch:kv_format[:weights], a profiled graph step (scripts/step_profile.py)
  IFS=: read -r pc pb pk pw <<< "$prof"
  pw=${pw:-bf16}
  timeout 120 python3 scripts/step_profile.py --context "$pc" --batch "$pb" --kv-format "$pk" --weights "$pw" --steps 3 > "$W/profile_${pc}_${pb}_${pk}_${pw}.log" 2>&1
  note "profile $prof rc $?: $(grep -A3 '| step |' "$W/profile_${pc}_${pb}_${pk}_${pw}.log" | tail -1)"
done

for pr in ${PROBES:-}; do # context:batch:kv_formats, the batched step's kernels alone (scripts/batch_kernel_probe.py)
  IFS=: read -r pc pb pk <<< "$pr"
  OUT="$W" timeout "${PROBE_S:-240}" python3 scripts/batch_kernel_probe.py --context "$pc" --batch "$pb" --kv "$pk" --single-keys "${SINGLE_KEYS:-0}" > "$W/probe_${pc}_${pb}.log" 2>&1
  note "probe $pr rc $?"
done

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  if ls .whl/*.whl >/dev/null 2>&1; then # the FlashMLA peer (a speed reference, carried, never a dependency)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
      export PYTHONPATH="$PYTHONPATH:/tmp/site"
  fi
  first=1
  for bw in ${WEIGHTS:-bf16}; do # one bench per weight format; the first's log is bench.log
    log="$W/bench_next_$bw.log"
    [ "$first" = 1 ] && log="$W/bench.log"
    first=0
    timeout "${BENCH_S:-200}" python3 -m attnv41 bench --parts "${BENCH_PARTS:-decode,batch}" --weights "$bw" --contexts "${CONTEXTS:-4096,1048000}" \
      --batch-sizes "${BATCH_SIZES:-1,64}" --batch-contexts "${BATCH_CONTEXTS:-4096,32768}" --no-progress --out "$W/bench_$bw" > "$log" 2>&1
    note "bench $bw rc $?"
  done
fi

tar czf "$OUT/results.tgz" -C "$W" . 2>/dev/null
cp "$S" "$OUT/summary.txt"
echo "== $(( $(date +%s) - T0 )) s"
cat "$W/quick/summary.txt" 2>/dev/null | tail -4
grep -E "passed|failed" "$W/quick/logs/pytest_quick.log" 2>/dev/null | tail -3
grep -E "^FAILED|^ERROR" "$W/quick/logs/pytest_quick.log" "$W/subset.log" 2>/dev/null | head -10
cat "$S"
sed -n '/^(a)/,/^$/p' "$W/bench.log" 2>/dev/null
sed -n '/^(f)/,$p' "$W/bench.log" 2>/dev/null | head -24
[ -n "${BENCH_PARTS:-}" ] && tail -60 "$W/bench.log"
for f in "$W"/bench_next_*.log; do [ -f "$f" ] && { echo "== $f"; tail -40 "$f"; }; done
for f in "$W"/probe_*.log; do [ -f "$f" ] && { echo "== $f"; sed -n '/^### kernels alone/,$p' "$f"; grep -E "Error|error" "$f" | head -5; }; done
for f in "$W"/profile_*.log; do [ -f "$f" ] && { echo "== $f"; grep -A14 '| kernel |' "$f"; }; done
grep -E "KV bytes|memory|Error|error" "$W/bench.log" 2>/dev/null | head -5
