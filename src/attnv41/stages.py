"""Stage-wise strict checks of the runtime against the reference, on the runtime's own inputs.

A comparison of whole stacks (runtime vs reference, `compare.TraceRecorder`) has to
excuse values: an input one bf16 ulp away upstream can move an fp8/fp4 quantization
step or swap a top-k tie, and everything downstream of it then differs by more than a
bf16 rounding. Here each stage is checked alone, on what the runtime itself computed:

- `o`: the reference sparse attention (`reference/sparse_attn.py`) run on OUR q, OUR
  attended rows (`rows_win[:offset]`, then `rows_comp`) and OUR selection `idx`;
- `out`: the reference output projection (inverse RoPE, grouped `wo_a`, `wo_b`, as
  `reference/layer.py` §8) run on OUR o.

Both go through `testing.compare_bf16` at its default tolerance (max|ref|·2^-7 + 1e-4)
with nothing excused: every value of every call is compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .config import AttnV41Cfg
from .reference.fp8 import dequant_weight
from .reference.layer import RefTables
from .reference.norm import linear
from .reference.rope import apply_rope
from .reference.sparse_attn import sparse_attn
from .testing import Cmp, compare_bf16

__all__ = ["STAGES", "StageChecker", "StageTally", "output_projection"]

STAGES = ("o", "out")


def output_projection(
    cfg: AttnV41Cfg,
    w: Mapping[str, torch.Tensor],
    o: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """§8 as the reference computes it (`reference/layer.py`, bit for bit): inverse RoPE
    of o (bf16 `[m, H, D]`), the grouped low-rank `wo_a` in fp64 rounded to bf16, then
    `wo_b` through `reference.norm.linear`. Returns bf16 `[m, dim]`."""
    m, G = o.shape[0], cfg.groups
    o_rot = apply_rope(o, cos, sin, positions, inverse=True)
    og = o_rot.reshape(m, G, cfg.group_width).double()
    wo_a = w["wo_a.weight"]
    if w.get("wo_a.scale") is not None:  # the checkpoint's FP8 bytes: their exact bf16
        wo_a = dequant_weight(wo_a, w["wo_a.scale"], name="wo_a.weight")
    wo_a = wo_a.double().view(G, cfg.o_rank, cfg.group_width)
    u = torch.einsum("mgk,grk->mgr", og, wo_a).to(torch.bfloat16).reshape(m, G * cfg.o_rank)
    return linear(u, w["wo_b.weight"])


@dataclass
class StageTally:
    """Totals over many layer calls: values compared and excused, worst |err|/tol per
    stage, and the failed comparisons (where, what)."""

    calls: int = 0
    values: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    excused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    worst: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    failures: list[str] = field(default_factory=list)

    def add(self, where: str, cmps: list[tuple[Cmp, int]]) -> None:
        """One call's comparisons, each with the number of values it compared."""
        self.calls += 1
        for c, n in cmps:
            self.values[c.name] += n
            self.excused[c.name] += c.excused
            self.worst[c.name] = max(self.worst[c.name], c.ratio)
            if not c.ok:
                self.failures.append(f"{where}: {c}")

    @property
    def ok(self) -> bool:
        return not self.failures and self.calls > 0

    def summary(self) -> dict:
        return {
            "calls": self.calls,
            "compared": dict(self.values),
            "excused": dict(self.excused),
            "worst": dict(self.worst),
            "failures": self.failures[:20],
        }


class StageChecker:
    """Checks one runtime layer call (`AttnV41Run`) stage by stage; see the module
    docstring. Holds the reference RoPE tables for `cfg` on `device` (the device the
    runs live on; the reference computes there)."""

    def __init__(self, cfg: AttnV41Cfg, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.tables = RefTables.build(cfg, device)
        self.tally = StageTally()

    def reference_o(self, w: Mapping[str, torch.Tensor], run) -> torch.Tensor:
        """The reference sparse attention on the run's q, rows and selection."""
        D = self.cfg.head_dim
        rows = torch.cat([run.rows_win[: run.offset], run.rows_comp.to(run.rows_win.dtype)])
        if rows.shape[0] == 0:
            rows = run.rows_win.new_zeros(1, D)  # no row at all: every entry is −1
        return sparse_attn(run.q, rows, run.idx, w["attn_sink"].float(), D**-0.5)

    def reference_out(self, layer: int, w: Mapping[str, torch.Tensor], o: torch.Tensor, start_pos: int) -> torch.Tensor:
        """The reference output projection of `o` at positions start_pos … start_pos+m−1."""
        cos, sin = self.tables.for_ratio(self.cfg.roles[layer].ratio)
        positions = torch.arange(start_pos, start_pos + o.shape[0], device=o.device)
        return output_projection(self.cfg, w, o, cos, sin, positions)

    def check(self, layer: int, w: Mapping[str, torch.Tensor], run, start_pos: int) -> list[Cmp]:
        """Compare the run's `o` and `out` with the reference stages on its own inputs;
        adds them to `tally` and returns them. Call it before the next `forward` (the
        run's tensors are workspace views)."""
        m, H, D = run.q.shape
        ref_o = self.reference_o(w, run)
        ref_out = self.reference_out(layer, w, run.o, start_pos)
        cmps = [
            (compare_bf16("o", run.o, ref_o), m * H * D),
            (compare_bf16("out", run.out, ref_out), run.out.numel()),
        ]
        where = ("prefill" if start_pos == 0 else f"decode{start_pos}") + f" L{layer}"
        self.tally.add(where, cmps)
        return [c for c, _ in cmps]
