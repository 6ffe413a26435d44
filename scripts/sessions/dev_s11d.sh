#!/usr/bin/env bash
# 2026-12-04 (eleventh entry), call 4: `bench --parts peer` with the FlashMLA wheel installed
# (call 3 ran without it). carry: [".golden", ".whl"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout -k 5 150 python3 -m attnv41 bench --parts peer --contexts 4096,32768 --no-progress --out "$OUT/bench" \
  > "$OUT/bench.log" 2>&1
echo "bench rc $? at $(($(date +%s) - T0)) s"
grep -E "sparse|FlashMLA|flash_mla|Peer" "$OUT/bench/bench.md" | head -20
