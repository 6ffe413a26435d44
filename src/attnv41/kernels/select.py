"""Selections on the device, without host synchronisation: the window part, the
candidate mask and the position top-k (attention-v41.md §4.5, §6.5, §6.6).

Torch operations that run on any device and never read a value back to the host (no
boolean indexing, no `.item()`), so a CUDA caller is not stalled. The candidate mask
and the top-k are the reference's own functions, which are written sync-free; the
window selection is built here into a caller-owned buffer. A Triton top-k for long
contexts is later work.
"""

from __future__ import annotations

import torch

from ..reference import indexer as ref

candidate_mask = ref.candidate_mask  # sync-free as written: boolean indexing avoided on purpose

__all__ = ["window_selection", "candidate_mask", "topk_select", "topk_fixed", "candidate_mask_fixed"]


def window_selection(out: torch.Tensor, m: int, start_pos: int, window: int) -> torch.Tensor:
    """Write the window part of the selection into `out[:m, :width]` (int32) and return it.

    Prefill from 0 (width `min(m, window)`): row t holds chunk rows `max(0, t−W+1) …`,
    −1 past t. Decode at p (width `window`): the ring slots oldest first,
    `(p%W)+1 … W−1, 0 … p%W`, −1 for slots never written (slot > p).
    """
    dev = out.device
    if start_pos == 0:
        width = min(m, window)
        t = torch.arange(m, device=dev, dtype=torch.int32)[:, None]
        idx = (t - window + 1).clamp_min(0) + torch.arange(width, device=dev, dtype=torch.int32)[None, :]
        res = torch.where(idx <= t, idx, torch.full_like(idx, -1))
    else:
        width = window
        slots = (torch.arange(window, device=dev, dtype=torch.int32) + (start_pos % window) + 1) % window
        res = torch.where(slots <= start_pos, slots, torch.full_like(slots, -1))[None, :]
    view = out[:m, :width]
    view.copy_(res)
    return view


def topk_select(scores: torch.Tensor, visible: torch.Tensor, k: int, offset: int, out: torch.Tensor) -> torch.Tensor:
    """The reference top-k (sync-free already) written into `out[:m, :k]`; returns the view."""
    idx = ref.topk_select(scores, visible, k, offset)
    view = out[: idx.shape[0], :k]
    view.copy_(idx)
    return view


def topk_fixed(scores: torch.Tensor, visible: torch.Tensor, k: int, offset: int, out: torch.Tensor) -> torch.Tensor:
    """Top-k at a fixed width over `[m, Lb]` (placeholder: the reference's stable sort)."""
    out.copy_(ref.topk_select(scores, visible, k, offset))
    return out


def candidate_mask_fixed(scores, visible, cand_blocks: int, cand_block: int, out: torch.Tensor) -> torch.Tensor:
    """The candidate mask over `[m, Lb]` into `out` (placeholder: the reference)."""
    out.copy_(ref.candidate_mask(scores, visible, cand_blocks, cand_block))
    return out
