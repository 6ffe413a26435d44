#!/usr/bin/env bash
# (Record: `gemv._AHEAD8` and `gemv._WORDS8`, which these variants set, were removed after
# dev_s28c.sh lost on an H100; commit acd56e1 has them. dev_s28a/b never ran.)
# 2026-12-05 (twenty-eighth entry), call 1: what bounds the m = 1 decode GEMV. The constant-byte
# shape sweep, the split rule's target program count and a streaming read of the same bytes
# (scripts/gemv_shape_probe.py); then the single-sequence FP8 step under the split-rule
# variants (ab_steps.py --single, bf16 caches, 4K). carry: none needed
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
PARTS=${PARTS:-stream,ahead,progs} BUDGET_S=150 timeout -k 5 200 python3 scripts/gemv_shape_probe.py > "$OUT/gemv_shape_probe.log" 2>&1
echo "probe rc $? at $(($(date +%s) - T0)) s"
timeout -k 5 "${AB_S:-200}" python3 scripts/ab_steps.py --single 4096 --weights fp8 --kv bf16 --rounds 2 \
  --variants "new;gemv ahead 1;gemv words ahead 1;gemv words ahead 2" > "$OUT/ab_fp8_gemv.log" 2>&1
echo "ab rc $? at $(($(date +%s) - T0)) s"
grep -E "^(stream|ahead|progs|shapes) " "$OUT/gemv_shape_probe.log"
grep "^|" "$OUT/ab_fp8_gemv.log" || tail -5 "$OUT/ab_fp8_gemv.log"
