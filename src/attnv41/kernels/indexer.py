"""Lightning-indexer scores on the device (attention-v41.md §6.4): `index_scores`
(Triton) and `index_scores_torch`.

Twin: `attnv41.reference.indexer.index_scores`.
"""

from __future__ import annotations

import torch

from ..reference import indexer as _ref
from ._triton import HAVE_TRITON, interpreting, pdl_launch, require_triton, tl, triton
from .packed_rows import fp4_words_ok

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait, round_bf16
    from .packed_rows import fp4_rows

__all__ = ["index_scores", "index_scores_torch", "index_scores_paged", "index_scores_paged_torch", "PREFILL_RUN"]

_INT = (torch.int32, torch.int64)
_BLOCK_L = 64  # keys per program
# The launch shape (a constant: a key's bits never depend on m or L): keys per block,
# blocks per program (a loop), warps, pipeline stages (Triton's defaults 4 and 3).
# scripts/batch_kernel_probe.py times alternatives (in a batched step, or at m = 1).
_TUNE = dict(block_l=_BLOCK_L, sub=1, num_warps=4, num_stages=3, tok=1)
# `index_scores_paged` (the batched runtime's): 4 blocks per program, 2 warps, 2 stages.
# H200, batch 64 at a 32K context on one step's own inputs (scripts/batch_kernel_probe.py,
# 2026-12-02): 86.6 µs against 101.9 (bf16 keys), 110.8 against 113.2 (packed), the same
# bytes. The single-sequence `index_scores` keeps `_TUNE` (its 1M-key decode not re-timed).
_PAGED_TUNE = dict(block_l=_BLOCK_L, sub=4, num_warps=2, num_stages=2, tok=1)
# The prefill regime (`prefill=True`: a prompt chunk, whose tokens score the same keys): TOK
# tokens per program share each key tile, loaded once for them, instead of one program per
# token each reading every key (a 2,048-token chunk at a 1M context read ~0.5 TB of keys per
# index layer through L2: 1.41 s per chunk on the H200, BENCHMARKS 2026-12-03 sixth entry).
# Each token's dot, epilogue and store are the one-token program's, so the same bits.
_PREFILL = dict(tok=8, num_warps=4)  # 4 warps: the tile and 8 tokens' own-key path fit in registers
# The runtimes take the prefill regime for calls where one sequence brings at least this
# many tokens (a prompt chunk); decode and verify steps keep one token per program.
PREFILL_RUN = _PREFILL["tok"]
_MAX_HEADS = 64  # one [H_P, d] query tile per program (H_P · d · 2 bytes ≤ 32 KiB)
_MAX_DIM = 256


def _packed_width(d: int) -> int:
    """Bytes of one packed index key of d values (fp4_e8m0, `attnv41.packed`)."""
    return d // 2 + d // 32


def _check(iq, weights, keys, visible, out) -> None:
    packed = keys.dtype == torch.uint8
    for name, t in (("iq", iq), ("weights", weights), ("keys", keys)):
        if t.dtype != torch.bfloat16 and not (name == "keys" and packed):
            allowed = "torch.bfloat16, or torch.uint8 packed rows" if name == "keys" else "torch.bfloat16"
            raise ValueError(f"{name}.dtype = {t.dtype}; allowed: {allowed}")
        if t.device != iq.device:
            raise ValueError(f"{name}.device = {t.device}; allowed: iq.device = {iq.device}")
    if iq.dim() != 3:
        raise ValueError(f"iq.dim() = {iq.dim()} (shape {tuple(iq.shape)}); allowed: 3 ([m, H, d])")
    m, H, d = iq.shape
    if not 1 <= H <= _MAX_HEADS:
        raise ValueError(f"iq.shape[1] (H) = {H}; allowed: 1..{_MAX_HEADS}")
    if d < 32 or d % 32 or d > _MAX_DIM:
        raise ValueError(f"iq.shape[2] (index_head_dim) = {d}; allowed: a multiple of 32 in 32..{_MAX_DIM}")
    if iq.stride(2) != 1:
        raise ValueError(f"iq.stride(2) = {iq.stride(2)}; allowed: 1")
    if tuple(weights.shape) != (m, H):
        raise ValueError(f"weights.shape = {tuple(weights.shape)}; allowed: [m, H] = [{m}, {H}]")
    kw = _packed_width(d) if packed else d
    if keys.dim() != 2 or keys.shape[1] != kw:
        what = f"[L, {kw}] (packed fp4_e8m0 rows of d = {d})" if packed else f"[L, d] with d = {d}"
        raise ValueError(f"keys.shape = {tuple(keys.shape)}; allowed: {what}")
    if keys.stride(1) != 1:
        raise ValueError(f"keys.stride(1) = {keys.stride(1)}; allowed: 1")
    if visible.dtype not in _INT:
        raise ValueError(f"visible.dtype = {visible.dtype}; allowed: torch.int32 or torch.int64")
    if tuple(visible.shape) != (m,):
        raise ValueError(f"visible.shape = {tuple(visible.shape)}; allowed: [m] = [{m}]")
    if visible.device != iq.device:
        raise ValueError(f"visible.device = {visible.device}; allowed: iq.device = {iq.device}")
    if out is not None:
        L = keys.shape[0]
        if out.dtype != torch.bfloat16 or tuple(out.shape) != (m, L) or out.device != iq.device:
            raise ValueError(
                f"out = {out.dtype} {tuple(out.shape)} on {out.device}; allowed: torch.bfloat16 [{m}, {L}] on {iq.device}"
            )
        if L > 1 and out.stride(1) != 1:
            raise ValueError(f"out.stride(1) = {out.stride(1)}; allowed: 1")


