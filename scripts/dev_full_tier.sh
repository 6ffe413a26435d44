#!/usr/bin/env bash
# The full GPU tier's long tests (gpu_full) in two device calls, each within the 10-minute limit, with test names in
# the log (-v) so a run cut by its limit still says which test failed (2026-12-04, sixteenth
# entry: a -q run under xdist failed one test and was cut before the report).
#   bash scripts/dev_full_tier.sh long     # -m gpu_full less the two 10k-step replays, 2 workers
#   bash scripts/dev_full_tier.sh replays  # the two 10k-step graph replays, one worker
# (the quick tier: scripts/dev_tier.sh)
# carry: [".golden"] (and ".whl" for the peer wheel, installed to /tmp/site)
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" ATTNV41_GOLDEN_DIR="$PWD/.golden"
part="${1:-long}"
case "$part" in
  long) sel=(-m gpu_full -k "not 10k_steps" -n 2 --dist loadfile) ;;
  replays) sel=(-m gpu_full -k "10k_steps") ;;
  *) echo "part: long or replays (got $part)"; exit 2 ;;
esac
T0=$(date +%s)
timeout -k 5 "${LIMIT:-560}" python3 -m pytest -v -p no:cacheprovider -rfEs --durations 20 \
  --junitxml "$OUT/$part.xml" "${sel[@]}" tests > "$OUT/$part.log" 2>&1
echo "$part rc $? at $(($(date +%s) - T0)) s"; tail -1 "$OUT/$part.log" | cut -c1-300
# -v names each test as it ends (also when the limit cuts the run before pytest's summary)
grep -E " (FAILED|ERROR)( |$)" "$OUT/$part.log" | head -20 | cut -c1-300
