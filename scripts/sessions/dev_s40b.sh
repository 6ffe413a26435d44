#!/usr/bin/env bash
# For the thirty-eighth entry, its last call (carry [".golden"], timeout 420): 1. whether the
# index scores' bits under 8 warps (a tuning shape; the second call's probe saw `tokens=16, 8
# warps` differ from production) follow the warp count or the `tokens` option: tokens 1 and 16
# at 8 warps against each other and against production's 4, over a 1M tile's keys; 2. the quick
# tier on the session's final code (`sub_tokens` = 1, the batched rule as before).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests" ATTNV41_GOLDEN_DIR="$PWD/.golden"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 90 python3 - <<'PY' 2>&1 | tee "$OUT/warps.log"
import torch
from attnv41.kernels import indexer as I
from attnv41.packed import pack
from attnv41.reference.qdq import fp4_e8m0_qdq
dev, g = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(0)
H, d, B, T, L = 32, 128, 64, 64, 1 << 20
for kvf in ("bf16", "packed"):
    table = torch.randperm(L // B, device=dev, generator=g).to(torch.int32)[None]
    keys = torch.randn(L, d, device=dev, generator=g).to(torch.bfloat16)
    if kvf == "packed":
        keys = pack(fp4_e8m0_qdq(keys), "fp4_e8m0")
    iq = torch.randn(T, H, d, device=dev, generator=g).to(torch.bfloat16)
    w = torch.randn(T, H, device=dev, generator=g).to(torch.bfloat16)
    slots = torch.zeros(T, dtype=torch.int32, device=dev)
    vis = (943000 + torch.arange(T, device=dev)).to(torch.int32)
    run = lambda **kw: I.index_scores_paged(iq, w, keys, table, slots, B, vis, L, **kw).view(torch.int16)
    p1, p16, w1, w16 = run(), run(tokens=16), run(num_warps=8), run(tokens=16, num_warps=8)
    n = lambda a, b: int((a != b).sum())
    print(f"{kvf}: differing entries of {p1.numel()}: production t1 vs t16 {n(p1, p16)}; 8 warps t1 vs t16 "
          f"{n(w1, w16)}; 8 warps t1 vs production {n(w1, p1)}; 8 warps t16 vs production {n(w16, p1)}")
    keys = None
PY
echo "warps check at $(($(date +%s) - T0)) s"
TIER_S="${TIER_S:-300}" bash scripts/dev_tier.sh
grep -E "FAILED|ERROR" "$OUT/pytest_quick.log" | head -10 | cut -c1-200
echo "done at $(($(date +%s) - T0)) s"