def index_scores_torch(
    iq, weights, keys, visible, out: torch.Tensor | None = None, prefill: bool = False
) -> torch.Tensor:
    """Fallback of `index_scores` (same contract), the reference twin (one regime: `prefill`
    is accepted and changes nothing)."""
    _check(iq, weights, keys, visible, out)
    s = _ref.index_scores(iq, weights, _unpacked(keys, iq.shape[2]), visible)
    return s if out is None else out.copy_(s)


def _unpacked(keys: torch.Tensor, d: int) -> torch.Tensor:
    """bf16 keys as they are; packed fp4_e8m0 rows unpacked (exact)."""
    if keys.dtype != torch.uint8:
        return keys
    from ..packed import unpack  # noqa: PLC0415

    return unpack(keys, "fp4_e8m0", d)


def index_scores(
    iq, weights, keys, visible, out: torch.Tensor | None = None, prefill: bool = False, **tune
) -> torch.Tensor:
    """Scores `I[t, j] = Σ_h w[t,h] · ReLU(iq[t,h] · k_j)`, bf16 `[m, L]`.

    iq: bf16 `[m, H, d]` (d = index_head_dim, a multiple of 32); weights: bf16 `[m, H]`;
    keys: bf16 `[L, d]`, or uint8 `[L, d/2 + d/32]`: V4.1's packed fp4_e8m0 rows
    (`attnv41.packed`), dequantized in the kernel to the same bf16 values, so the same
    bits; visible: int32/int64 `[m]` on iq's device, `L_t` of each token.
    The reference's roundings: each dot over d accumulates in fp32 (in any order) and is
    rounded to bf16; ReLU; times `w[t, h]`, the product rounded to bf16; the sum over
    heads accumulates in fp32 (any order) and is rounded to bf16. Entries `j ≥ L_t` are
    −∞, and their keys are not read (a key row past every token's `L_t` may hold
    anything). Results may differ from the reference only where a differently ordered
    fp32 sum rounds to the other bf16 neighbour; a column's bits do not depend on L.

    out: None (allocate) or bf16 `[m, L]`; returned. No host synchronisation. `prefill`:
    the prefill regime's launch shape (`_PREFILL`: 8 tokens per program sharing each key
    tile; the same bits, chosen by regime, never by m). `tune` (block_l, sub, num_warps,
    num_stages, tok) is for the tuning script only: the launch shape is a constant
    (`_TUNE`) in the runtime.
    """
    _check(iq, weights, keys, visible, out)
    require_triton("index_scores", iq, weights, keys, visible)
    m, H, d = iq.shape
    L = keys.shape[0]
    if out is None:
        out = torch.empty(m, L, dtype=torch.bfloat16, device=iq.device)
    if m == 0 or L == 0:
        return out
    cfg = _tune(tune, _TUNE, prefill)
    grid = (triton.cdiv(m, cfg["tok"]), triton.cdiv(L, cfg["block_l"] * cfg["sub"]))
    _index_scores_kernel[grid](
        iq,
        weights,
        keys,
        visible,
        out,
        m,
        L,
        iq.stride(0),
        iq.stride(1),
        weights.stride(0),
        weights.stride(1),
        keys.stride(0),
        out.stride(0),
        visible,  # unused pointers (PAGED False)
        visible,
        0,
        H=H,
        D=d,
        H_P=max(16, triton.next_power_of_2(H)),  # tl.dot needs >= 16 rows
        D_P=triton.next_power_of_2(d),
        BLOCK_L=cfg["block_l"],
        SUB=cfg["sub"],
        TOK=cfg["tok"],
        # Triton 3.6's interpreter multiplies bf16 tiles as their raw uint16 bits; there
        # the tiles go to fp32 first (exact: same products, fp32 accumulation).
        DOT_F32=interpreting(),
        PAGED=False,
        BLOCK_ROWS=1,
        PACKED=keys.dtype == torch.uint8,
        WORDS=keys.dtype == torch.uint8 and fp4_words_ok(keys),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **pdl_launch(iq),
    )
    return out


