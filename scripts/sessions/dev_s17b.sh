#!/usr/bin/env bash
# Session 17, call 3: test_bench_command_on_cuda_small's bench command run directly (its
# bench.json and log come back; its assertions checked by a snippet), beside the Flash stack
# runtime-vs-reference test at ATTNV41_STACK_STEPS decode steps.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
L="${LIMIT:-400}"
T0=$(date +%s)
ATTNV41_STACK_STEPS="${STACK_STEPS:-50}" timeout -k 5 "$L" python3 -m pytest -v -p no:cacheprovider -p no:xdist \
  -rfEs --tb=long -m gpu_full -k stack_runtime_vs_reference tests/runtime/test_gpu.py > "$OUT/stack.log" 2>&1 &
( timeout -k 5 "$L" python3 -m attnv41 bench --device cuda --preset small --quick --out "$OUT/b" --no-progress \
    --contexts 256,1024 --prefill 64,128 --index-lengths 4096,65536 --batches 1,4 > "$OUT/bench.log" 2>&1
  echo "bench rc $? at $(($(date +%s) - T0)) s" >> "$OUT/bench.log"; cp "$OUT/b/bench.json" "$OUT/bench.json" ) &
wait
echo "done at $(($(date +%s) - T0)) s"; tail -1 "$OUT/stack.log" | cut -c1-200; tail -1 "$OUT/bench.log"
grep -E "^E " "$OUT/stack.log" | head -20 | cut -c1-300
python3 - "$OUT/bench.json" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))
print("errors:", res.get("errors")); print("gate:", res.get("gate"))
print("decode modes:", {r["mode"] for r in res["decode"]})
for r in res["decode"]:
    if r["mode"] == "graphs":
        print("graphs row:", {k: r.get(k) for k in ("context", "n_sources", "host_ms", "ms", "capture_s", "recaptures")})
for r in res["kernels"]:
    if r["impl"] != "triton" or r["timing"] != "graph":
        print("kernel row:", r.get("name"), r.get("impl"), r.get("timing"), str(r.get("graph_error"))[:300])
print("ceilings:", res["ceilings"])
PY
