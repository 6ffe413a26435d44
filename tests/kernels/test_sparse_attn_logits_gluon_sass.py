"""The Gluon logits kernel over packed rows (`kernels.sparse_attn_logits_gluon`) on the CPU:
compiled for sm_90 offline through `sparse_attn_split`'s `gluon_logits` option at the
batched runtime's launch shape (Gluon does not run under the interpreter; its numerics are
checked on the GPU, `test_sparse_attn_logits_gluon.py`), and the option's refusals."""

from __future__ import annotations

import json
import re

import pytest
import torch

from attnv41.kernels import sparse_attn_logits_gluon as LG
from attnv41.kernels.sparse_attn_split import BATCH_TUNE, sparse_attn_split
from kernels.sass_helpers import compiled


@pytest.mark.parametrize("q_stages", [0, 2])
@pytest.mark.parametrize("heads, dim", [(64, 512), (8, 128)], ids=["flash", "narrow"])
def test_rows_reach_the_mma_without_shared_memory(heads, dim, q_stages):
    """The option launches the Gluon kernel (then the Triton combine): no spills, its
    shared memory q's chunks alone (plus the reductions' scratch), the warpgroup MMAs
    present, no shared-memory load of an operand tile (no LDSM: the rows' fragments are
    built in registers, q is read by the MMA itself), no async copies; q whole in shared
    memory (q_stages 0) or in two chunk buffers (2, under a cap of 128 registers)."""
    tune = json.dumps(dict(BATCH_TUNE, gluon_logits=dict(q_stages=q_stages, maxnreg=128 if q_stages else None)))
    args = ["attn", "--m", "64", "--packed", "--heads", str(heads), "--dim", str(dim), "--tune", tune]
    ks = compiled(*args)
    assert list(ks) == ["_logits_gl_kernel", "_pv_combine_kernel"], f"launched {sorted(ks)}"
    k = ks["_logits_gl_kernel"]
    assert k["local"] == 0, f"{k['local']} bytes of local memory (spills)"
    h_p = max(16, heads)
    q_bytes = h_p * (dim if q_stages == 0 else 128) * 2
    assert q_bytes <= k["dyn_smem"] <= q_bytes + 1024, f"{k['dyn_smem']} bytes of shared memory"
    ops = k["ops"]
    assert any(o.startswith("HGMMA") for o in ops), "no warpgroup MMA"
    assert not any(o.startswith(("LDSM", "LDGSTS")) for o in ops), sorted(ops)
    assert ops.get("SHFL.BFLY", 0) >= 24, "the quad transposes' shuffles"
    # nothing is read back from shared memory (q is read by the MMA itself), and the rows'
    # fragments are converted from the quad transposes' linear layouts (a relabelling)
    ir = k["ttgir"]
    assert "ttg.local_load" not in ir, "a shared-memory load"
    assert ir.count("ttg.local_store") == ir.count(f"tensor<{h_p}x64xbf16, #blocked> -> !ttg.memdesc<{h_p}x64xbf16")
    assert len(re.findall(r"#linear\d*> -> tensor<64x64xbf16, #ttg\.dot_op<\{opIdx = 0", ir)) >= 2


def test_the_option_is_checked():
    q = torch.zeros(2, 4, 128, dtype=torch.bfloat16)
    win = torch.zeros(8, 132, dtype=torch.uint8)
    comp = torch.zeros(8, 72, dtype=torch.uint8)
    sel = torch.zeros(2, 16, dtype=torch.int32)
    with pytest.raises(ValueError, match="gluon_logits = 1; allowed: True, False or a dict"):
        sparse_attn_split(q, win, comp, sel, 8, torch.zeros(4), 0.1, **dict(BATCH_TUNE, gluon_logits=1))
    assert not LG.logits_gluon_ok(q, win, comp), "the CPU: the Triton kernel's (the interpreter's) path"
