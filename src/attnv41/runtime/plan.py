"""The decode plan: a single-token step's metadata on the device, derived from one
device position, so a whole 40-layer step runs without a host decision that depends
on the position (and can be captured into one CUDA graph).

`DecodePlan` owns (or takes from the caller) the buffers the decode kernels read:

pos:       int32 `[B]`, the position of each row's token (B = 1: one sequence today;
           the kernels read per-row metadata, so a batch is a larger grid).
meta[r]:   int64 `[5, B]` per compress ratio r of the config: `vis` = ⌊(p+1)/r⌋ (visible
           compressed rows), `row` = ⌊p/r⌋ (the cache row of the group p belongs to: the
           group's in-progress row, complete when p+1 is a multiple of r), `row_pos` =
           row·r (its RoPE position), `slot` = p mod r (the compressor slot of p), `done`
           (1 when the group completes at p).
done[r]:   bool `[B, 1, 1]`, the same completion flag as a mask.
sel0:      int32 `[B, window]`, the selection of ratio-0 layers (the window ring, oldest
           first, −1 for slots never written).
sel:       int32 `[n_index_sources, B, window + index_topk]`: per index source, the window
           part, then its top-k (ascending, offset by `window`, −1 where not visible).
           Layers of ratio > 0 attend with the row of the latest index source at or before
           them (static wiring, `DecodePlan.sel_slot`).
cand:      bool `[B, max_rows]`, the candidate source's block mask (over the bucket's rows).
scores:    bf16 `[n_index_sources, B, max_rows]`: per index source, its scores over the
           bucket's rows (−∞ past the visible ones; masked by the candidates on reindex
           layers).

`derive()` recomputes everything from `pos` with device ops (capturable). The host only
advances the position: `set_pos(p)` writes it when it differs from what the buffer holds,
and a captured whole step ends with `pos += 1` on the device.

Context buckets: index sources score `Lb_r = bucket(p) // r` keys, `bucket(p)` the next
power of two ≥ max(p + 1, bucket_min), capped at max_seq. Keys past the visible count are
masked (and not read), so a score's bits do not depend on the bucket; the bucket only
bounds the work and is the unit a whole-step graph is captured for.
"""

from __future__ import annotations

import torch

from ..config import AttnV41Cfg
from ..kernels import plan_meta

__all__ = ["DecodePlan", "bucket_of", "DEFAULT_BUCKET_MIN"]

DEFAULT_BUCKET_MIN = 1024

VIS, ROW, ROW_POS, SLOT, DONE = range(5)


def bucket_of(p: int, max_seq: int, bucket_min: int = DEFAULT_BUCKET_MIN) -> int:
    """The context bucket of a decode step at position p: the next power of two ≥
    max(p + 1, bucket_min), capped at max_seq."""
    need = max(p + 1, bucket_min)
    return min(1 << (need - 1).bit_length(), max_seq)


