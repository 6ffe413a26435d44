"""The decode plan's metadata kernel (`kernels.plan_meta.derive`) against its twin
(`DecodePlan.derive_torch`): equal integers and flags in every buffer, at positions around
the window and the compression groups (the interpreter on CPU, the GPU with CUDA)."""

from __future__ import annotations

import pytest
import torch

from attnv41.config import v41_flash
from attnv41.kernels import plan_meta
from attnv41.runtime.plan import DecodePlan

POSITIONS = [0, 1, 2, 3, 4, 126, 127, 128, 129, 255, 1000, 4095, 131071]


@pytest.mark.parametrize("p", POSITIONS)
def test_derive_equals_the_torch_ops(p, device):
    cfg = v41_flash(max_tokens=256, max_seq=131072 + 64)
    twin = DecodePlan(cfg, "cpu")
    twin.pos.fill_(p)
    twin.derive_torch()
    plan = DecodePlan(cfg, device)
    for t in plan.tensors().values():  # poison what the kernel must write
        t.fill_(7) if t.dtype != torch.bool else t.fill_(True)
    plan.pos.fill_(p)
    plan_meta.derive(plan.pos, plan._rs, plan._meta, plan._done, plan.sel0, plan.sel)
    want = twin.tensors()
    for name in ("meta", "done", "sel0"):
        assert torch.equal(plan.tensors()[name].cpu(), want[name]), f"{name} at p = {p}"
    W = cfg.window
    assert torch.equal(plan.sel[:, :, :W].cpu(), want["sel"][:, :, :W]), f"sel[:, :, :W] at p = {p}"
    assert (plan.sel[:, :, W:] == 7).all(), "the top-k columns are not the kernel's to write"
