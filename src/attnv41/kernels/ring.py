"""Window ring update on the device (attention-v41.md §4.4): `ring_write` (Triton) and
`ring_write_torch`.

Twin: the ring update in `attnv41.reference.layer.layer_forward`,
`st.ring[positions[m - keep:] % W] = kv[m - keep:]` with `keep = min(m, W)`.
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON, pdl_launch, require_triton, tl, triton

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait

__all__ = ["slot_write", "slot_write_torch", "ring_write", "ring_write_torch"]

_INT = (torch.int32, torch.int64)


def _check(ring, rows, pos) -> None:
    for name, t in (("ring", ring), ("rows", rows)):
        if t.dtype != torch.bfloat16:
            raise ValueError(f"{name}.dtype = {t.dtype}; allowed: torch.bfloat16")
        if t.dim() != 2:
            raise ValueError(f"{name}.dim() = {t.dim()} (shape {tuple(t.shape)}); allowed: 2")
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{name}.stride(1) = {t.stride(1)}; allowed: 1 (rows contiguous)")
    if ring.shape[0] < 1:
        raise ValueError(f"ring.shape[0] (window) = {ring.shape[0]}; allowed: >= 1")
    if rows.shape[1] != ring.shape[1]:
        raise ValueError(f"rows.shape[1] = {rows.shape[1]}; allowed: ring.shape[1] = {ring.shape[1]}")
    if rows.device != ring.device:
        raise ValueError(f"rows.device = {rows.device}; allowed: ring.device = {ring.device}")
    if pos.dtype not in _INT:
        raise ValueError(f"pos.dtype = {pos.dtype}; allowed: torch.int32 or torch.int64")
    if tuple(pos.shape) != (rows.shape[0],):
        raise ValueError(f"pos.shape = {tuple(pos.shape)}; allowed: [m] = [{rows.shape[0]}]")
    if pos.device != ring.device:
        raise ValueError(f"pos.device = {pos.device}; allowed: ring.device = {ring.device}")


def ring_write_torch(ring: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Fallback of `ring_write` (same contract), the reference's indexed assignment."""
    _check(ring, rows, pos)
    m, window = rows.shape[0], ring.shape[0]
    keep = min(m, window)
    if keep:
        ring[pos[m - keep :].long() % window] = rows[m - keep :]
    return ring


def ring_write(ring: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Write row i of `rows` into ring slot `pos[i] % window`, for the last `min(m, window)` rows.

    ring: bf16 `[window, D]`, updated in place and returned; rows: bf16 `[m, D]`;
    pos: int32/int64 `[m]` on the ring's device, the position of each row, ≥ 0 (not
    checked: that would need a host sync). Earlier rows would be overwritten anyway;
    writing only the last `min(m, window)` makes the result independent of write order
    provided those rows' positions are distinct modulo `window` (consecutive positions
    are). An exact copy; slots not written keep their contents. No host
    synchronisation: capturable in a CUDA graph.
    """
    _check(ring, rows, pos)
    require_triton("ring_write", ring, rows, pos)
    m, D = rows.shape
    window = ring.shape[0]
    keep = min(m, window)
    if keep == 0 or D == 0:
        return ring
    block_d = min(triton.next_power_of_2(D), 1024)
    grid = (keep, triton.cdiv(D, block_d))
    _ring_write_kernel[grid](
        ring,
        rows,
        pos,
        m - keep,
        window,
        D,
        ring.stride(0),
        rows.stride(0),
        BLOCK_D=block_d,
        **pdl_launch(rows),
    )
    return ring


def _check_slots(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
    if cache.dim() != 2 or rows.dim() != 2 or rows.shape[1] != cache.shape[1]:
        raise ValueError(
            f"cache {tuple(cache.shape)}, rows {tuple(rows.shape)}; allowed: [N, D] and [m, D] with the same D"
        )
    if rows.dtype != cache.dtype or rows.device != cache.device:
        raise ValueError(
            f"rows {rows.dtype} on {rows.device}; allowed: the cache's dtype and device ({cache.dtype}, {cache.device})"
        )
    if cache.stride(1) != 1 or rows.stride(1) != 1:
        raise ValueError("cache and rows: allowed: contiguous rows (stride(1) = 1)")
    if slots.dtype not in (torch.int32, torch.int64) or tuple(slots.shape) != (rows.shape[0],):
        raise ValueError(f"slot_mapping = {slots.dtype} {tuple(slots.shape)}; allowed: int32/int64 [{rows.shape[0]}]")
    if slots.device != cache.device:
        raise ValueError(f"slot_mapping.device = {slots.device}; allowed: {cache.device}")


def slot_write(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """`cache[slots[i]] = rows[i]` for every i with `slots[i] >= 0` (−1: the token writes
    nothing, e.g. padding); the slots ≥ 0 must be distinct and < N (not checked: a host
    sync). An exact copy, any dtype; returns the cache. No host synchronisation."""
    _check_slots(cache, rows, slots)
    require_triton("slot_write", cache, rows, slots)
    m, D = rows.shape
    if m == 0 or D == 0:
        return cache
    block_d = min(triton.next_power_of_2(D), 1024)
    _slot_write_kernel[(m, triton.cdiv(D, block_d))](
        cache, rows, slots, D, cache.stride(0), rows.stride(0), BLOCK_D=block_d, **pdl_launch(rows)
    )
    return cache


def slot_write_torch(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Twin of `slot_write` (same contract; synchronises on CUDA: a boolean mask)."""
    _check_slots(cache, rows, slots)
    keep = slots >= 0
    cache.index_copy_(0, slots[keep].long(), rows[keep])
    return cache


if HAVE_TRITON:

    @triton.jit
    def _slot_write_kernel(
        cache_ptr, rows_ptr, slot_ptr, D, s_cache, s_rows, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # program (i, db): row i, channels db·BLOCK_D … +BLOCK_D−1; nothing for slot −1
        i = tl.program_id(0).to(tl.int64)
        db = tl.program_id(1)
        slot = tl.load(slot_ptr + i).to(tl.int64)
        d = (db * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
        ok = (d < D) & (slot >= 0)
        v = tl.load(rows_ptr + i * s_rows + d, mask=ok, other=0.0)
        tl.store(cache_ptr + slot * s_cache + d, v, mask=ok)

    @triton.jit
    def _ring_write_kernel(
        ring_ptr,
        rows_ptr,
        pos_ptr,
        first,
        window,
        D,
        s_ring,
        s_rows,
        BLOCK_D: tl.constexpr,
        PDL: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # program (i, db): row first + i, channels db·BLOCK_D … +BLOCK_D−1
        i = tl.program_id(0).to(tl.int64) + first
        db = tl.program_id(1)
        p = tl.load(pos_ptr + i).to(tl.int64)
        slot = p % window
        # [BLOCK_D] channel d
        d = db * BLOCK_D + tl.arange(0, BLOCK_D)
        ok = d < D
        d64 = d.to(tl.int64)
        v = tl.load(rows_ptr + i * s_rows + d64, mask=ok, other=0.0)
        tl.store(ring_ptr + slot * s_ring + d64, v, mask=ok)
