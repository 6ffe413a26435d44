"""Selections on the device, without host synchronisation: the window part, the
candidate mask and the position top-k (attention-v41.md §4.5, §6.5, §6.6).

Torch operations that run on any device and never read a value back to the host (no
boolean indexing, no `.item()`), so a CUDA caller is not stalled. The candidate mask
and the top-k are the reference's own functions, which are written sync-free; the
window selection is built here into a caller-owned buffer.

`topk_fixed` and `candidate_mask_fixed` are the fixed-width forms for a decode step
captured into a CUDA graph per context bucket: shapes set by the bucket width Lb, never
by the visible row count, and equal to the reference bit for bit (see the section below).
"""

from __future__ import annotations

import torch

from ..reference import indexer as ref

candidate_mask = ref.candidate_mask  # sync-free as written: boolean indexing avoided on purpose

__all__ = [
    "window_selection",
    "candidate_mask",
    "candidate_blocks",
    "candidate_mask_of_blocks",
    "topk_select",
    "topk_fixed",
    "candidate_mask_fixed",
    "score_order_key",
]


def window_selection(out: torch.Tensor, m: int, start_pos: int, window: int) -> torch.Tensor:
    """Write the window part of a selection into `out[:m, :width]` (int32) and return it.

    start_pos 0 (a prefill): row t holds chunk rows `max(0, t−W+1) …`, −1 past t, width
    `min(m, W)`. start_pos > 0 (a continuation of m tokens): the rows attended are the
    context `ctx` = positions `max(0, start_pos−W+1) … start_pos+m−1`; column c of the
    token at position p holds position `p−W+1+c` as an index into ctx, −1 where that is
    negative, width W: the decode layout (`reference.layer._window_selection`). A decode
    token's window part is derived on the device from its position (`DecodePlan.derive`)."""
    if start_pos < 0:
        raise ValueError(f"start_pos = {start_pos}; allowed: >= 0")
    dev = out.device
    if start_pos == 0:
        width = min(m, window)
        t = torch.arange(m, device=dev, dtype=torch.int32)[:, None]
        idx = (t - window + 1).clamp_min(0) + torch.arange(width, device=dev, dtype=torch.int32)[None, :]
        view = out[:m, :width]
        view.copy_(torch.where(idx <= t, idx, torch.full_like(idx, -1)))
        return view
    base = max(0, start_pos - window + 1)
    t = torch.arange(start_pos - window + 1, start_pos - window + 1 + m, device=dev, dtype=torch.int32)[:, None]
    q = t + torch.arange(window, device=dev, dtype=torch.int32)[None, :]
    view = out[:m, :window]
    view.copy_(torch.where(q >= 0, q - base, torch.full_like(q, -1)))
    return view