def _tune(tune: dict, base: dict = _TUNE, prefill: bool = False) -> dict:
    """The launch shape: `base` (with the prefill regime's tokens per program) and the
    tuning script's overrides (checked)."""
    bad = set(tune) - set(base)
    if bad:
        raise ValueError(f"tune keys {sorted(bad)}; allowed: {sorted(base)}")
    if not isinstance(prefill, bool):
        raise ValueError(f"prefill = {prefill!r}; allowed: True or False")
    cfg = {**base, **(_PREFILL if prefill else {}), **tune}
    if isinstance(cfg["tok"], bool) or not isinstance(cfg["tok"], int) or not 1 <= cfg["tok"] <= 64:
        raise ValueError(f"tok = {cfg['tok']!r}; allowed: an int in 1..64")
    return cfg


# --------------------------------------------------------------- paged (many sequences)


def _check_paged(iq, weights, pool, table, tok_slot, block_rows, visible, width, out) -> None:
    if pool.dim() != 2:
        raise ValueError(f"keys.shape = {tuple(pool.shape)}; allowed: [rows, d] (the index-key pool)")
    _check(iq, weights, pool, visible, None)
    m = iq.shape[0]
    if isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1:
        raise ValueError(f"block_rows = {block_rows!r}; allowed: an int >= 1")
    if table.dtype not in _INT or table.dim() != 2 or table.device != iq.device:
        raise ValueError(
            f"block_table = {table.dtype} {tuple(table.shape)} on {table.device}; allowed: int32/int64 "
            f"[sequences, blocks] on {iq.device}"
        )
    if table.stride(1) != 1:
        raise ValueError(f"block_table.stride(1) = {table.stride(1)}; allowed: 1")
    if tok_slot.dtype not in _INT or tuple(tok_slot.shape) != (m,) or tok_slot.device != iq.device:
        raise ValueError(
            f"tok_slot = {tok_slot.dtype} {tuple(tok_slot.shape)} on {tok_slot.device}; allowed: int32/int64 [{m}] "
            f"on {iq.device}"
        )
    cap = table.shape[1] * block_rows
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= cap:
        raise ValueError(f"width = {width!r}; allowed: 1..{cap} (block_table.shape[1] · block_rows)")
    if out is not None and (out.dtype != torch.bfloat16 or tuple(out.shape) != (m, width) or out.device != iq.device):
        raise ValueError(
            f"out = {out.dtype} {tuple(out.shape)} on {out.device}; allowed: torch.bfloat16 [{m}, {width}] on {iq.device}"
        )
    if out is not None and width > 1 and out.stride(1) != 1:
        raise ValueError(f"out.stride(1) = {out.stride(1)}; allowed: 1")


def index_scores_paged(
    iq, weights, keys, block_table, tok_slot, block_rows, visible, width, out=None, prefill: bool = False, **tune
):
    """`index_scores` for the tokens of many sequences in one launch, each over its own
    sequence's keys in a paged pool: token t scores logical rows j < width of sequence
    `tok_slot[t]`, whose row j lives at pool row `block_table[tok_slot[t], j // block_rows]
    · block_rows + j % block_rows`. keys: bf16 `[rows, d]` or packed uint8 `[rows, d/2 +
    d/32]` (as `index_scores`; the pool); block_table:
    int `[sequences, blocks]`; tok_slot, visible: int `[m]`; out: None or bf16 `[m,
    width]`. Rows j ≥ visible[t] are −∞ and neither their table entries nor their keys
    are read (a table entry of an unallocated block may hold anything, e.g. −1). Each
    entry's bits are those of `index_scores` of the token over its sequence's keys.
    `prefill`: the prefill regime's launch shape (as `index_scores`; a program's tokens of
    the first one's sequence share its key tiles, the others read their own)."""
    _check_paged(iq, weights, keys, block_table, tok_slot, block_rows, visible, width, out)
    require_triton("index_scores_paged", iq, weights, keys, visible, block_table, tok_slot)
    m, H, d = iq.shape
    if out is None:
        out = torch.empty(m, width, dtype=torch.bfloat16, device=iq.device)
    if m == 0:
        return out
    cfg = _tune(tune, _PAGED_TUNE, prefill)
    grid = (triton.cdiv(m, cfg["tok"]), triton.cdiv(width, cfg["block_l"] * cfg["sub"]))
    _index_scores_kernel[grid](
        iq, weights, keys, visible, out, m, width,
        iq.stride(0), iq.stride(1), weights.stride(0), weights.stride(1), keys.stride(0), out.stride(0),
        block_table, tok_slot, block_table.stride(0),
        H=H, D=d, H_P=max(16, triton.next_power_of_2(H)), D_P=triton.next_power_of_2(d), BLOCK_L=cfg["block_l"],
        SUB=cfg["sub"], TOK=cfg["tok"], DOT_F32=interpreting(), PAGED=True, BLOCK_ROWS=block_rows, PACKED=keys.dtype == torch.uint8,
        WORDS=keys.dtype == torch.uint8 and fp4_words_ok(keys), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **pdl_launch(iq),
    )  # fmt: skip
    return out


