"""Fixed-width position top-k and candidate mask on the device (attention-v41.md §6.5,
§6.6): `topk_fixed` and `candidate_mask_fixed`, a multi-program Triton radix select over
16-bit order keys. The runtime's decode steps run them on CUDA.

Twins: `kernels.select.topk_fixed` / `candidate_mask_fixed` (torch, packed int64 keys),
themselves equal to `reference.indexer.topk_select` / `candidate_mask`. Same contracts,
same results bit for bit (tests/kernels/test_topk.py).

The k-th largest key T of a row is found in two radix digits of 8 bits; the row is cut
into tiles of a fixed size and the grid is (tiles, rows), set by the shapes alone:
  0. a zeroed int32 workspace `hist [m, 512]` (high-byte bins, then low-byte bins);
  1. each tile histograms the high byte of its keys and adds it into `hist[t, :256]`
     (integer atomics: sums do not depend on their order, so the result is deterministic);
  2. each tile finds the high byte B of the k-th key from that histogram, histograms the
     low byte of its keys whose high byte is B into `hist[t, 256:]`, and stores its own
     counts `table[t, b, tile]` = #(keys ≥ B·256 + b) for b < 256, #(high byte > B) at
     b = 256 (so row lo of the table counts keys ≥ T and row lo + 1 keys > T);
  3. each tile finds T and `need` (how many keys equal to T are taken: k − #(keys > T),
     lowest positions first), sums the two table rows over the earlier tiles, and writes
     its choices: the top-k writes its taken positions, in position order, at their final
     slots (so the output is ascending without a sort); the candidate mask writes whole
     blocks of the bool mask.
The order key of a bf16 score is computed in the kernels from its bits (as
`select.score_order_key`): −0 → +0, every NaN → one key above +∞, then the float →
unsigned map. The candidate mask first materialises one int16 key per block (the max
over its columns, the newest block pinned to +∞) and runs steps 1–3 over those.

No host synchronisation and no value-dependent shape: capturable in a CUDA graph, with
the workspace zeroed inside the call, so a replay starts clean.

One program per row (`per_row=True`, `_topk_row_kernel`, rows up to `_ROW_LIMIT`): the
row's keys loaded once into registers, both histograms, T and `need` and the ordered writes
in that program: one launch, no workspace. The same steps, so the same selection (it is
exact: every launch shape gives the same positions). Production takes it for rows of at
most `_ROW_WIDTH` positions: 0, never, since a GPU timed it slower inside the decode step
(H100, forty-fourth entry): one program holds one SM, so a single row of 16K positions takes
23 µs against the tiled passes' 11 and the FP8 single-sequence step at 32K grows 3.19 →
3.29 ms; at 32K positions the keys spill (285 µs). Alone it wins only on short rows (4K:
7.6 against 10.1 µs at m = 1, 9.2 against 13.2 at m = 64), which did not show in the step.
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON, pdl_launch, require_triton, tl, triton
from .select import _MAX_LB, _check_int, _check_out, _check_scores_visible, check_gather_ids

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait

__all__ = ["topk_fixed", "candidate_mask_fixed"]

# Production tiling: fixed constants, never derived from values or the SM count. Tests
# shrink them (the keyword arguments, or by patching these names) to cross tile edges.
_BLOCK = 4096  # top-k: positions per tile (Lb = 1M → 256 tiles per row)
_WARPS = 8  # warps per program: the candidate mask, and the top-k up to `_FEW_POSITIONS`
# The top-k's launch shape by the positions of the call, m·Lb (`_topk_shape`): the selection
# is exact, the same for every tile and warp count, so a shape chosen from (m, Lb) keeps every
# result batch-invariant. H100, 2026-12-06 (thirty-ninth entry, scripts/topk_tune.py, m 1-64,
# Lb 4K-1M, µs): up to 128K positions tile 2048 at 8 warps is fastest (m = 1, 32K: 11.4
# against 14.5 at 4096 / 8), up to 1M tile 2048 at 4 warps (m = 8, 128K: 21.7 against 22.8),
# beyond tile 4096 at 4 warps (m = 64, 1M: 743 against 812); every other cell within 2 %.
_NARROW_TILE = 2048  # positions per tile while m·Lb ≤ `_NARROW_POSITIONS` (never above `_BLOCK`)
_NARROW_POSITIONS = 1 << 20
_FEW_POSITIONS = 1 << 17  # m·Lb up to this take `_WARPS`, more take `_MANY_WARPS`
_MANY_WARPS = 4
# One program per row (`_topk_row_kernel`) for rows of at most `_ROW_WIDTH` positions, its
# keys held in registers: next_pow2(Lb) of them over `_ROW_WARPS` warps. Off (0): timed on
# an H100 (forty-fourth entry), 16,384 (7 of a Flash step's 8 top-k calls at 32K) made the
# FP8 single-sequence step 3.4 % slower at 32K and 128K, 32,768 14 % slower, and at 4K
# (every call ≤ 4,096) it gained nothing (3.188 against 3.181 ms). Offline sm_90 SASS at
# 16,384 and 16 warps: 128 registers, a few spill slots; at 4,096: 80 registers.
_ROW_WIDTH = 0
_ROW_WARPS = 16
_ROW_LIMIT = 1 << 15  # the widest row `per_row=True` takes (64 keys per thread at 16 warps)
_MASK_BLOCKS = 512  # candidate mask: the most blocks per tile (Flash, Lb = 1M: 256 tiles)
# candidate mask: the most score entries one [blocks, columns] tensor holds. Registers grow
# with entries per thread (int64 addresses): 4096 over 8 warps compile (sm_90) to ~150 at
# most; 8192 reached 255 with a stack spill.
_MASK_COLS = 4096
_PREFIX = 1024  # earlier tiles' counts summed per step of the final pass
_MAX_GRID_ROWS = 65535  # rows go on grid axis 1 (CUDA limit 65535); more are launched in chunks
_HIST = 512  # int32 per row of the histogram workspace: 256 high-byte bins, 256 low-byte bins
_TABLE = 257  # int32 per tile of the count table: #(key ≥ B·256 + b) for b < 256, #(high > B)


def _check_pow2(name: str, value, lo: int, hi: int) -> None:
    _check_int(name, value, lo, hi)
    if value & (value - 1):
        raise ValueError(f"{name} = {value}; allowed: a power of two in {lo}..{hi}")


def _check_warps(name: str, value) -> None:
    _check_int(name, value, 1, 16)
    if value not in (1, 2, 4, 8, 16):
        raise ValueError(f"{name} = {value}; allowed: 1, 2, 4, 8, 16")


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _topk_shape(m: int, Lb: int) -> tuple[int, int]:
    """The top-k's production tiled (tile, warps) for m rows of width Lb, from the module's
    constants read at call time (tests patch `_BLOCK` to cross tile edges; the narrow tile
    never exceeds it). Rows of at most `_ROW_WIDTH` take one program each instead
    (`_topk_per_row`)."""
    positions = m * Lb
    tile = min(_BLOCK, _NARROW_TILE) if positions <= _NARROW_POSITIONS else _BLOCK
    return tile, (_WARPS if positions <= _FEW_POSITIONS else _MANY_WARPS)


def _topk_per_row(Lb: int) -> bool:
    """Whether the production top-k of rows of width Lb runs one program per row
    (`_ROW_WIDTH`, read at call time)."""
    return Lb <= _ROW_WIDTH


def _row_chunks(m: int):
    """Row ranges of at most `_MAX_GRID_ROWS` (read at call time, so tests can shrink it)."""
    step = _MAX_GRID_ROWS
    return [(r0, min(m, r0 + step)) for r0 in range(0, m, step)]


def topk_fixed(
    scores: torch.Tensor,
    visible: torch.Tensor,
    k: int,
    offset: int,
    out: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    tile: int | None = None,
    num_warps: int | None = None,
    neg_inf_past: bool = False,
    ids: torch.Tensor | None = None,
    cand_block: int = 0,
    per_row: bool | None = None,
) -> torch.Tensor:
    """The compressed part of the selection at a fixed width: writes `out` and returns it.

    Same contract as `kernels.select.topk_fixed`: scores bf16 `[m, Lb]` (any strides);
    visible int32/int64 `[m]` (any values); 1 ≤ k ≤ Lb; 0 ≤ offset ≤ 2³¹−1 − (Lb−1); out
    int32 `[m, k]`, any strides, every entry written. `out` equals
    `reference.indexer.topk_select(scores, visible, k, offset)`: the k best positions
    under (score descending, −0 = +0, NaN above +∞, lower position first among equals),
    ascending; positions ≥ visible[t] → −1 (the tail, as the output is ascending), the
    others + offset.

    mask: None, or bool `[m, Lb]` (any strides): where False the score counts as −∞, so
    the result is that of `scores.masked_fill(~mask, −∞)` (the candidate restriction of a
    reindex layer, fused into the key computation; `scores` is not written).

    tile, num_warps: tuning knobs for tests and benchmarks (a power of two 16..65536
    positions per tile, warps per program); None takes the production shape for (m, Lb)
    (`_topk_shape`: the result is the same for every shape).
    neg_inf_past: every score at a position ≥ visible[t] counts as −∞ and is not read (the
    index scores store −∞ there, so the result is the same as without it); the histogram
    passes count a tile wholly past visible[t] without reading or sorting it (a long
    prompt's early tokens in a wide context bucket). The result is that of
    `scores.masked_fill(position ≥ visible, −∞)`. Off in the runtime: not yet timed on a
    GPU.
    ids, cand_block: a gathered form (`kernels.select.topk_fixed`'s doc): each taken entry
    written as the position it stands for (the last pass reads its block id); not with
    neg_inf_past.
    per_row: True, one program per row (the row's keys in registers, one launch; Lb up to
    `_ROW_LIMIT`, no `tile`); False, the tiled passes; None, the production choice for Lb
    (`_topk_per_row`), or the tiled passes when `tile` is given. Every form gives the same
    result; per row is the slower one past 4K positions (the module doc's timings).
    Tiled: four launches (a zeroing memset and three passes); per row: one. No host sync:
    capturable. Arguments are checked on host metadata only, before anything is written.
    """
    m, Lb = _check_scores_visible("topk_fixed", scores, visible)
    _check_int("topk_fixed: k", k, 1, Lb)
    if ids is not None:
        check_gather_ids("topk_fixed", ids, cand_block, m, Lb, scores.device)
        if neg_inf_past:
            raise ValueError("topk_fixed: neg_inf_past = True with ids; allowed: False (visible counts positions)")
    _check_int("topk_fixed: offset", offset, 0, _MAX_LB - (Lb - 1))
    _check_out("topk_fixed", out, torch.int32, (m, k), scores.device)
    if mask is not None:
        _check_mask("topk_fixed", mask, (m, Lb), scores.device)
    if per_row is not None and not isinstance(per_row, bool):
        raise ValueError(f"topk_fixed: per_row = {per_row!r}; allowed: None, True, False")
    row_form = (tile is None and _topk_per_row(Lb)) if per_row is None else per_row
    if row_form:
        _check_int("topk_fixed: Lb (one program per row)", Lb, 1, _ROW_LIMIT)
        if tile is not None:
            raise ValueError(f"topk_fixed: tile = {tile} with per_row = True; allowed: None")
    auto_tile, auto_warps = _topk_shape(m, Lb)
    tile = auto_tile if tile is None else tile
    num_warps = (_ROW_WARPS if row_form else auto_warps) if num_warps is None else num_warps
    _check_pow2("topk_fixed: tile", tile, 16, 65536)
    _check_warps("topk_fixed: num_warps", num_warps)
    if not isinstance(neg_inf_past, bool):
        raise ValueError(f"topk_fixed: neg_inf_past = {neg_inf_past!r}; allowed: True, False")
    extra = ([] if mask is None else [mask]) + ([] if ids is None else [ids])
    require_triton("topk_fixed", scores, visible, out, *extra)
    if m == 0:
        return out
    dev = scores.device
    n_tiles = -(-Lb // tile)
    bits = scores.view(torch.int16)
    keep = bits if mask is None else mask.view(torch.uint8)
    k_row, k_col = (0, 0) if mask is None else (mask.stride(0), mask.stride(1))
    if row_form:
        for r0, r1 in _row_chunks(m):
            b = bits[r0:r1]
            _topk_row_kernel[(r1 - r0,)](
                b,
                keep[r0:r1],
                visible[r0:r1],
                out[r0:r1],
                Lb,
                k,
                offset,
                bits.stride(0),
                bits.stride(1),
                k_row,
                k_col,
                visible.stride(0),
                out.stride(0),
                out.stride(1),
                ROW=_next_pow2(Lb),
                HAS_MASK=mask is not None,
                SKIP=neg_inf_past,
                num_warps=num_warps,
                **({} if ids is None else dict(ids_ptr=ids[r0:r1], s_ids=ids.stride(0), GATHER=True, CB=cand_block)),
                **pdl_launch(b),
            )
        return out
    hist = torch.zeros(m, _HIST, dtype=torch.int32, device=dev)
    table = torch.empty(m, _TABLE, n_tiles, dtype=torch.int32, device=dev)
    src = dict(FROM_BITS=True, HAS_MASK=mask is not None, TILE=tile, num_warps=num_warps)
    for r0, r1 in _row_chunks(m):
        grid = (n_tiles, r1 - r0)
        strides = dict(s_row=bits.stride(0), s_col=bits.stride(1), k_row=k_row, k_col=k_col)
        b, kp, h, tb = bits[r0:r1], keep[r0:r1], hist[r0:r1], table[r0:r1]
        vr = dict(vis_ptr=visible[r0:r1], s_vis=visible.stride(0), SKIP=neg_inf_past)
        _hist_high_kernel[grid](b, kp, h, Lb, **strides, **vr, **src, **pdl_launch(b))
        _hist_low_kernel[grid](b, kp, h, tb, Lb, k, n_tiles, **strides, **vr, **src, **pdl_launch(b))
        _topk_write_kernel[grid](
            b,
            kp,
            h,
            tb,
            visible[r0:r1],
            out[r0:r1],
            Lb,
            k,
            offset,
            n_tiles,
            **strides,
            s_vis=visible.stride(0),
            o_row=out.stride(0),
            o_col=out.stride(1),
            PREFIX=_PREFIX,
            SKIP=neg_inf_past,
            **src,
            **({} if ids is None else dict(ids_ptr=ids[r0:r1], s_ids=ids.stride(0), GATHER=True, CB=cand_block)),
            **pdl_launch(b),
        )
    return out


def candidate_mask_fixed(
    scores: torch.Tensor,
    visible: torch.Tensor,
    cand_blocks: int,
    cand_block: int,
    out: torch.Tensor,
    *,
    tile_blocks: int | None = None,
    tile_cols: int | None = None,
    num_warps: int | None = None,
    ids_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The candidate source's position mask at a fixed width: writes `out` and returns it.

    Same contract as `kernels.select.candidate_mask_fixed`: scores bf16 `[m, Lb]`, visible
    int32/int64 `[m]`, cand_blocks, cand_block ≥ 1, out bool `[m, Lb]` (any strides, every
    entry written). `out` equals `reference.indexer.candidate_mask(scores, visible,
    cand_blocks, cand_block)`: blocks of `cand_block` columns over Lb (−∞ padding), a
    block's key the max key of its columns (the NaN key if it holds a NaN), the block
    holding visible[t] − 1 pinned to +∞ when visible[t] ≥ 1; the top min(cand_blocks,
    n_blocks) blocks (lower block first among equals) kept whole when their key is above
    −∞ and not NaN.

    tile_blocks, tile_cols: tuning knobs for tests and benchmarks (powers of two: the most
    blocks per tile, the most entries per [blocks, columns] load, tile_cols ≥ tile_blocks);
    None takes the production constants. Four launches, no host sync: capturable.
    ids_out: None, or int32 `[m, min(cand_blocks, n_blocks)]`, the top blocks ascending
    (`kernels.select.candidate_mask_fixed`'s doc), written by the same last pass.
    """
    m, Lb = _check_scores_visible("candidate_mask_fixed", scores, visible)
    _check_int("candidate_mask_fixed: cand_blocks", cand_blocks, 1, _MAX_LB)
    _check_int("candidate_mask_fixed: cand_block", cand_block, 1, _MAX_LB)
    _check_out("candidate_mask_fixed", out, torch.bool, (m, Lb), scores.device)
    if ids_out is not None:
        keep_ids = min(cand_blocks, -(-Lb // cand_block))
        _check_out("candidate_mask_fixed: ids_out", ids_out, torch.int32, (m, keep_ids), scores.device)
    tb_max = _MASK_BLOCKS if tile_blocks is None else tile_blocks
    cap = _MASK_COLS if tile_cols is None else tile_cols
    num_warps = _WARPS if num_warps is None else num_warps
    _check_pow2("candidate_mask_fixed: tile_blocks", tb_max, 1, 65536)
    _check_pow2("candidate_mask_fixed: tile_cols", cap, tb_max, 1 << 20)
    _check_warps("candidate_mask_fixed: num_warps", num_warps)
    require_triton("candidate_mask_fixed", scores, visible, out, *([] if ids_out is None else [ids_out]))
    if m == 0:
        return out
    dev = scores.device
    n_blocks = -(-Lb // cand_block)
    keep_n = min(cand_blocks, n_blocks)
    # [TB, CW] loads: TB blocks per tile, CW columns of each per step (a loop covers cand_block)
    TB = min(tb_max, max(16, cap // _next_pow2(cand_block)))
    CW = max(1, min(_next_pow2(cand_block), cap // TB))
    n_tiles = -(-n_blocks // TB)
    bits = scores.view(torch.int16)
    flags = out.view(torch.uint8)
    keys = torch.empty(m, n_blocks, dtype=torch.int16, device=dev)
    hist = torch.zeros(m, _HIST, dtype=torch.int32, device=dev)
    table = torch.empty(m, _TABLE, n_tiles, dtype=torch.int32, device=dev)
    kstr = dict(s_row=n_blocks, s_col=1, k_row=0, k_col=0)
    opt = dict(TILE=TB, num_warps=num_warps)
    for r0, r1 in _row_chunks(m):
        grid = (n_tiles, r1 - r0)
        ky, h, tb = keys[r0:r1], hist[r0:r1], table[r0:r1]
        _block_keys_kernel[grid](
            bits[r0:r1],
            visible[r0:r1],
            ky,
            h,
            Lb,
            n_blocks,
            cand_block,
            bits.stride(0),
            bits.stride(1),
            visible.stride(0),
            CW=CW,
            **opt,
            **pdl_launch(ky),
        )
        _hist_low_kernel[grid](
            ky, ky, h, tb, n_blocks, keep_n, n_tiles, **kstr, vis_ptr=visible[r0:r1], s_vis=visible.stride(0),
            SKIP=False, FROM_BITS=False, HAS_MASK=False, **opt, **pdl_launch(ky),
        )  # fmt: skip
        _mask_write_kernel[grid](
            ky,
            h,
            tb,
            flags[r0:r1],
            Lb,
            n_blocks,
            keep_n,
            cand_block,
            n_tiles,
            flags.stride(0),
            flags.stride(1),
            CW=CW,
            PREFIX=_PREFIX,
            **opt,
            **(
                {}
                if ids_out is None
                else dict(ids_ptr=ids_out[r0:r1], i_row=ids_out.stride(0), i_col=ids_out.stride(1), IDS=True)
            ),
            **pdl_launch(ky),
        )
    return out


def _check_mask(fn: str, mask, shape: tuple[int, int], device: torch.device) -> None:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != shape:
        got = f"{mask.dtype} of shape {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{fn}: mask must be None or torch.bool of shape {list(shape)}; got {got}")
    if mask.device != device:
        raise ValueError(f"{fn}: mask is on {mask.device}, scores on {device}; allowed: the same device")


if HAVE_TRITON:

    @triton.jit
    def _order_key(bits16):
        """int32 order keys 0x7F … 0xFFC0 of bf16 bit patterns (as `select.score_order_key`):
        −0 → +0, every NaN → 0x7FC0 (above +∞), negatives flip all bits, others set the sign bit."""
        b = bits16.to(tl.int32) & 0xFFFF
        b = tl.where(b == 0x8000, 0, b)
        b = tl.where((b & 0x7FFF) > 0x7F80, 0x7FC0, b)
        return tl.where(b >= 0x8000, b ^ 0xFFFF, b | 0x8000)

    @triton.jit
    def _load_keys(
        src_ptr,
        keep_ptr,
        t,
        idx,
        ok,
        s_row,
        s_col,
        k_row,
        k_col,
        FROM_BITS: tl.constexpr,
        HAS_MASK: tl.constexpr,
        vis=0,
        SKIP: tl.constexpr = False,
    ):
        """Keys of row t at columns idx (int64): from bf16 bits (FROM_BITS) or stored int16
        keys; −∞ (0x7F) where the keep mask is 0 (HAS_MASK), and with SKIP at columns
        ≥ vis (not read). Lanes outside `ok` get key 0, below every real key (≥ 0x7F): they
        never compare ≥ a threshold T, which is the key of a real entry, so only the
        histograms need `ok` as a mask."""
        if SKIP:
            seen = ok & (idx < vis)
        else:
            seen = ok
        raw = tl.load(src_ptr + t * s_row + idx * s_col, mask=seen, other=0)
        if FROM_BITS:
            key = _order_key(raw)
        else:
            key = raw.to(tl.int32) & 0xFFFF
        if HAS_MASK:
            kept = tl.load(keep_ptr + t * k_row + idx * k_col, mask=seen, other=0)
            key = tl.where(kept != 0, key, 0x7F)
        if SKIP:
            key = tl.where(seen, key, 0x7F)
        return tl.where(ok, key, 0)

    @triton.jit
    def _byte_threshold(hist, want):
        """Over a 256-bin histogram with total ≥ want ≥ 1: the largest byte b with
        count(byte ≥ b) ≥ want, and count(byte > b) (< want)."""
        # [256] byte value
        byte = tl.arange(0, 256)
        ge = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist
        b = tl.max(tl.where(ge >= want, byte, -1), 0)
        above = tl.sum(tl.where(byte > b, hist, 0), 0)
        return b, above

    @triton.jit
    def _past_visible(vis_ptr, s_vis, t, tile, N, TILE: tl.constexpr, SKIP: tl.constexpr):
        """With SKIP: visible[t] (int64), and how many columns tile `tile` of row t holds
        when it lies wholly past it (keys all −∞, 0x7F: high byte 0, low byte 0x7F), else 0.
        Without SKIP: (0, 0)."""
        n = tl.program_id(0) * 0  # int32 0
        vis = n.to(tl.int64)
        if SKIP:
            c0 = tile.to(tl.int64) * TILE
            vis = tl.load(vis_ptr + t * s_vis).to(tl.int64)
            n = tl.where(c0 >= vis, tl.minimum(N - c0, TILE), 0).to(tl.int32)
        return vis, n

    @triton.jit
    def _hist_high_kernel(
        src_ptr,
        keep_ptr,
        hist_ptr,
        N,
        s_row,
        s_col,
        k_row,
        k_col,
        vis_ptr,
        s_vis,
        TILE: tl.constexpr,
        FROM_BITS: tl.constexpr,
        HAS_MASK: tl.constexpr,
        SKIP: tl.constexpr,
        PDL: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # program (tile, t): columns tile·TILE … of row t; adds into hist[t, :256]
        tile = tl.program_id(0)
        t = tl.program_id(1).to(tl.int64)
        vis, past = _past_visible(vis_ptr, s_vis, t, tile, N, TILE, SKIP)
        if past > 0:  # all −∞: high byte 0, counted without a read
            tl.atomic_add(hist_ptr + t * 512, past, sem="relaxed")
        else:
            # [TILE] column
            idx = tile.to(tl.int64) * TILE + tl.arange(0, TILE)
            ok = idx < N
            key = _load_keys(src_ptr, keep_ptr, t, idx, ok, s_row, s_col, k_row, k_col, FROM_BITS, HAS_MASK, vis, SKIP)
            # [256] this tile's high-byte counts
            h = tl.histogram(key >> 8, 256, mask=ok)
            byte = tl.arange(0, 256)
            tl.atomic_add(hist_ptr + t * 512 + byte, h, mask=h != 0, sem="relaxed")

    @triton.jit
    def _hist_low_kernel(
        src_ptr,
        keep_ptr,
        hist_ptr,
        table_ptr,
        N,
        k,
        n_tiles,
        s_row,
        s_col,
        k_row,
        k_col,
        vis_ptr,
        s_vis,
        TILE: tl.constexpr,
        FROM_BITS: tl.constexpr,
        HAS_MASK: tl.constexpr,
        SKIP: tl.constexpr,
        PDL: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # program (tile, t): adds the low bytes of keys with high byte B into hist[t, 256:],
        # writes table[t, :, tile]
        tile = tl.program_id(0)
        t = tl.program_id(1).to(tl.int64)
        # [256] byte value
        byte = tl.arange(0, 256)
        hi, _ = _byte_threshold(tl.load(hist_ptr + t * 512 + byte), k)
        vis, past = _past_visible(vis_ptr, s_vis, t, tile, N, TILE, SKIP)
        if past > 0:  # all −∞ (key 0x7F): no key above hi; `past` of low byte 0x7F when hi = 0
            gt_hi = past * 0
            low = tl.where((byte == 0x7F) & (hi == 0), past, 0)
        else:
            # [TILE] column
            idx = tile.to(tl.int64) * TILE + tl.arange(0, TILE)
            ok = idx < N
            key = _load_keys(src_ptr, keep_ptr, t, idx, ok, s_row, s_col, k_row, k_col, FROM_BITS, HAS_MASK, vis, SKIP)
            high = key >> 8
            gt_hi = tl.sum((high > hi).to(tl.int32), 0)  # lanes outside ok have high byte 0 ≤ hi
            # [256] this tile's low-byte counts among keys with high byte hi
            low = tl.histogram(key & 0xFF, 256, mask=ok & (high == hi))
        ge = gt_hi + tl.sum(low, 0) - tl.cumsum(low, 0) + low  # #(key ≥ hi·256 + b)
        col = table_ptr + t * 257 * n_tiles + tile
        tl.store(col + byte.to(tl.int64) * n_tiles, ge)
        tl.store(col + (t * 0 + 256) * n_tiles, gt_hi)  # int64 (t * 0: n_tiles may arrive as a constexpr)
        tl.atomic_add(hist_ptr + t * 512 + 256 + byte, low, mask=low != 0, sem="relaxed")

    @triton.jit
    def _tile_plan(hist_ptr, table_ptr, t, tile, k, n_tiles, PREFIX: tl.constexpr):
        """For tile `tile` of row t: the k-th key T, `need` (keys == T to take, ≥ 1), and
        over the earlier tiles #(keys > T) and #(keys == T), then the same two for this tile."""
        # [256] byte value
        byte = tl.arange(0, 256)
        hi, above_hi = _byte_threshold(tl.load(hist_ptr + t * 512 + byte), k)
        lo, above_lo = _byte_threshold(tl.load(hist_ptr + t * 512 + 256 + byte), k - above_hi)
        thresh = hi * 256 + lo
        need = k - above_hi - above_lo
        ge_row = table_ptr + t * 257 * n_tiles + lo.to(tl.int64) * n_tiles  # #(key ≥ T) per tile
        gt_row = ge_row + n_tiles  # #(key > T) per tile: the next table row
        # [PREFIX] earlier tile
        lane = tl.arange(0, PREFIX)
        gt_before = tl.sum(tl.zeros([PREFIX], dtype=tl.int32), 0)
        eq_before = gt_before
        j0 = 0
        while j0 < tile:
            j = j0 + lane
            ok = j < tile
            gt = tl.load(gt_row + j, mask=ok, other=0)
            ge = tl.load(ge_row + j, mask=ok, other=0)
            gt_before += tl.sum(gt, 0)
            eq_before += tl.sum(ge - gt, 0)
            j0 += PREFIX
        gt_here = tl.load(gt_row + tile)
        eq_here = tl.load(ge_row + tile) - gt_here
        return thresh, need, gt_before, eq_before, gt_here, eq_here

    @triton.jit
    def _topk_write_kernel(
        src_ptr,
        keep_ptr,
        hist_ptr,
        table_ptr,
        vis_ptr,
        out_ptr,
        N,
        k,
        offset,
        n_tiles,
        s_row,
        s_col,
        k_row,
        k_col,
        s_vis,
        o_row,
        o_col,
        TILE: tl.constexpr,
        PREFIX: tl.constexpr,
        FROM_BITS: tl.constexpr,
        HAS_MASK: tl.constexpr,
        SKIP: tl.constexpr = False,
        PDL: tl.constexpr = False,
        ids_ptr=None,  # GATHER: int32 [m, N / CB], the block each CB entries stand for
        s_ids=0,
        GATHER: tl.constexpr = False,
        CB: tl.constexpr = 1,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # program (tile, t): writes the positions of this tile that are taken, at their slots
        tile = tl.program_id(0)
        t = tl.program_id(1).to(tl.int64)
        thresh, need, gt_before, eq_before, gt_here, eq_here = _tile_plan(
            hist_ptr, table_ptr, t, tile, k, n_tiles, PREFIX
        )
        if (gt_here > 0) | ((eq_here > 0) & (eq_before < need)):  # else nothing to take here
            # [TILE] position
            idx = tile.to(tl.int64) * TILE + tl.arange(0, TILE)
            ok = idx < N
            if SKIP:
                vs = tl.load(vis_ptr + t * s_vis).to(tl.int64)
                key = _load_keys(
                    src_ptr, keep_ptr, t, idx, ok, s_row, s_col, k_row, k_col, FROM_BITS, HAS_MASK, vs, SKIP
                )
            else:
                key = _load_keys(src_ptr, keep_ptr, t, idx, ok, s_row, s_col, k_row, k_col, FROM_BITS, HAS_MASK)
            eq = (key == thresh).to(tl.int32)
            eq_rank = eq_before + tl.cumsum(eq, 0) - eq  # ties in position order, over the row
            take = ((key > thresh) | ((eq != 0) & (eq_rank < need))).to(tl.int32)
            slot = gt_before + tl.minimum(eq_before, need) + tl.cumsum(take, 0) - take
            vis = tl.load(vis_ptr + t * s_vis).to(tl.int64)
            if GATHER:  # the position entry idx stands for
                blk = tl.load(ids_ptr + t * s_ids + idx // CB, mask=take != 0, other=0).to(tl.int64)
                pos = blk * CB + idx % CB
            else:
                pos = idx
            val = tl.where(pos >= vis, -1, pos + offset).to(tl.int32)
            tl.store(out_ptr + t * o_row + slot.to(tl.int64) * o_col, val, mask=take != 0)

    @triton.jit
    def _topk_row_kernel(
        src_ptr,
        keep_ptr,
        vis_ptr,
        out_ptr,
        N,
        k,
        offset,
        s_row,
        s_col,
        k_row,
        k_col,
        s_vis,
        o_row,
        o_col,
        ROW: tl.constexpr,
        HAS_MASK: tl.constexpr,
        SKIP: tl.constexpr = False,
        PDL: tl.constexpr = False,
        ids_ptr=None,  # GATHER: int32 [m, N / CB], the block each CB entries stand for
        s_ids=0,
        GATHER: tl.constexpr = False,
        CB: tl.constexpr = 1,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # program t: the whole of row t (N ≤ ROW positions), the tiled passes' steps in one
        # program: keys once, both histograms, T and need, the taken positions at their slots
        t = tl.program_id(0).to(tl.int64)
        vis = tl.load(vis_ptr + t * s_vis).to(tl.int64)
        # [ROW] position
        idx = tl.arange(0, ROW)
        ok = idx < N
        key = _load_keys(
            src_ptr, keep_ptr, t, idx.to(tl.int64), ok, s_row, s_col, k_row, k_col, True, HAS_MASK, vis, SKIP
        )
        high = key >> 8
        hi, above_hi = _byte_threshold(tl.histogram(high, 256, mask=ok), k)
        lo, above_lo = _byte_threshold(tl.histogram(key & 0xFF, 256, mask=ok & (high == hi)), k - above_hi)
        thresh = hi * 256 + lo
        need = k - above_hi - above_lo
        eq = (key == thresh).to(tl.int32)
        eq_rank = tl.cumsum(eq, 0) - eq  # ties in position order
        take = ((key > thresh) | ((eq != 0) & (eq_rank < need))).to(tl.int32)
        slot = tl.cumsum(take, 0) - take
        pos = idx.to(tl.int64)
        if GATHER:  # the position entry idx stands for
            blk = tl.load(ids_ptr + t * s_ids + pos // CB, mask=take != 0, other=0).to(tl.int64)
            pos = blk * CB + pos % CB
        val = tl.where(pos >= vis, -1, pos + offset).to(tl.int32)
        tl.store(out_ptr + t * o_row + slot.to(tl.int64) * o_col, val, mask=take != 0)

    @triton.jit
    def _block_keys_kernel(
        bits_ptr,
        vis_ptr,
        keys_ptr,
        hist_ptr,
        Lb,
        n_blocks,
        cb,
        s_row,
        s_col,
        s_vis,
        TILE: tl.constexpr,
        CW: tl.constexpr,
        PDL: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # program (tile, t): keys of blocks tile·TILE … of row t into keys[t], their high
        # bytes into hist[t, :256]
        tile = tl.program_id(0)
        t = tl.program_id(1).to(tl.int64)
        # [TILE] block
        blk = tile.to(tl.int64) * TILE + tl.arange(0, TILE)
        ok = blk < n_blocks
        # [CW] column within one step over a block
        cc = tl.arange(0, CW)
        best = tl.zeros([TILE], dtype=tl.int32)  # below every key; each block has ≥ 1 column < Lb
        c0 = 0
        while c0 < cb:
            c = c0 + cc
            # [TILE, CW] column of the scores
            col = blk[:, None] * cb + c[None, :]
            inb = ok[:, None] & (c[None, :] < cb) & (col < Lb)
            key = _order_key(tl.load(bits_ptr + t * s_row + col * s_col, mask=inb, other=0))
            best = tl.maximum(best, tl.max(tl.where(inb, key, 0), 1))
            c0 += CW
        vis = tl.load(vis_ptr + t * s_vis).to(tl.int64)
        newest = tl.maximum(vis - 1, 0) // cb
        best = tl.where((blk == newest) & (vis >= 1), 0xFF80, best)  # pinned to the +∞ key
        best = tl.where(ok, best, 0)
        tl.store(keys_ptr + t * n_blocks + blk, best.to(tl.int16), mask=ok)
        # [256] this tile's high-byte counts
        h = tl.histogram(best >> 8, 256, mask=ok)
        byte = tl.arange(0, 256)
        tl.atomic_add(hist_ptr + t * 512 + byte, h, mask=h != 0, sem="relaxed")

    @triton.jit
    def _mask_write_kernel(
        keys_ptr,
        hist_ptr,
        table_ptr,
        out_ptr,
        Lb,
        n_blocks,
        keep_n,
        cb,
        n_tiles,
        o_row,
        o_col,
        TILE: tl.constexpr,
        CW: tl.constexpr,
        PREFIX: tl.constexpr,
        PDL: tl.constexpr = False,
        ids_ptr=None,  # IDS: int32 [m, keep_n], the taken blocks ascending (n_blocks: not kept)
        i_row=0,
        i_col=0,
        IDS: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # program (tile, t): every column of blocks tile·TILE … of row t, kept or not
        tile = tl.program_id(0)
        t = tl.program_id(1).to(tl.int64)
        thresh, need, gt_before, eq_before, gt_here, eq_here = _tile_plan(
            hist_ptr, table_ptr, t, tile, keep_n, n_tiles, PREFIX
        )
        # [TILE] block
        blk = tile.to(tl.int64) * TILE + tl.arange(0, TILE)
        ok = blk < n_blocks
        key = _load_keys(keys_ptr, keys_ptr, t, blk, ok, n_blocks, 1, 0, 0, False, False)
        eq = (key == thresh).to(tl.int32)
        eq_rank = eq_before + tl.cumsum(eq, 0) - eq
        take = (key > thresh) | ((eq != 0) & (eq_rank < need))
        kept = (take & (key > 0x7F) & (key != 0xFFC0)).to(tl.uint8)  # above −∞, not NaN
        if IDS:  # the taken blocks at their ascending slots, as `_topk_write_kernel` places positions
            tk = take.to(tl.int32)
            slot = gt_before + tl.minimum(eq_before, need) + tl.cumsum(tk, 0) - tk
            bid = tl.where(kept != 0, blk, n_blocks).to(tl.int32)
            tl.store(ids_ptr + t * i_row + slot.to(tl.int64) * i_col, bid, mask=take)
        # [CW] column within one step over a block
        cc = tl.arange(0, CW)
        c0 = 0
        while c0 < cb:
            c = c0 + cc
            # [TILE, CW] column of the mask
            col = blk[:, None] * cb + c[None, :]
            inb = ok[:, None] & (c[None, :] < cb) & (col < Lb)
            flag = tl.broadcast_to(kept[:, None], [TILE, CW])
            tl.store(out_ptr + t * o_row + col * o_col, flag, mask=inb)
            c0 += CW
