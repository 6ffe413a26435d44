"""A batched step's attention selection in one launch (runtime/batch.py): `paged_selection`
(Triton) and `paged_selection_torch`.

For token t and column c of `out` (`[T, W + K]` int32):
- c < width[t]: `win_sel[t, c]` (its window rows in the ring tensor, −1 absent);
- width[t] ≤ c < width[t] + K: the compressed row j = `logical[t, c − width[t]]`: −1 when
  j < 0, else its physical pool row `table[slot[t], j // B]·B + j % B` plus `base` (the
  pool's rows follow the ring tensor's in the attention's row space);
- past that: −1.
An index copy: exact, the same bytes on every device. No host sync: capturable.
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON, pdl_launch, require_triton, tl, triton

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait

__all__ = ["paged_selection", "paged_selection_torch"]


def _check(win_sel, width, logical, table, slot, out) -> tuple[int, int, int]:
    T, W = win_sel.shape
    K = logical.shape[1]
    for name, t, shape in (
        ("win_sel", win_sel, (T, W)),
        ("logical", logical, (T, K)),
        ("out", out, (T, W + K)),
    ):
        if t.dtype != torch.int32 or tuple(t.shape) != shape:
            raise ValueError(f"{name}: {tuple(t.shape)} {t.dtype}; allowed: {shape} torch.int32")
    for name, t in (("width", width), ("slot", slot)):
        if tuple(t.shape) != (T,) or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name}: {tuple(t.shape)} {t.dtype}; allowed: [{T}] int32 or int64")
    if table.dtype != torch.int32 or table.dim() != 2:
        raise ValueError(f"table: {tuple(table.shape)} {table.dtype}; allowed: 2-D torch.int32")
    return T, W, K


def paged_selection_torch(win_sel, width, logical, table, slot, block_rows: int, base: int, out):
    """The twin (module doc); returns out."""
    T, W, K = _check(win_sel, width, logical, table, slot, out)
    dev = out.device
    j = logical.long()
    jj = j.clamp_min(0)
    blk = table[slot.long()[:, None].expand_as(jj), jj // block_rows].long()
    phys = torch.where(j >= 0, blk * block_rows + jj % block_rows + base, -1)
    col = torch.arange(W + K, device=dev)[None, :] - width.long()[:, None]
    comp = torch.gather(phys, 1, col.clamp(0, K - 1)) if K else torch.full_like(col, -1)
    win = torch.cat([win_sel.long(), torch.full((T, K), -1, dtype=torch.int64, device=dev)], 1)
    got = torch.where(col < 0, win, torch.where(col < K, comp, -1))
    return out.copy_(got)


if HAVE_TRITON:

    @triton.jit
    def _paged_sel_kernel(
        win_sel, width, logical, table, slot, out, W, K, B, base, s_tab, BLOCK: tl.constexpr, PDL: tl.constexpr = False
    ):  # fmt: skip
        pdl_release(PDL)
        pdl_wait(PDL)
        t = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BLOCK)
        ww = tl.load(width + t).to(tl.int32)
        sl = tl.load(slot + t).to(tl.int64)
        in_win = c < ww
        kc = c - ww
        in_comp = (kc >= 0) & (kc < K)
        wv = tl.load(win_sel + t * W + c, mask=in_win & (c < W), other=-1)
        j = tl.load(logical + t * K + kc, mask=in_comp, other=-1)
        ok = in_comp & (j >= 0)
        jj = tl.where(ok, j, 0)
        blk = tl.load(table + sl * s_tab + jj // B, mask=ok, other=0)
        phys = blk.to(tl.int64) * B + jj % B + base
        v = tl.where(in_win, wv, tl.where(ok, phys.to(tl.int32), -1))
        tl.store(out + t * (W + K) + c, v, mask=c < W + K)


def paged_selection(win_sel, width, logical, table, slot, block_rows: int, base: int, out):
    """The module doc's selection in one launch (one program per token); returns out."""
    T, W, K = _check(win_sel, width, logical, table, slot, out)
    require_triton("paged_selection", win_sel, logical, table, out)
    for name, t in (("win_sel", win_sel), ("logical", logical), ("out", out)):
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous; allowed: a contiguous tensor")
    if table.stride(1) != 1:
        raise ValueError("table.stride(1) != 1; allowed: rows contiguous")
    _paged_sel_kernel[(T,)](
        win_sel, width, logical, table, slot, out, W, K, block_rows, base, table.stride(0),
        BLOCK=triton.next_power_of_2(W + K), num_warps=4, **pdl_launch(win_sel),
    )  # fmt: skip
    return out