def candidate_blocks(
    scores: torch.Tensor, visible: torch.Tensor, cand_blocks: int, cand_block: int, out: torch.Tensor
) -> torch.Tensor:
    """The candidate mask in its compact form: the kept blocks of each row, int32
    `[m, min(cand_blocks, n_blocks)]` written into `out` (n_blocks = ⌈L / cand_block⌉),
    in the reference's order (score descending, lower block first among ties), a block
    that is not kept (it scores −∞) named n_blocks. `candidate_mask_of_blocks` expands it
    to `candidate_mask`'s bool `[m, L]` bit for bit. Its size does not grow with L past
    cand_blocks·cand_block positions: a prefill tiled over tokens keeps it for the whole
    call (runtime/attn.py) where the `[m, L]` mask would not fit."""
    m, L = scores.shape
    n_blocks = -(-L // cand_block)
    keep_n = min(cand_blocks, n_blocks)
    if tuple(out.shape) != (m, keep_n) or out.dtype != torch.int32:
        raise ValueError(f"out: {out.dtype} {tuple(out.shape)}; allowed: int32 ({m}, {keep_n})")
    _, order, kept = ref.candidate_block_order(scores, visible, cand_blocks, cand_block)
    out.copy_(torch.where(kept, order, torch.full_like(order, n_blocks)))
    return out


def candidate_mask_of_blocks(ids: torch.Tensor, L: int, cand_block: int) -> torch.Tensor:
    """bool `[m, L]`: the candidate mask of `candidate_blocks`' kept blocks."""
    m = ids.shape[0]
    n_blocks = -(-L // cand_block)
    kept = torch.zeros(m, n_blocks + 1, dtype=torch.bool, device=ids.device)
    kept.scatter_(1, ids.long(), True)  # column n_blocks collects the blocks not kept
    return kept[:, :n_blocks].repeat_interleave(cand_block, dim=1)[:, :L]


def topk_select(scores: torch.Tensor, visible: torch.Tensor, k: int, offset: int, out: torch.Tensor) -> torch.Tensor:
    """The reference top-k (sync-free already) written into `out[:m, :k]`; returns the view."""
    idx = ref.topk_select(scores, visible, k, offset)
    view = out[: idx.shape[0], :k]
    view.copy_(idx)
    return view


# ---------------------------------------------------------------------------------------
# Fixed-width selections for captured decode steps. The scores are laid out over a bucket
# length Lb ≥ L (entries past a token's visible rows are −∞), so neither the shapes nor any
# host value may depend on L: every op below has shapes fixed by (m, Lb, k, blocks), reads
# nothing back to the host and is deterministic. They equal the reference run on the same
# [m, Lb] scores bit for bit, and (for scores −∞ at j ≥ L ≥ visible) the reference run on
# scores[:, :L], padded (tests/kernels/test_select.py).
#
# The stable descending sort of the reference is replaced by a top-k over unique int64 keys:
# (order key of the bf16 score) · 2³² + (2³² − 1 − position). Unique keys make the top-k
# set unique whatever algorithm torch.topk uses, and a lower position wins among equal
# scores, as the stable sort's tie rule.
# ---------------------------------------------------------------------------------------

_POS_BITS = 32
_POS_MASK = (1 << _POS_BITS) - 1
_MAX_LB = 2**31 - 1  # positions must fit the int32 output (and the 32 position bits)
# Order keys (unsigned, 0 … 2¹⁶−1) of the values the rules below name.
_KEY_NEG_INF = 0x7F  # bf16 −∞ = 0xFF80, all bits flipped
_KEY_POS_INF = 0x7F80 | 0x8000  # bf16 +∞ = 0x7F80, sign bit set
_KEY_NAN = 0x7FC0 | 0x8000  # the one canonical NaN; above +∞, as torch.sort orders NaN


def score_order_key(scores: torch.Tensor) -> torch.Tensor:
    """int32 order keys in 0 … 2¹⁶−1 of bf16 scores, same shape: a ≤ b as keys exactly when
    torch.sort orders a ≤ b, so −0 and +0 get one key and every NaN (either sign, any
    payload) gets one key above +∞.

    Works on the bits: −0 → +0 (what `s + 0.0` does, but immune to a compiler folding the
    addition away), NaN → 0x7FC0, then the usual float → unsigned map: negative values
    flip all bits (larger magnitude, smaller key), non-negative ones set the sign bit.
    """
    bits = scores.view(torch.int16).to(torch.int32) & 0xFFFF  # raw bits as 0 … 2¹⁶−1
    bits = torch.where(bits == 0x8000, torch.zeros_like(bits), bits)  # −0 → +0
    bits = torch.where((bits & 0x7FFF) > 0x7F80, torch.full_like(bits, 0x7FC0), bits)  # NaN → canonical
    return torch.where(bits >= 0x8000, bits ^ 0xFFFF, bits | 0x8000)


def _packed_topk_positions(keys: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of int order keys `[m, n]` under the tie rule (lower column first): returns
    (columns int64 `[m, k]`, their keys int64 `[m, k]`), in no particular order."""
    n = keys.shape[-1]
    col = torch.arange(n, device=keys.device, dtype=torch.int64)
    packed = (keys.to(torch.int64) << _POS_BITS) | (_POS_MASK - col)
    top = torch.topk(packed, k, dim=-1, largest=True, sorted=False).values
    return _POS_MASK - (top & _POS_MASK), top >> _POS_BITS


def _check_int(name: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int; got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} = {value}; allowed: {lo}..{hi}")


def _check_scores_visible(fn: str, scores: torch.Tensor, visible: torch.Tensor) -> tuple[int, int]:
    """Host-only metadata checks shared by the fixed-width selections; returns (m, Lb)."""
    if scores.dtype != torch.bfloat16 or scores.dim() != 2:
        raise ValueError(f"{fn}: scores must be bf16 [m, Lb]; got {scores.dtype} of shape {tuple(scores.shape)}")
    m, Lb = scores.shape
    _check_int(f"{fn}: Lb (scores.shape[1])", Lb, 1, _MAX_LB)
    if visible.dtype not in (torch.int32, torch.int64) or tuple(visible.shape) != (m,):
        raise ValueError(
            f"{fn}: visible must be int32/int64 [m] = [{m}]; got {visible.dtype} of shape {tuple(visible.shape)}"
        )
    if visible.device != scores.device:
        raise ValueError(f"{fn}: visible is on {visible.device}, scores on {scores.device}; allowed: the same device")
    return m, Lb


def _check_out(fn: str, out: torch.Tensor, dtype: torch.dtype, shape: tuple[int, int], device: torch.device) -> None:
    if out.dtype != dtype or tuple(out.shape) != shape:
        raise ValueError(
            f"{fn}: out must be {dtype} of shape {list(shape)}; got {out.dtype} of shape {tuple(out.shape)}"
        )
    if out.device != device:
        raise ValueError(f"{fn}: out is on {out.device}, scores on {device}; allowed: the same device")


def check_gather_ids(fn: str, ids, cand_block, m: int, Lb: int, device: torch.device) -> None:
    """The gathered selections' `ids` / `cand_block` (`topk_fixed`'s doc), host checks only."""
    _check_int(f"{fn}: cand_block", cand_block, 1, _MAX_LB)
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int32 or ids.dim() != 2 or ids.shape[0] != m:
        got = f"{ids.dtype} of shape {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"{fn}: ids must be torch.int32 [m, blocks] with m = {m}; got {got}")
    if ids.shape[1] * cand_block != Lb:
        raise ValueError(
            f"{fn}: ids.shape[1] · cand_block = {ids.shape[1]} · {cand_block}; allowed: Lb = {Lb} (the gathered width)"
        )
    if ids.device != device:
        raise ValueError(f"{fn}: ids is on {ids.device}, scores on {device}; allowed: the same device")


def gathered_rows(ids: torch.Tensor, cand_block: int, entries: torch.Tensor) -> torch.Tensor:
    """int64, entries' shape: the row each entry (int, `[m, n]`) of a gathered form stands for,
    `ids[t, e // cand_block] · cand_block + e % cand_block`."""
    e = entries.long()
    return torch.gather(ids.long(), 1, e // cand_block) * cand_block + e % cand_block


def gathered_to_full(scores: torch.Tensor, ids: torch.Tensor, cand_block: int, width: int) -> torch.Tensor:
    """bf16 `[m, width]`: a gathered form's scores (`indexer.index_scores(ids=)`) at their
    positions, −∞ elsewhere: over a candidate source's kept blocks, the full scores with the
    candidate mask applied. For records and checks (not capturable: a boolean index)."""
    m, n = scores.shape
    rows = gathered_rows(ids, cand_block, torch.arange(n, device=scores.device).expand(m, n))
    full = torch.full((m, width + 1), float("-inf"), dtype=scores.dtype, device=scores.device)
    full.scatter_(1, rows.clamp(max=width), scores)  # rows past the width land in the spare column
    return full[:, :width]


def topk_fixed(
    scores: torch.Tensor,
    visible: torch.Tensor,
    k: int,
    offset: int,
    out: torch.Tensor,
    *,
    ids: torch.Tensor | None = None,
    cand_block: int = 0,
) -> torch.Tensor:
    """The compressed part of the selection at a fixed width: writes `out` and returns it.

    scores: bf16 `[m, Lb]`; visible: int32/int64 `[m]` (the `L_t`, any values: a row's
    positions `≥ visible[t]` become −1 whatever they score); 1 ≤ k ≤ Lb; out: int32
    `[m, k]`, any strides. Contract: `out` equals `reference.indexer.topk_select(scores,
    visible, k, offset)` exactly — the k best positions under (score descending, −0 = +0,
    NaN above +∞, lower position first among equals), ascending; positions `≥ visible[t]`
    → −1, the others + offset. For `visible[t] < k` the tail is −1 (the lowest-position
    −∞ entries fill it). Sync-free and CUDA-graph capturable; arguments are checked on
    host metadata only, before anything is written.

    ids, cand_block (a gathered form, `indexer.index_scores(ids=)`): int32 `[m, Lb /
    cand_block]`; entry e of row t stands for position `ids[t, e // cand_block] ·
    cand_block + e % cand_block`. The top-k runs over the entries as above (lower entry
    first among equals: the lower position where ids ascend) and each taken entry is
    written as its position: −1 when ≥ visible[t], else + offset (which must stay below
    2³¹ for the positions < visible[t]: the runtime's offsets are the window). Over a candidate
    source's ascending kept blocks this equals the top-k of the full scores with the
    candidate mask applied whenever at least k kept positions score above −∞.
    """
    m, Lb = _check_scores_visible("topk_fixed", scores, visible)
    _check_int("topk_fixed: k", k, 1, Lb)
    if ids is not None:
        check_gather_ids("topk_fixed", ids, cand_block, m, Lb, scores.device)
    _check_int("topk_fixed: offset", offset, 0, _MAX_LB - (Lb - 1))
    _check_out("topk_fixed", out, torch.int32, (m, k), scores.device)
    pos, _ = _packed_topk_positions(score_order_key(scores), k)
    pos = torch.sort(pos, dim=-1).values
    if ids is not None:
        pos = gathered_rows(ids, cand_block, pos)
    res = torch.where(pos >= visible[:, None], torch.full_like(pos, -1), pos + offset)
    out.copy_(res)
    return out


def candidate_mask_fixed(
    scores: torch.Tensor,
    visible: torch.Tensor,
    cand_blocks: int,
    cand_block: int,
    out: torch.Tensor,
    *,
    ids_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The candidate source's position mask at a fixed width: writes `out` and returns it.

    scores: bf16 `[m, Lb]`; visible: int32/int64 `[m]`; cand_blocks, cand_block ≥ 1; out:
    bool `[m, Lb]`. Contract: `out` equals `reference.indexer.candidate_mask(scores,
    visible, cand_blocks, cand_block)` exactly — blocks of `cand_block` columns cut over Lb
    (−∞ padding), a block scores its max (NaN if it holds one), the block holding
    `visible[t] − 1` is forced to +∞ when `visible[t] ≥ 1`; the top `min(cand_blocks,
    n_blocks)` blocks (NaN above +∞, lower block first among equals) are kept whole when
    their score is above −∞ (a NaN block takes a place and is not kept, as in the
    reference). Sync-free and CUDA-graph capturable.

    ids_out: None, or int32 `[m, min(cand_blocks, n_blocks)]`, also written: the top
    blocks in ascending block order, each kept block as its index and a taken block that
    is not kept (−∞ or NaN) as n_blocks (the kept blocks' ids for `indexer.index_scores(ids=)`
    and `topk_fixed(ids=)`: with no NaN or −∞ block among the top they are the kept blocks
    ascending, then n_blocks).
    """
    m, Lb = _check_scores_visible("candidate_mask_fixed", scores, visible)
    _check_int("candidate_mask_fixed: cand_blocks", cand_blocks, 1, _MAX_LB)
    _check_int("candidate_mask_fixed: cand_block", cand_block, 1, _MAX_LB)
    _check_out("candidate_mask_fixed", out, torch.bool, (m, Lb), scores.device)
    if ids_out is not None:
        keep_n = min(cand_blocks, -(-Lb // cand_block))
        _check_out("candidate_mask_fixed: ids_out", ids_out, torch.int32, (m, keep_n), scores.device)
    dev = scores.device
    n_blocks = -(-Lb // cand_block)
    keys = score_order_key(scores)
    keys = torch.nn.functional.pad(keys, (0, n_blocks * cand_block - Lb), value=_KEY_NEG_INF)
    block = keys.view(m, n_blocks, cand_block).amax(-1)  # the key max is the key of the float max
    newest = ((visible.to(torch.int64) - 1).clamp_min(0) // cand_block)[:, None]
    pin = (torch.arange(n_blocks, device=dev)[None, :] == newest) & (visible >= 1)[:, None]
    block = torch.where(pin, torch.full_like(block, _KEY_POS_INF), block)
    idx, key = _packed_topk_positions(block, min(cand_blocks, n_blocks))
    kept = torch.zeros(m, n_blocks, dtype=torch.bool, device=dev)
    good = (key > _KEY_NEG_INF) & (key != _KEY_NAN)  # the reference's `> −∞`: False for NaN
    kept.scatter_(1, idx, good)
    if ids_out is not None:
        order = torch.sort(idx, dim=-1).indices
        ids_out.copy_(torch.where(torch.gather(good, 1, order), torch.gather(idx, 1, order), n_blocks))
    # Column j belongs to block j // cand_block; expand + reshape (no repeat_interleave, whose
    # output size may be computed on the host).
    out.copy_(kept[:, :, None].expand(m, n_blocks, cand_block).reshape(m, n_blocks * cand_block)[:, :Lb])
    return out


def kept_block_ids(mask: torch.Tensor, cand_block: int, out: torch.Tensor) -> torch.Tensor:
    """A candidate mask (whole blocks of `cand_block` columns marked) as kept block ids,
    int32 `out` `[m, keep]` (ascending, n_blocks where fewer blocks were kept):
    `candidate_mask_of_blocks` gives the mask back bit for bit, and they are the ids the
    gathered forms take (`indexer.index_scores(ids=)`, `topk_fixed(ids=)`)."""
    m, width = mask.shape
    n_blocks = -(-width // cand_block)
    flag = mask[:, ::cand_block]  # a block's first column: marked iff the block was kept
    order = torch.sort(flag.to(torch.int8), dim=1, descending=True, stable=True).indices[:, : out.shape[1]]
    kept = torch.gather(flag, 1, order)
    out.copy_(torch.where(kept, order, torch.full_like(order, n_blocks)))
    return out
