#!/usr/bin/env bash
# 2026-12-04 (eleventh entry), call 1: the batch-1 attention probe (where its time goes; proxies
# of a logits stage spread over more programs), the quick tier on the tenth entry's final
# code, then the four tests of runtime/test_gpu.py the tenth entry's full-tier call did not
# reach (the 10k-step replays shortened to 2,000 steps by ATTNV41_REPLAY_STEPS).
# carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
T0=$(date +%s)
timeout -k 5 90 python3 scripts/logits_split_probe.py --rounds 3 > "$OUT/logits_probe.md" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 200 python3 -m pytest -q -p no:cacheprovider -rfEs -n 8 --dist loadfile --junitxml "$OUT/pytest.xml" \
  -m "gpu and not gpu_full" tests > "$OUT/pytest_quick.log" 2>&1
echo "quick tier rc $? at $(($(date +%s) - T0)) s"; tail -3 "$OUT/pytest_quick.log" | cut -c1-300
ATTNV41_REPLAY_STEPS=2000 timeout -k 5 "${LONG_S:-270}" python3 -m pytest -v -p no:cacheprovider -n 4 --dist load \
  tests/runtime/test_gpu.py -k "runtime_vs_reference or graph_replay_short or graph_replay_10k" \
  > "$OUT/pytest_runtime.log" 2>&1
echo "runtime tests rc $? at $(($(date +%s) - T0)) s"
grep -E "PASSED|FAILED|ERROR" "$OUT/pytest_runtime.log" | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' | cut -c1-150
tail -2 "$OUT/pytest_runtime.log" | cut -c1-300
cat "$OUT/logits_probe.md"
