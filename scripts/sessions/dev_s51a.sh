#!/usr/bin/env bash
# Session 51 (carry [".golden"], timeout 420; TOTAL_S bounds the ncu part): the Gluon index
# kernel's `one_word` conversion (one code word per thread in the copies' layout: the bank
# conflicts of the four-words layout gone from the words' shared loads and the tile's stores).
# 1. the Gluon GPU tests (bytes against the Triton kernel, one_word included); 2. the probe's
# `oneword` set on a B = 64, 32K step's own inputs; 3. the B = 64, 32K FP8 step, production
# against the Gluon kernel with one_word, packed caches; 4. ncu source counters (which
# instructions meet the bank conflicts) on the Triton launch and the one_word launch
# (NCU_ONLY=1: that part alone).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
if [ "${NCU_ONLY:-0}" = 0 ]; then
timeout -k 5 "${TEST_S:-120}" python3 -m pytest -q -p no:cacheprovider -rfEs tests/kernels/test_indexer_gluon.py \
  > "$OUT/test_gluon.log" 2>&1
echo "tests rc $? at $(($(date +%s) - T0)) s"; tail -2 "$OUT/test_gluon.log" | cut -c1-300
grep -E "^(FAILED|ERROR)" "$OUT/test_gluon.log" | head -8 | cut -c1-300
timeout -k 5 "${PROBE_S:-120}" python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv packed \
  --attn-set production --index-set oneword --index-call 3 > "$OUT/probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/probe.log" | grep index | cut -c1-200
if [ "${AB_S:-150}" != 0 ]; then
  timeout -k 5 "${AB_S:-150}" python3 scripts/ab_steps.py --context 32768 --batches 64 --kv packed \
    --weights fp8 --rounds 3 --variants "${AB_VARIANTS:-new;index gluon one_word}" > "$OUT/ab_batch_fp8.log" 2>&1
  echo "ab rc $? at $(($(date +%s) - T0)) s"; grep -h "^| " "$OUT/ab_batch_fp8.log"
fi
fi  # NCU_ONLY=1: the ncu part alone
for k in tri ow; do
  left=$((${TOTAL_S:-400} - $(date +%s) + T0))
  [ "$left" -gt 50 ] || break
  if [ $k = ow ]; then sel=(-k regex:_index_gl_kernel -c 1); set_=oneword1; else sel=(-k regex:_index_scores_kernel --launch-skip 3 -c 1); set_=production; fi
  timeout -k 5 "$left" ncu --clock-control none "${sel[@]}" -o "$OUT/ncu_$k" \
    --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis_Tables --section SourceCounters \
    python3 scripts/batch_kernel_probe.py --batch 64 --context 32768 --kv packed --attn-set production \
      --index-set "$set_" --index-call 3 --reps 1 > "$OUT/ncu_$k.log" 2>&1
  echo "ncu $k rc $? at $(($(date +%s) - T0)) s"
  ncu --import "$OUT/ncu_$k.ncu-rep" --print-details all > "$OUT/ncu_$k.txt" 2>&1
  ncu --import "$OUT/ncu_$k.ncu-rep" --page source --print-source sass --csv > "$OUT/src_$k.csv" 2>&1
  grep -E "^  _index|Duration|DRAM Throughput|L1/TEX Cache Throughput|Achieved Occupancy|Registers Per|bank|wavefronts" \
    "$OUT/ncu_$k.txt" | head -16 | cut -c1-160
  python3 - "$OUT/src_$k.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr = next((i for i, r in enumerate(rows) if any("Source" == c or "Address" in c for c in r)), None)
if hdr is None:
    print("no source table:", " | ".join(" ".join(r)[:100] for r in rows[:3])); sys.exit()
h = rows[hdr]; print("columns:", len(h), [c for c in h if "Shared" in c or "Excessive" in c or "Bank" in c][:8])
col = next((h.index(c) for c in h if "L1 Wavefronts Shared Excessive" in c), None)
src = next((h.index(c) for c in h if c == "Source"), 1)
if col is None: sys.exit()
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
top = sorted(rows[hdr + 1:], key=lambda r: -num(r[col]) if len(r) > col else 0)[:8]
for r in top: print(f"{num(r[col]):>12.0f}  {r[src][:90]}")
PY
done
echo "done at $(($(date +%s) - T0)) s"
