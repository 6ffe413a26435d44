"""The batched projections' RoPE epilogue (`tc_mm.mm_many_batch(..., rope=)`) costs the
tile nothing it keeps: compiled for sm_90 without a GPU (`attnv41.bench.sass tc`, in a
subprocess where Triton does not interpret), the launch over q's latent (wq_b and
indexer.wq_b, m = 64) has the registers of the launch without it and no local memory,
bf16 and FP8 weights. The rotation's code runs only in tiles holding a head's RoPE tail
(a branch on the tile), so the loop over K is the same."""

from __future__ import annotations

import pytest

from kernels.sass_helpers import compiled


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_rope_epilogue_keeps_registers_and_spills(dtype):
    plain = compiled("tc", "--dtype", dtype)["_tc_many_kernel"]
    rope = compiled("tc", "--dtype", dtype, "--rope")["_tc_many_kernel"]
    assert rope["local"] == 0 and plain["local"] == 0, f"local memory: {rope['local']} / {plain['local']} bytes"
    assert rope["regs"] <= plain["regs"], f"{rope['regs']} registers with the epilogue, {plain['regs']} without"
    # the K loop's tensor-core instructions are the same (the epilogue adds no product)
    mma = [k for k in plain["ops"] if k.startswith("HGMMA") or k.startswith("HMMA")]
    assert mma and all(rope["ops"].get(k) == plain["ops"][k] for k in mma), (
        {k: plain["ops"][k] for k in mma},
        {k: rope["ops"].get(k) for k in mma},
    )


_COARSE = """
import json, re, torch
from attnv41.bench.sass import compile_only
from attnv41.kernels import tc_mm as TC
TC._TARGET_PROGRAMS, TC._MIN_SEG_PRODUCTS = 2, 1
TC._FINE_PLAN = {"bf16": (8, 1)}
TC._FINE_MAX_M = {}  # coarse programs: 2 per tile, each adding 4 fine segments of one chunk
bf = torch.bfloat16
with compile_only() as launches:
    TC.tc_mm(torch.zeros(64, 1024, dtype=bf), torch.zeros(48, 1024, dtype=bf), torch.zeros(64, 48, dtype=bf))
g = launches[0][1].asm["ttgir"]
dots = [line for line in g.splitlines() if "warp_group_dot " in line or "tt.dot " in line]
print(json.dumps(dict(dots=len(dots), adds=g.count("add.rn.f32"))))
"""


def test_coarse_programs_add_their_segments_outside_the_tensor_cores():
    """Two split levels (`tc_mm` module doc): a coarse program adds its fine segments with
    one fp32 addition each, as the fine programs' combine does. Triton's combine pass would
    fold `dot(a, b, 0) + tot` into `dot(a, b, tot)` (the tensor cores' sum: other bits, the
    H200 showed them) where a segment is one chunk; `_add_seg` keeps the additions opaque.
    Compiled for sm_90 offline: 4 products, 3 additions."""
    import json
    import os
    import subprocess
    import sys

    from kernels.sass_helpers import SRC

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.abspath(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", _COARSE], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"dots": 4, "adds": 3}, got