class DecodePlan:
    """Device metadata of a single-token decode step (see the module docstring)."""

    def __init__(
        self,
        cfg: AttnV41Cfg,
        device: torch.device | str,
        bucket_min: int = DEFAULT_BUCKET_MIN,
        pos: torch.Tensor | None = None,
    ):
        """`pos`: optionally the caller's own int32 `[1]` position buffer on `device` (an
        engine's), which the plan then reads and advances; the other buffers are built here."""
        if isinstance(bucket_min, bool) or not isinstance(bucket_min, int) or bucket_min < 1:
            raise ValueError(f"bucket_min = {bucket_min!r}; allowed: an int >= 1")
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if pos is not None and (
            not isinstance(pos, torch.Tensor)
            or pos.dtype != torch.int32
            or tuple(pos.shape) != (1,)
            or pos.device != dev
        ):
            got = f"{pos.dtype} {tuple(pos.shape)} on {pos.device}" if isinstance(pos, torch.Tensor) else repr(pos)
            raise ValueError(f"pos = {got}; allowed: None or an int32 [1] tensor on {dev}")
        c = cfg
        self.cfg = cfg
        self.device = dev
        self.bucket_min = bucket_min
        B = 1
        self.ratios = tuple(sorted({r for r in c.compress_ratios if r > 0}))
        self.pos = torch.zeros(B, dtype=torch.int32, device=dev) if pos is None else pos
        self._rs = torch.tensor(self.ratios, dtype=torch.int64, device=dev).view(-1, 1)
        self._meta = torch.zeros(len(self.ratios), 5, B, dtype=torch.int64, device=dev)
        self._done = torch.zeros(len(self.ratios), B, 1, 1, dtype=torch.bool, device=dev)
        self.meta = {r: self._meta[k] for k, r in enumerate(self.ratios)}
        self.done = {r: self._done[k] for k, r in enumerate(self.ratios)}
        W = c.window
        self._win_iota = torch.arange(1, W + 1, dtype=torch.int32, device=dev)
        self._minus1 = torch.full((), -1, dtype=torch.int32, device=dev)
        self.sel0 = torch.full((B, W), -1, dtype=torch.int32, device=dev)
        self.index_sources = tuple(c.index_source_layers)
        self._slot = {
            i: self.index_sources.index(c.index_source_of(i)) for i in range(c.n_layers) if c.compress_ratios[i] > 0
        }
        n_ix = max(len(self.index_sources), 1)
        self.sel = torch.full((n_ix, B, W + c.index_topk), -1, dtype=torch.int32, device=dev)
        self.max_rows = max((c.max_seq // r for r in self.ratios), default=0)
        self.cand = torch.zeros(B, self.max_rows, dtype=torch.bool, device=dev)
        # the kept blocks ascending, with the mask when reindex layers score their candidates only (runtime/ops.compacts)
        self.cand_ids = torch.zeros(B, c.cand_blocks, dtype=torch.int32, device=dev)
        self.scores = torch.zeros(n_ix, B, self.max_rows, dtype=torch.bfloat16, device=dev)
        self.pos_at: int | None = 0 if pos is None else None  # what `pos` holds (host view); None: unknown
        self.derived_at: int | None = None  # the position the metadata was derived for
        # Which sequence's decode step wrote each buffer that later layers of that step read
        # (("sel", row): an index source's selection; ("cand", 0): the candidate mask), as
        # (weakref to its SharedV41, its seq_id, the position): `AttnV41` refuses another
        # sequence's write while a step in progress still has to read it.
        self.owners: dict[tuple[str, int], tuple] = {}

    # ------------------------------------------------------------------ wiring (static)
    def sel_slot(self, layer: int) -> int:
        """Which row of `sel` a ratio>0 layer attends with: its index source's (static
        wiring, `AttnV41Cfg.index_source_of`)."""
        return self._slot[layer]

    def sel_for(self, layer: int) -> torch.Tensor:
        """The selection `[B, window (+ index_topk)]` layer `layer` attends with."""
        if self.cfg.compress_ratios[layer] == 0:
            return self.sel0
        return self.sel[self.sel_slot(layer)]

    def bucket(self, p: int) -> int:
        return bucket_of(p, self.cfg.max_seq, self.bucket_min)

    # ------------------------------------------------------------------ device work
    def derive(self) -> None:
        """Every metadata buffer from `pos` (device ops only; capturable): one Triton
        kernel on CUDA (`kernels.plan_meta`, the same integers), `derive_torch` elsewhere."""
        if self.pos.is_cuda and self.ratios:
            plan_meta.derive(self.pos, self._rs, self._meta, self._done, self.sel0, self.sel)
            self.derived_at = self.pos_at
            return
        self.derive_torch()

    def derive_torch(self) -> None:
        """`derive` in torch ops (the CPU path; the kernel's twin)."""
        W = self.cfg.window
        p = self.pos.to(torch.int64).view(1, -1)  # [1, B]
        rs = self._rs  # [R, 1]
        meta = self._meta
        if self.ratios:  # a geometry of window-only layers has no compressed rows to describe
            torch.floor_divide(p + 1, rs, out=meta[:, VIS])
            torch.floor_divide(p, rs, out=meta[:, ROW])
            torch.mul(meta[:, ROW], rs, out=meta[:, ROW_POS])
            torch.remainder(p, rs, out=meta[:, SLOT])
            torch.eq(torch.remainder(p + 1, rs), 0, out=self._done.view(len(self.ratios), -1))
            meta[:, DONE].copy_(self._done.view(len(self.ratios), -1))
        # window: slots (p%W)+1 … W−1, 0 … p%W; −1 for slots never written (slot > p)
        p32 = self.pos.view(-1, 1)
        slots = torch.remainder(self._win_iota.view(1, -1) + p32, W)
        torch.where(slots <= p32, slots, self._minus1, out=self.sel0)
        self.sel[:, :, :W].copy_(self.sel0.unsqueeze(0).expand(self.sel.shape[0], -1, -1))
        self.derived_at = self.pos_at

    def set_pos(self, p: int, derive: bool = True) -> None:
        """Make the device position `p` and (with `derive`) the metadata derived from it
        (host: no sync; each part only when it differs from what the buffers hold)."""
        if self.pos_at != p:
            self.pos.fill_(p)
            self.pos_at = p
        if derive and self.derived_at != p:
            self.derive()

    def invalidate(self) -> None:
        """Forget what the buffers hold (the next `set_pos` writes them again)."""
        self.pos_at = None
        self.derived_at = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every buffer by name (snapshots in tests and the graph oracle)."""
        return {
            "pos": self.pos,
            "meta": self._meta,
            "done": self._done,
            "sel0": self.sel0,
            "sel": self.sel,
            "cand": self.cand,
            "cand_ids": self.cand_ids,
            "scores": self.scores,
        }
