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
