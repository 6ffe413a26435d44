#!/usr/bin/env bash
# The full GPU tier's long tests (gpu_full) in three device calls, each within the 10-minute
# limit, with test names in the log (-v) so a run cut by its limit still says which test
# ended how. Timings on the H200 (2026-12-04, seventeenth entry):
#   bash scripts/dev_full_tier.sh long     # -m gpu_full outside runtime/test_gpu.py, 2 workers:
#                                          # 15 tests, the CUDA bench test 146 s alone
#   bash scripts/dev_full_tier.sh stack    # runtime/test_gpu.py's full tier less the 10k replays:
#                                          # the stack test at STACK_STEPS (default: the test's,
#                                          # 100 steps, 194 s alone on an H100, 2026-12-05;
#                                          # 2026-12-07, H100: not ended in 420 s beside the
#                                          # replay tests; alone at STACK_STEPS=30: 125 s)
#   bash scripts/dev_full_tier.sh replays  # the two 10k-step replays, one per worker (each
#                                          # ~550 s at 10,000 steps: REPLAY_STEPS, LIMIT=590)
#                                          # 2026-12-04 (eighteenth entry): neither ended in 585 s
#                                          # 2026-12-06 (H100): 2,500 steps 152 s each (the two at
#                                          # once), so 10,000 need ~610 s: split them,
#                                          # REPLAY_START=1000, 3500, 6000, 8500 with
#                                          # REPLAY_STEPS=2500 (four calls of ~170 s)
#   bash scripts/dev_full_tier.sh own      # one replay alone, no xdist, its per-1,000-step
#   bash scripts/dev_full_tier.sh released # progress printed live (-s): one call each
# (the quick tier: scripts/dev_tier.sh)
# carry: [".golden"] (and ".whl" for the peer wheel, installed to /tmp/site)
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" ATTNV41_GOLDEN_DIR="$PWD/.golden"
export ATTNV41_STACK_STEPS="${STACK_STEPS:-100}" ATTNV41_REPLAY_STEPS="${REPLAY_STEPS:-10000}"
export ATTNV41_REPLAY_START="${REPLAY_START:-1000}"
part="${1:-long}"
case "$part" in
  long) sel=(-m gpu_full -n 2 --dist loadfile --ignore tests/runtime/test_gpu.py tests) ;;
  stack) sel=(-m gpu_full -k "not 10k_steps" -n 2 --dist load tests/runtime/test_gpu.py) ;;
  replays) sel=(-m gpu_full -k "10k_steps" -n 2 --dist load tests/runtime/test_gpu.py) ;;
  own|released) sel=(-m gpu_full -s "tests/runtime/test_gpu.py::test_flash_graph_replay_10k_steps[$part]") ;;
  *) echo "part: long, stack, replays, own or released (got $part)"; exit 2 ;;
esac
T0=$(date +%s)
timeout -k 5 "${LIMIT:-560}" python3 -m pytest -v -p no:cacheprovider -rfEs --durations 20 \
  --junitxml "$OUT/$part.xml" "${sel[@]}" > "$OUT/$part.log" 2>&1
echo "$part rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/$part.log" | cut -c1-300
# -v names each test as it ends (also when the limit cuts the run before pytest's summary)
grep -E " (FAILED|ERROR)( |$)" "$OUT/$part.log" | head -20 | cut -c1-300
grep -E "steps, [0-9]+ checked" "$OUT/$part.log" | tail -3 | cut -c1-200  # the replays' progress (own, released)
