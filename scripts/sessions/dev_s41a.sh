#!/usr/bin/env bash
# For the thirty-ninth entry, its first call (carry [".golden"], timeout 600): 1. the top-k
# at decode and prompt-tile row counts (m 1-64, Lb 4K-1M), the rule by rows and width
# (`topk._topk_shape`) against tiles 2048 / 4096 at 4 and 8 warps, each checked equal to its
# torch twin first; 2. the candidate mask at 64 rows, 4 against 8 warps; 3. the quick tier on
# the rule.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 170 python3 scripts/topk_tune.py --lean --ms 1,2,4,8,16,64 --lbs 4096,32768,131072,1048576 \
  --tiles 2048,4096 --warps 4,8 --budget 130 > "$OUT/topk_tune.log" 2>&1
echo "topk_tune rc $? at $(($(date +%s) - T0)) s"
mv "$OUT/topk_tune.json" "$OUT/topk_tune_rows.json" 2>/dev/null
timeout -k 5 75 python3 scripts/topk_tune.py --ms 64 --lbs 32768,1048576 --tiles 4096 --warps 4 \
  --mask-warps 4,8 --budget 50 > "$OUT/topk_mask.log" 2>&1
echo "topk_mask rc $? at $(($(date +%s) - T0)) s"
TIER_S="${TIER_S:-300}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
echo "--- top-k rows (lean)"; grep -E "^\| [0-9]+ \| [0-9]+ \| triton topk \|" "$OUT/topk_tune.log" | cut -c1-90
echo "--- mask"; grep -E "cand_mask|rule" "$OUT/topk_mask.log" | grep "^|" | cut -c1-90
echo "done at $(($(date +%s) - T0)) s"
