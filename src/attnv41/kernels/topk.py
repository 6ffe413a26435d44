"""Fixed-width position top-k on the device (attention-v41.md §6.6): `topk_fixed`, a Triton
radix select over 16-bit score keys. Not wired into the runtime.

Twin: `kernels.select.topk_fixed` (torch, packed int64 keys), itself equal to
`reference.indexer.topk_select`. Same contract, same result bit for bit.

One program per row, three passes over the row's Lb scores, tile by tile:
  1. a histogram of the key's high byte → the high byte B of the k-th key;
  2. a histogram of the low byte among keys with high byte B → the k-th key T, and
     `need`, how many keys equal to T are taken (the rest of the budget);
  3. in position order, take keys > T, and keys == T while fewer than `need` of them
     have been seen (so the lowest positions win ties), compacted in that order, which
     is ascending: the output needs no sort, and the −1 / offset rule is applied on store.
No atomics, no host values depending on the scores: deterministic and capturable.
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON, require_triton, tl, triton
from .select import _MAX_LB, _check_int, _check_out, _check_scores_visible

__all__ = ["topk_fixed"]

_BLOCK = 1024  # positions per tile


def topk_fixed(scores: torch.Tensor, visible: torch.Tensor, k: int, offset: int, out: torch.Tensor) -> torch.Tensor:
    """Same contract as `kernels.select.topk_fixed`: scores bf16 `[m, Lb]`, visible
    int32/int64 `[m]`, 1 ≤ k ≤ Lb, out int32 `[m, k]` (any strides) written and returned;
    equal to `reference.indexer.topk_select(scores, visible, k, offset)`."""
    m, Lb = _check_scores_visible("topk_fixed", scores, visible)
    _check_int("topk_fixed: k", k, 1, Lb)
    _check_int("topk_fixed: offset", offset, 0, _MAX_LB - (Lb - 1))
    _check_out("topk_fixed", out, torch.int32, (m, k), scores.device)
    require_triton("topk_fixed", scores, visible, out)
    if m == 0:
        return out
    _topk_kernel[(m,)](
        scores.view(torch.int16),
        visible,
        out,
        Lb,
        k,
        offset,
        scores.stride(0),
        scores.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK=_BLOCK,
        num_warps=8,
    )
    return out


if HAVE_TRITON:

    @triton.jit
    def _order_key(bits16):
        """int32 order keys 0 … 2¹⁶−1 of bf16 bit patterns (as `select.score_order_key`):
        −0 → +0, every NaN → 0x7FC0 (above +∞), negatives flip all bits, others set the sign bit."""
        b = bits16.to(tl.int32) & 0xFFFF
        b = tl.where(b == 0x8000, 0, b)
        b = tl.where((b & 0x7FFF) > 0x7F80, 0x7FC0, b)
        return tl.where(b >= 0x8000, b ^ 0xFFFF, b | 0x8000)

    @triton.jit
    def _byte_threshold(hist, want):
        """Over a 256-bin histogram: the largest byte b with count(byte ≥ b) ≥ want (≥ 1,
        and ≤ the total), and count(byte > b)."""
        # [256] byte value
        byte = tl.arange(0, 256)
        total = tl.sum(hist, 0)
        ge = total - tl.cumsum(hist, 0) + hist
        b = tl.max(tl.where(ge >= want, byte, -1), 0)
        above = tl.sum(tl.where(byte > b, hist, 0), 0)
        return b, above

    @triton.jit
    def _topk_kernel(
        bits_ptr,
        vis_ptr,
        out_ptr,
        Lb,
        k,
        offset,
        s_row,
        s_col,
        s_out_row,
        s_out_col,
        BLOCK: tl.constexpr,
    ):
        # program t: row t of the scores and of out. The tile loops are `while` loops: a
        # runtime bound, and Triton's interpreter cannot take a scalar argument as a range bound.
        t = tl.program_id(0).to(tl.int64)
        row = bits_ptr + t * s_row
        # [BLOCK] position within a tile
        lane = tl.arange(0, BLOCK)

        # pass 1: high-byte histogram of all Lb keys
        hist = tl.zeros([256], dtype=tl.int32)
        start = 0
        while start < Lb:
            pos = start + lane
            ok = pos < Lb
            key = _order_key(tl.load(row + pos.to(tl.int64) * s_col, mask=ok, other=0))
            hist += tl.histogram(tl.where(ok, key >> 8, 0), 256, mask=ok)
            start += BLOCK
        hi, n_above_hi = _byte_threshold(hist, k)

        # pass 2: low-byte histogram of the keys whose high byte is hi
        hist = tl.zeros([256], dtype=tl.int32)
        start = 0
        while start < Lb:
            pos = start + lane
            ok = pos < Lb
            key = _order_key(tl.load(row + pos.to(tl.int64) * s_col, mask=ok, other=0))
            in_hi = ok & ((key >> 8) == hi)
            hist += tl.histogram(tl.where(in_hi, key & 0xFF, 0), 256, mask=in_hi)
            start += BLOCK
        lo, n_above_lo = _byte_threshold(hist, k - n_above_hi)
        thresh = hi * 256 + lo
        need = k - n_above_hi - n_above_lo  # keys == thresh to take, lowest positions first (≥ 1)

        # pass 3: in-order compaction; positions ascend, so the output is sorted as it is written
        vis = tl.load(vis_ptr + t).to(tl.int64)
        n_eq = 0  # keys == thresh seen in earlier tiles
        n_taken = 0  # outputs written by earlier tiles
        start = 0
        while start < Lb:
            pos = start + lane
            ok = pos < Lb
            key = _order_key(tl.load(row + pos.to(tl.int64) * s_col, mask=ok, other=0))
            eq = (ok & (key == thresh)).to(tl.int32)
            eq_rank = n_eq + tl.cumsum(eq, 0) - eq
            take = ((ok & (key > thresh)) | ((eq != 0) & (eq_rank < need))).to(tl.int32)
            slot = n_taken + tl.cumsum(take, 0) - take
            pos64 = pos.to(tl.int64)
            val = tl.where(pos64 >= vis, -1, pos64 + offset).to(tl.int32)
            tl.store(out_ptr + t * s_out_row + slot.to(tl.int64) * s_out_col, val, mask=take != 0)
            n_eq += tl.sum(eq, 0)
            n_taken += tl.sum(take, 0)
            start += BLOCK
