#!/usr/bin/env bash
# 2026-12-05 (twenty-fifth entry, written for a later session): on a TWO-GPU machine (kind
# nvidia-h100-x2 or nvidia-h200-x2), a runtime on cuda:1 driven while cuda:0 is current,
# against the same runtime on cuda:0, byte for byte (tests/runtime/test_own_device.py), and
# `attnv41 env` listing both GPUs. About 2 minutes (compiles). carry: [".golden"]
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
python3 -m attnv41 env | tee "$OUT/env.txt"
timeout 400 python3 -m pytest -v -p no:cacheprovider -rfEs tests/runtime/test_own_device.py \
  tests/kernels/test_device_support.py > "$OUT/own_device.log" 2>&1
echo "own-device tests rc $?"
tail -15 "$OUT/own_device.log"