def index_scores_paged_torch(
    iq, weights, keys, block_table, tok_slot, block_rows, visible, width, out=None, prefill: bool = False
):
    """Twin of `index_scores_paged` (same contract; `prefill` changes nothing): per run of tokens of one sequence,
    the reference scores over its first `width` logical key rows, gathered through the
    table (entries of unallocated blocks read as row 0: their scores are −∞ anyway)."""
    _check_paged(iq, weights, keys, block_table, tok_slot, block_rows, visible, width, out)
    m = iq.shape[0]
    res = torch.empty(m, width, dtype=torch.bfloat16, device=iq.device) if out is None else out
    slots = tok_slot.tolist()
    j = torch.arange(width, device=iq.device)
    a = 0
    while a < m:
        b = a
        while b < m and slots[b] == slots[a]:
            b += 1
        blk = block_table[slots[a], j // block_rows].long().clamp_min(0)
        rows = _unpacked(keys[blk * block_rows + j % block_rows], iq.shape[2])
        res[a:b] = _ref.index_scores(iq[a:b], weights[a:b], rows, visible[a:b])
        a = b
    return res


if HAVE_TRITON:

    @triton.jit
    def _key_tile(
        k_ptr, tbl_ptr, slot, s_tbl, s_k, j64, k_ok, c, c_ok, D, D_P: tl.constexpr, PAGED: tl.constexpr,
        BLOCK_ROWS: tl.constexpr, PACKED: tl.constexpr, WORDS: tl.constexpr,
    ):  # fmt: skip
        """[BLOCK_L, D_P] bf16 keys of logical rows j64 (of sequence `slot` when PAGED);
        rows where k_ok is False are not read (0)."""
        if PAGED:
            # logical row j of the sequence: block table[slot, j // B], row j % B
            blk = tl.load(tbl_ptr + slot * s_tbl + j64 // BLOCK_ROWS, mask=k_ok, other=0).to(tl.int64)
            rows = blk * BLOCK_ROWS + j64 % BLOCK_ROWS
        else:
            rows = j64
        if PACKED:
            # fp4_e8m0 rows (attnv41.packed): D/2 code bytes (value 2i in the low nibble),
            # then D/32 e8m0 scale bytes; code · 2^(e − 127) is the bf16 key exactly
            k = fp4_rows(k_ptr + rows * s_k, k_ok, 0, D, D_P, 32, True, WORDS).to(tl.bfloat16)
        else:
            k = tl.load(k_ptr + rows[:, None] * s_k + c[None, :], mask=k_ok[:, None] & c_ok[None, :], other=0.0)
        return k

    @triton.jit
    def _index_scores_kernel(
        iq_ptr,
        w_ptr,
        k_ptr,
        vis_ptr,
        out_ptr,
        M,
        L,
        s_iq_m,
        s_iq_h,
        s_w_m,
        s_w_h,
        s_k,
        s_out,
        tbl_ptr,
        slot_ptr,
        s_tbl,
        H: tl.constexpr,
        D: tl.constexpr,
        H_P: tl.constexpr,
        D_P: tl.constexpr,
        BLOCK_L: tl.constexpr,
        SUB: tl.constexpr,
        TOK: tl.constexpr,
        DOT_F32: tl.constexpr,
        PAGED: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        PACKED: tl.constexpr,
        WORDS: tl.constexpr,  # packed key rows start 4-byte aligned (packed_rows.fp4_words_ok)
        PDL: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # program (tb, lb): tokens tb·TOK … tb·TOK + TOK − 1 (the prefill regime: TOK > 1;
        # decode: TOK = 1), keys lb·SUB·BLOCK_L … +SUB·BLOCK_L−1 in SUB blocks of BLOCK_L (a
        # loop, the key loads pipelined), all heads. Each block's key tile is loaded once
        # for the tokens of the first token's sequence (a prompt chunk: all of them) and
        # each token's dot, epilogue and store are those of a program of one token, so a
        # score's bits do not depend on TOK, SUB or BLOCK_L's neighbours (GPU tests check it).
        t0 = tl.program_id(0).to(tl.int64) * TOK
        lb = tl.program_id(1)
        # [H_P] head h, [D_P] channel c
        h = tl.arange(0, H_P)
        c = tl.arange(0, D_P)
        h_ok = h < H
        c_ok = c < D
        h64 = h.to(tl.int64)
        slot0 = tl.load(slot_ptr + t0).to(tl.int64) if PAGED else t0 * 0
        # the widest visible count among the tokens sharing the first token's keys
        vmax = tl.load(vis_ptr + t0).to(tl.int64)
        for i in tl.static_range(1, TOK):
            ok_i = t0 + i < M
            v_i = tl.load(vis_ptr + t0 + i, mask=ok_i, other=0).to(tl.int64)
            if PAGED:
                ok_i = ok_i & (tl.load(slot_ptr + t0 + i, mask=ok_i, other=-1).to(tl.int64) == slot0)
            vmax = tl.maximum(vmax, tl.where(ok_i, v_i, 0))
        if TOK == 1:
            # [H_P, D_P] the token's index queries (padded heads are 0), [H_P] head weights
            # (padded heads are 0, so they add 0): loaded once for every block
            q1 = tl.load(
                iq_ptr + t0 * s_iq_m + h64[:, None] * s_iq_h + c[None, :],
                mask=h_ok[:, None] & c_ok[None, :],
                other=0.0,
            )
            w1 = tl.load(w_ptr + t0 * s_w_m + h64 * s_w_h, mask=h_ok, other=0.0).to(tl.float32)
        for sb in range(SUB):
            # [BLOCK_L] key row j
            j = (lb * SUB + sb) * BLOCK_L + tl.arange(0, BLOCK_L)
            j_ok = j < L
            j64 = j.to(tl.int64)
            # [BLOCK_L, D_P] index keys; rows past the visible count are not read (their
            # scores are −∞ whatever they hold), so a wide L costs no key traffic
            k0 = _key_tile(
                k_ptr, tbl_ptr, slot0, s_tbl, s_k, j64, j_ok & (j64 < vmax), c, c_ok, D, D_P,
                PAGED, BLOCK_ROWS, PACKED, WORDS,
            )  # fmt: skip
            for i in tl.static_range(TOK):
                t = t0 + i
                ok_t = t < M
                if TOK == 1:
                    q = q1
                    w = w1
                    vis = vmax
                    k = k0
                else:
                    q = tl.load(
                        iq_ptr + t * s_iq_m + h64[:, None] * s_iq_h + c[None, :],
                        mask=ok_t & h_ok[:, None] & c_ok[None, :],
                        other=0.0,
                    )
                    w = tl.load(w_ptr + t * s_w_m + h64 * s_w_h, mask=ok_t & h_ok, other=0.0).to(tl.float32)
                    vis = tl.load(vis_ptr + t, mask=ok_t, other=0).to(tl.int64)
                    if PAGED:  # a token of another sequence (a mixed step) reads its own keys
                        slot = tl.load(slot_ptr + t, mask=ok_t, other=-1).to(tl.int64)
                        k = k0
                        if ok_t & (slot != slot0):
                            k = _key_tile(
                                k_ptr, tbl_ptr, slot, s_tbl, s_k, j64, j_ok & (j64 < vis), c, c_ok, D, D_P, PAGED,
                                BLOCK_ROWS, PACKED, WORDS,
                            )  # fmt: skip
                    else:
                        k = k0
                # [H_P, BLOCK_L] dots in fp32, rounded to bf16, ReLU
                if DOT_F32:
                    dots = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
                else:
                    dots = tl.dot(q, tl.trans(k), out_dtype=tl.float32)
                dots = tl.maximum(round_bf16(dots).to(tl.float32), 0.0)
                # [H_P, BLOCK_L] weighted, rounded to bf16
                prod = round_bf16(dots * w[:, None]).to(tl.float32)
                # [BLOCK_L] sum over heads in fp32, rounded to bf16; −inf past the visible rows
                s = tl.sum(prod, axis=0)
                s = tl.where(j64 < vis, s, float("-inf"))
                tl.store(out_ptr + t * s_out + j64, round_bf16(s), mask=j_ok & ok_t)
