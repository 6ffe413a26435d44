"""Lightning-indexer scores on the device (attention-v41.md §6.4): `index_scores`
(Triton) and `index_scores_torch`.

Twin: `attnv41.reference.indexer.index_scores`.
"""

from __future__ import annotations

import torch

from ..reference import indexer as _ref
from ._triton import HAVE_TRITON, interpreting, pdl_launch, require_triton, tl, triton
from .packed_rows import fp4_words_mode
from .select import gathered_rows

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait, round_bf16, round_bf16_inner
    from .packed_rows import fp4_rows_bf16

__all__ = ["index_scores", "index_scores_torch", "index_scores_paged", "index_scores_paged_torch"]

_INT = (torch.int32, torch.int64)
_BLOCK_L = 64  # keys per program
# The launch shape (a constant: a key's bits never depend on m or L): keys per block,
# blocks per program (a loop), warps, pipeline stages, skip (below), keys_m (below).
# scripts/batch_kernel_probe.py times alternatives (in a batched step, or at m = 1).
# keys_m=True: the keys are the MMA's 64 rows and the heads its columns (a warpgroup MMA at
# 4 warps); the sum over heads then stays within a thread and its quad instead of crossing
# warps, in another fp32 order than keys_m=False (the reference's contract allows any: one
# score of 1M differed by one bf16 ulp on the H200). H200, 2026-12-03 (batch_kernel_probe,
# the kernels alone, with round_bf16's hardware form): 1,048,000 keys at m = 1 75.2 µs
# against 81.6 (keys_m=False, 1 block, 4 warps, 3 stages; packed 92.7 against 105.7); B = 64
# at 32K on a batched step's own inputs 78.9 against 82.9 (keys_m=False, 4 blocks, 2 warps,
# 2 stages; packed 93.3 against 101.1). Both entry points take the same shape, so a token's
# scores have the same bits through either (the runtimes' equality tests rely on it).
_TUNE = dict(
    block_l=_BLOCK_L,
    sub=2,
    num_warps=4,
    num_stages=2,
    skip=True,
    keys_m=True,
    fp4_asm=True,
    maxnreg_packed=80,
    inner_cvt=True,
    sub_packed=None,
    sub_tokens=1,
    scale_word=True,
    lut=False,
    epi2=False,
    one_word=False,
    row0=False,
)
# inner_cvt (2026-12-04, twelfth entry): the epilogue's two inner roundings (the dot, the
# weighted product) by `round_bf16_inner`, the hardware conversion two values at a time
# without the NaN test and select: the same bits in every case (the comment in the kernel).
# Offline sm_90, packed keys: 792 → 712 instructions (False: the round_bf16 form before).
# maxnreg_packed: a register cap over packed keys (`_maxnreg`; None: none). Offline sm_90:
# 92 registers uncapped (5 programs of 4 warps per SM), 80 with no spill (6), 64 with 2
# spilled values (8). H200 (twelfth entry, batch_kernel_probe, L2 flushed; packed keys):
# 1M keys at m = 1 71.4 µs at 80 against 74.3 uncapped and 78.3 at 64; a B = 64 step's
# ratio-1 call (32K keys each) 138.8 against 146.5 and 150.7; whole B = 64, 32K steps
# (ab_steps.py) 8.291 against 8.332 ms. Production: 80.
# sub_packed: blocks per program over packed keys (None: `sub`). sub_tokens: blocks per program
# under the `tokens` option, either key format: a prompt's launch has programs enough, and one
# block each keeps more of them on the SMs. H100, 2026-12-06 (index_prefill_probe, paged, µs,
# tokens 16, sub 2 (packed 4) → 1): a 64-token tile at a 1M context, 90 % visible, bf16
# 1,869 → 1,679, packed 1,989 → 1,977; 55 % visible 1,177 → 1,054 and 1,326 → 1,237; a
# 2,048-token chunk over 29,490 keys 1,904 → 1,729 and 2,160 → 2,061. The same bytes.
# lut (thirty-third entry): packed keys by `packed_rows`' table-lookup PTX (WORDS = 4: each
# code word's eight values in column order, no pairs of words to regroup, one bf16x2
# multiply per two values instead of two). epi2: the epilogue's round, max with 0 and
# weight multiply on bf16 pairs (`_relu_weighted`, three instructions per two values; CUDA
# only). Offline sm_90, the paged launch at B = 64 over packed keys: 457 → 374 instructions
# per loop iteration (a block of 64 keys) with both; at m = 1 over 1M keys 556 → 478. The
# same bytes (the GPU tests: every code and scale; −0, ±2^-140, NaN and inf dots).
# prefetch (thirty-third entry; removed after its run): with lut, each block's code and scale
# words loaded one block ahead, in registers (80, no local memory). Slower on an H100
# (2026-12-06, batch_kernel_probe, L2 flushed, lut + epi2 without / with it): 1M keys at
# m = 1 66.2 / 83.2 µs (uncapped 75.8), a B = 64 step's ratio-1 call 127.5 / 132.2; whole
# B = 64, 32K FP8 steps over packed caches (ab_steps.py) 9.041 / 9.116 ms.
# scale_word (twelfth entry): packed keys through `packed_rows.fp4_words_mode`'s WORDS = 3,
# each row's four e8m0 scales as one word (no shared round trip of the code words; offline
# sm_90, the paged launch at B = 64: 720 → 680 instructions). H200: 1M keys at m = 1 67.6 µs
# against 71.7 (the scale tile); a B = 64 step's ratio-1 call 130.9 against 139.4; whole
# B = 64, 32K steps 8.252 against 8.319 ms. The same bytes.
# one_word, row0 (fiftieth entry; off): the paged launch's packed code words one per thread.
# Production there gets Triton's [1, 4] over [8, 4] threads (four contiguous words a thread:
# a warp over 8 rows, 9.5 of 32 bytes per sector used, and two-way bank conflicts in the
# dequantized tile's 16-byte stores, the forty-ninth entry's ncu counters); the full form
# (m = 1) and the gathered form already get [1, 1] over [2, 16] (a warp over two whole rows).
# one_word: `packed_rows.fp4_words_mode`'s WORDS = 5 (the load over the transposed tensor);
# row0: `_key_rows`' one table entry per block of keys, which gives that layout by itself.
# Offline sm_90 (B = 64, paged, packed): 680 instructions, 80 registers; one_word 880 (each
# thread's 8 rows, 8 table loads and 64-bit row addresses); row0 776; both 768. Slower on an
# H100 (batch_kernel_probe, a B = 64 step's ratio-1 call, L2 flushed, µs): production 121.7,
# one_word 151.4, row0 125.7, both 126.7 (row0 sub 2 / 8: 127.7 / 125.1; cap 72 / uncapped:
# 129.4 / 129.5); the B = 64, 32K FP8 step over packed caches 8.537 / 8.541 (row0) / 8.638
# (both) ms. The same bytes (GPU tests). So the conflicts and the sector waste do not bound
# this kernel: removing them costs more in per-row address work than they take.
# `index_scores_paged` (the batched runtime's)
_PAGED_TUNE = dict(_TUNE, sub_packed=4, gluon=True)
# gluon (on since the fifty-first entry): over packed keys of 128 values with at most 32 heads
# on an sm_90 GPU, one token per program group (full and gathered forms) runs
# `indexer_gluon.index_scores_paged_gluon` with this kernel's bits (the GPU tests and the
# probe on a step's inputs: the same bytes), at `GLUON_INDEX_TUNE`'s default: `afrag` (the
# code words loaded in the MMA's A-fragment layout, a byte transpose within each quad of
# lanes, no shared-memory tile) with `slice_out`. H100 (fifty-first entry): a B = 64 step's
# ratio-1 call 103.6 µs against this kernel's 122.0 (batch_kernel_probe, L2 flushed); the
# B = 64, 32K FP8 step over packed caches 8.295 / 8.316 / 8.302 ms against 8.497 / 8.498 /
# 8.529 (three runs; bf16 caches 8.545 / 8.529 / 8.552); the quick tier with it on: 1,791 passed (5
# failures: tests of the cp.async shapes written for the old defaults, since given them explicitly).
# Its first form (forty-eighth entry: the words streamed through shared-memory stages by
# cp.async, `stages` 4, still a tune) was slower on an H100 (batch_kernel_probe, a B = 64 step's
# ratio-1 call: 151-170 µs over its shapes against 121.5; the B = 64, 32K FP8 step over
# packed caches 8.747 against 8.513 ms). Nsight Compute on this kernel's packed launch there:
# L1/TEX 80 % busy, DRAM 37 % (its 4-byte loads of the 68-byte rows use 9.5 of 32 bytes per
# sector; 7.2-way bank conflicts on 43 % of the shared-store wavefronts); over bf16 keys
# DRAM 88 %, L1/TEX 50 %. The packed launch is bound by the L1 pipe, not by load latency.
# sub_packed=4 (twelfth entry): over packed keys the paged launch takes 4 blocks per program.
# H200: a B = 64 step's ratio-1 call 120.9 against 130.9 µs (batch_kernel_probe), whole B =
# 64, 32K steps 8.201 against 8.258 ms (ab_steps, rounds' ranges apart); the same bytes. At
# m = 1 over 1M keys (`_TUNE`) 4 blocks lose (110.9 against 67.6 µs), so `_TUNE` keeps 2.
# skip=True (both shapes): a block of keys wholly past the token's visible count stores −∞
# without its loads' address math, dot and epilogue, so a chunk's time follows its visible
# rows, not the context bucket's width. H200 (scripts/index_prefill_probe.py, 2026-12-03
# seventh entry), a 64-token tile in the 1M bucket at 55 % visible: 2.55 ms against 4.24
# (bf16 keys), 3.45 against 6.03 (packed); at 90 %: 4.00 against 4.24, 5.48 against 6.05;
# a 2,048-token chunk in the 32K bucket: 4.04 against 4.21. Every score's bytes equal.
# skip_program (thirty-fourth entry; removed after its run): a program whose blocks all lie
# past the token's visible rows storing −∞ alone, the others' loop without the per-block
# branch (with skip=False), so that Triton's pipeliner loads the keys ahead (offline sm_90:
# 16-32 asynchronous copies, none in production). H200, 2026-12-06 (thirty-fifth entry;
# scripts/batch_kernel_probe.py, L2 flushed, µs, production / skip_program): m = 1 over
# 1,048,000 keys, bf16 75.6 / 75.1, packed 67.7 / 152.8 (skip=False alone: 154.3); B = 64
# paged at 32K, bf16 140.2 / 141.6, packed 120.5 / 146.7; the B = 64 FP8 step over packed
# caches (ab_steps.py) 8.773 / 8.946 ms. Not profiled.
_MAX_HEADS = 64  # one [H_P, d] query tile per program (H_P · d · 2 bytes ≤ 32 KiB)
_MAX_DIM = 256


def _packed_width(d: int) -> int:
    """Bytes of one packed index key of d values (fp4_e8m0, `attnv41.packed`)."""
    return d // 2 + d // 32


_TOKENS_MAX = 16


def _check_tokens(tokens, ids) -> None:
    """The `tokens` launch option: a power of two 1.._TOKENS_MAX, and 1 with ids."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1 or tokens > _TOKENS_MAX:
        raise ValueError(f"tokens = {tokens!r}; allowed: 1, 2, 4, 8 or {_TOKENS_MAX}")
    if tokens & (tokens - 1):
        raise ValueError(f"tokens = {tokens!r}; allowed: 1, 2, 4, 8 or {_TOKENS_MAX} (a power of two)")
    if tokens > 1 and ids is not None:
        raise ValueError(f"tokens = {tokens} with ids; allowed: 1 (the gathered form scores each token's own rows)")


def _check_ids(ids, cand_block, m: int, device) -> int:
    """The gathered form's `ids` / `cand_block` (`index_scores`' doc); returns its output
    width (ids.shape[1] · cand_block)."""
    if isinstance(cand_block, bool) or not isinstance(cand_block, int) or cand_block < 1:
        raise ValueError(f"cand_block = {cand_block!r}; allowed: an int >= 1 (with ids)")
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int32 or ids.dim() != 2 or ids.shape[0] != m:
        got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids = {got}; allowed: torch.int32 [m, blocks] with m = {m}")
    if ids.device != device:
        raise ValueError(f"ids.device = {ids.device}; allowed: iq.device = {device}")
    if ids.shape[1] > 1 and ids.stride(1) != 1:
        raise ValueError(f"ids.stride(1) = {ids.stride(1)}; allowed: 1")
    return ids.shape[1] * cand_block


def _gathered(full: torch.Tensor, ids: torch.Tensor, cand_block: int, visible: torch.Tensor, nk: int) -> torch.Tensor:
    """The gathered scores from full ones `[m, nk]`: entry e of token t is full[t, row(e)],
    −∞ where row(e) ≥ min(visible[t], nk) (a padding id's rows included)."""
    m, n = ids.shape[0], ids.shape[1] * cand_block
    rows = gathered_rows(ids, cand_block, torch.arange(n, device=ids.device).expand(m, n))
    live = rows < torch.clamp(visible.long(), max=nk)[:, None]
    g = torch.gather(full, 1, torch.where(live, rows, 0)) if nk > 0 else torch.zeros_like(rows, dtype=full.dtype)
    return torch.where(live, g, torch.full_like(g, float("-inf")))


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
    iq, weights, keys, visible, out: torch.Tensor | None = None, *, ids=None, cand_block: int = 0, tokens: int = 1
) -> torch.Tensor:
    """Fallback of `index_scores` (same contract), the reference twin. `tokens` (a launch
    option of the kernel, checked) does not change any result."""
    _check_tokens(tokens, ids)
    if ids is None:
        _check(iq, weights, keys, visible, out)
        s = _ref.index_scores(iq, weights, _unpacked(keys, iq.shape[2]), visible)
        return s if out is None else out.copy_(s)
    _check(iq, weights, keys, visible, None)
    n = _check_ids(ids, cand_block, iq.shape[0], iq.device)
    _check_out_width(out, iq.shape[0], n, iq.device)
    L = keys.shape[0]
    full = _ref.index_scores(iq, weights, _unpacked(keys, iq.shape[2]), visible.clamp(max=L))
    s = _gathered(full, ids, cand_block, visible, L)
    return s if out is None else out.copy_(s)


def _check_out_width(out, m: int, n: int, device) -> None:
    if out is None:
        return
    if out.dtype != torch.bfloat16 or tuple(out.shape) != (m, n) or out.device != device:
        raise ValueError(
            f"out = {out.dtype} {tuple(out.shape)} on {out.device}; allowed: torch.bfloat16 [{m}, {n}] on {device}"
        )
    if n > 1 and out.stride(1) != 1:
        raise ValueError(f"out.stride(1) = {out.stride(1)}; allowed: 1")


def _unpacked(keys: torch.Tensor, d: int) -> torch.Tensor:
    """bf16 keys as they are; packed fp4_e8m0 rows unpacked (exact)."""
    if keys.dtype != torch.uint8:
        return keys
    from ..packed import unpack  # noqa: PLC0415

    return unpack(keys, "fp4_e8m0", d)


def index_scores(
    iq,
    weights,
    keys,
    visible,
    out: torch.Tensor | None = None,
    *,
    ids=None,
    cand_block: int = 0,
    tokens: int = 1,
    **tune,
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

    out: None (allocate) or bf16 `[m, L]`; returned. No host synchronisation. `tune`
    (block_l, sub, num_warps, num_stages, skip, keys_m) is for the tuning script only: the launch shape
    is a constant (`_TUNE`) in the runtime.

    ids, cand_block (the gathered form: a reindex layer scoring only its candidates): ids
    int32 `[m, nc]`, the blocks of cand_block rows each token scores; the output is bf16
    `[m, nc · cand_block]`, entry e of token t the score of row `ids[t, e // cand_block] ·
    cand_block + e % cand_block` (−∞ where that row is ≥ min(L_t, L): a padding id such as
    ⌈L / cand_block⌉ scores −∞ and reads nothing). Each entry has the bits of the same row
    in the full form (the same per-row arithmetic).

    tokens (a launch option: the same bits for any value; 1 with ids): one program scores
    this many consecutive tokens over the same keys, each block of keys loaded (and
    dequantized) once for all of them, where one would load it per token. For a prompt's
    tokens (one sequence's keys, the prefill regime); a decode step keeps 1.
    """
    _check_tokens(tokens, ids)
    if ids is None:
        _check(iq, weights, keys, visible, out)
        n = keys.shape[0]
    else:
        _check(iq, weights, keys, visible, None)
        n = _check_ids(ids, cand_block, iq.shape[0], iq.device)
        _check_out_width(out, iq.shape[0], n, iq.device)
    m, H, d = iq.shape
    L = keys.shape[0]
    require_triton("index_scores", iq, weights, keys, visible, *([] if ids is None else [ids]))
    if out is None:
        out = torch.empty(m, n, dtype=torch.bfloat16, device=iq.device)
    if m == 0 or n == 0:
        return out
    if L == 0:  # gathered over no keys: every entry −∞
        return out.fill_(float("-inf"))
    cfg = _tune(tune)
    sub = _sub(cfg, keys, tokens)
    grid = (triton.cdiv(m, tokens), triton.cdiv(n, cfg["block_l"] * sub))
    _index_scores_kernel[grid](
        iq,
        weights,
        keys,
        visible,
        out,
        n,
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
        SUB=sub,
        SKIP=cfg["skip"],
        KEYS_M=cfg["keys_m"],
        INNER=cfg["inner_cvt"],
        # Triton 3.6's interpreter multiplies bf16 tiles as their raw uint16 bits; there
        # the tiles go to fp32 first (exact: same products, fp32 accumulation).
        DOT_F32=interpreting(),
        PAGED=False,
        BLOCK_ROWS=1,
        PACKED=keys.dtype == torch.uint8,
        WORDS=_words(cfg, keys, d),
        EPI2=cfg["epi2"] and not interpreting(),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **_maxnreg(cfg, keys),
        **_gather(ids, cand_block, L),
        **_tokens(tokens, m),
        **pdl_launch(iq),
    )
    return out


def _tokens(tokens: int, m: int) -> dict:
    """The kernel's tokens-per-program arguments (none at 1: its launch unchanged)."""
    return {} if tokens == 1 else dict(M=m, TM=tokens)


def _gather(ids, cand_block: int, nk: int) -> dict:
    """The kernel's gathered-form arguments (none for the full form: its launch unchanged)."""
    if ids is None:
        return {}
    return dict(ids_ptr=ids, s_ids=ids.stride(0), NK=nk, GATHER=True, CB=cand_block)


def _words(cfg: dict, keys: torch.Tensor, d: int) -> int:
    """The kernel's WORDS (`packed_rows.fp4_words_mode`) over packed keys of d values; 0
    over bf16 keys."""
    if keys.dtype != torch.uint8:
        return 0
    return fp4_words_mode(keys, cfg["fp4_asm"], cfg["scale_word"], cfg["lut"], d, 32, cfg["one_word"])


def _row0(cfg: dict, block_rows: int, ids) -> dict:
    """The paged launch's ROW0 (`_key_rows`): cfg's row0 where a block of keys lies in one
    table block (block_rows a multiple of block_l) and the rows are the full form's (no ids)."""
    on = cfg["row0"] and ids is None and block_rows % cfg["block_l"] == 0
    return {"ROW0": True} if on else {}


def _maxnreg(cfg: dict, keys: torch.Tensor) -> dict:
    """The launch's register cap (ptxas .maxnreg): `maxnreg_packed` over packed keys, none
    over bf16 keys or when None. It changes the allocation, not the arithmetic."""
    cap = cfg["maxnreg_packed"]
    return {"maxnreg": cap} if cap and keys.dtype == torch.uint8 else {}


def _sub(cfg: dict, keys: torch.Tensor, tokens: int) -> int:
    """Blocks per program: `sub_tokens` under the `tokens` option (tokens > 1), else
    `sub_packed` over packed keys when set, else `sub` (a loop over blocks computed alone:
    the same bits either way)."""
    if tokens > 1:
        return cfg["sub_tokens"]
    sp = cfg["sub_packed"]
    return sp if sp is not None and keys.dtype == torch.uint8 else cfg["sub"]


def _gluon_takes(iq, keys, tokens: int) -> bool:
    """Whether `index_scores_paged`'s `gluon` option applies to a call: packed keys of 128
    values, at most 32 heads, one token per program group, an sm_90 GPU (by the geometry
    and the key format, never by m)."""
    from .indexer_gluon import HAVE_GLUON  # noqa: PLC0415

    return (
        HAVE_GLUON
        and not interpreting()
        and keys.dtype == torch.uint8
        and iq.shape[2] == 128
        and iq.shape[1] <= 32
        and tokens == 1
        and iq.device.type == "cuda"
        and torch.cuda.get_device_capability(iq.device) == (9, 0)
    )


def _tune(tune: dict, base: dict = _TUNE) -> dict:
    """The launch shape: `base` with the tuning script's overrides (checked)."""
    bad = set(tune) - set(base)
    if bad:
        raise ValueError(f"tune keys {sorted(bad)}; allowed: {sorted(base)}")
    return {**base, **tune}


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


def _check_paged_call(
    iq, weights, keys, block_table, tok_slot, block_rows, visible, width, out, ids, cand_block
) -> int:
    """`index_scores_paged`'s argument checks, full or gathered form (ids); returns the
    output width (width, or ids.shape[1] · cand_block)."""
    if ids is None:
        _check_paged(iq, weights, keys, block_table, tok_slot, block_rows, visible, width, out)
        return width
    _check_paged(iq, weights, keys, block_table, tok_slot, block_rows, visible, width, None)
    n = _check_ids(ids, cand_block, iq.shape[0], iq.device)
    _check_out_width(out, iq.shape[0], n, iq.device)
    return n


def index_scores_paged(
    iq,
    weights,
    keys,
    block_table,
    tok_slot,
    block_rows,
    visible,
    width,
    out=None,
    *,
    ids=None,
    cand_block=0,
    tokens: int = 1,
    **tune,
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
    ids, cand_block: the gathered form (`index_scores`' doc) over the logical rows < width;
    out then bf16 `[m, ids.shape[1] · cand_block]`. tokens: `index_scores`' launch option;
    a group of consecutive tokens shares its key loads when they are of one slot (each
    scores alone otherwise: a decode step's tokens of many sequences keep 1)."""
    _check_tokens(tokens, ids)
    n = _check_paged_call(iq, weights, keys, block_table, tok_slot, block_rows, visible, width, out, ids, cand_block)
    m, H, d = iq.shape
    extra = [] if ids is None else [ids]
    require_triton("index_scores_paged", iq, weights, keys, visible, block_table, tok_slot, *extra)
    if out is None:
        out = torch.empty(m, n, dtype=torch.bfloat16, device=iq.device)
    if m == 0:
        return out
    cfg = _tune(tune, _PAGED_TUNE)
    if cfg["gluon"] and _gluon_takes(iq, keys, tokens):
        from .indexer_gluon import index_scores_paged_gluon  # noqa: PLC0415

        return index_scores_paged_gluon(
            iq, weights, keys, block_table, tok_slot, block_rows, visible, width, out, ids=ids, cand_block=cand_block
        )
    sub = _sub(cfg, keys, tokens)
    grid = (triton.cdiv(m, tokens), triton.cdiv(n, cfg["block_l"] * sub))
    _index_scores_kernel[grid](
        iq, weights, keys, visible, out, n,
        iq.stride(0), iq.stride(1), weights.stride(0), weights.stride(1), keys.stride(0), out.stride(0),
        block_table, tok_slot, block_table.stride(0),
        H=H, D=d, H_P=max(16, triton.next_power_of_2(H)), D_P=triton.next_power_of_2(d), BLOCK_L=cfg["block_l"],
        SUB=sub, SKIP=cfg["skip"], KEYS_M=cfg["keys_m"], INNER=cfg["inner_cvt"], DOT_F32=interpreting(), PAGED=True, BLOCK_ROWS=block_rows, PACKED=keys.dtype == torch.uint8,
        WORDS=_words(cfg, keys, d), EPI2=cfg["epi2"] and not interpreting(),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **_maxnreg(cfg, keys), **_gather(ids, cand_block, width), **_tokens(tokens, m),
        **_row0(cfg, block_rows, ids), **pdl_launch(iq),
    )  # fmt: skip
    return out


def index_scores_paged_torch(
    iq, weights, keys, block_table, tok_slot, block_rows, visible, width, out=None, *, ids=None, cand_block=0, tokens=1
):
    """Twin of `index_scores_paged` (same contract): per run of tokens of one sequence,
    the reference scores over its first `width` logical key rows, gathered through the
    table (entries of unallocated blocks read as row 0: their scores are −∞ anyway).
    `tokens` (the kernel's launch option, checked) does not change any result."""
    _check_tokens(tokens, ids)
    m = iq.shape[0]
    if ids is not None:
        _check_paged(iq, weights, keys, block_table, tok_slot, block_rows, visible, width, None)
        n = _check_ids(ids, cand_block, m, iq.device)
        _check_out_width(out, m, n, iq.device)
        full = index_scores_paged_torch(iq, weights, keys, block_table, tok_slot, block_rows, visible, width)
        s = _gathered(full, ids, cand_block, visible, width)
        return s if out is None else out.copy_(s)
    _check_paged(iq, weights, keys, block_table, tok_slot, block_rows, visible, width, out)
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
    # `_relu_weighted`'s PTX, two values per instance: the dots $1, $2 (fp32) rounded to a
    # bf16 pair, their max with 0, times the weights' pair $3, rounded (the product of two
    # bf16 values is exact in fp32, so one bf16x2 multiply gives round_bf16 of it).
    _RELU_W = tl.constexpr(
        "{\n.reg .b32 t, z;\nmov.b32 z, 0;\ncvt.rn.bf16x2.f32 t, $2, $1;\nmax.bf16x2 t, t, z;\n"
        "mul.rn.bf16x2 $0, t, $3;\n}"
    )

    @triton.jit
    def _relu_weighted(dots, w):
        """[same shape] bf16: round_bf16(max(round_bf16(dots), 0) · w) (w bf16, dots fp32)
        in three instructions per two values (CUDA only: EPI2); the same bits as the
        epilogue's fp32 forms (INNER and the select form), −0 dots and dots in (−2^-134, 0)
        (they round to −0 before the max with 0) included: the GPU tests compare them
        (H100, thirty-third entry: equal)."""
        return tl.inline_asm_elementwise(_RELU_W, "=r,r,r,r", [dots, w], dtype=tl.bfloat16, is_pure=True, pack=2)

    @triton.jit
    def _key_rows(k_ptr, s_k, tbl_ptr, slot, s_tbl, jr, k_ok, j0, ok0, PAGED: tl.constexpr,
                  BLOCK_ROWS: tl.constexpr, ROW0: tl.constexpr):  # fmt: skip
        """[BLOCK_L] pointers to the pool rows of logical key rows jr (int64) of the sequence
        in `slot` (PAGED: block table[slot, jr // B], row jr % B; else jr); table entries are
        read only where k_ok. ROW0 (PAGED; the host's `_row0`): jr = j0 + 0 … BLOCK_L − 1
        within one table block (B a multiple of BLOCK_L, j0 of BLOCK_L), its entry read
        once (where ok0, the first row's k_ok: k_ok is a prefix) and the pointers the
        first row's plus 32-bit offsets. The same rows either way."""
        if ROW0:
            blk = tl.load(tbl_ptr + slot * s_tbl + j0 // BLOCK_ROWS, mask=ok0, other=0).to(tl.int64)
            r0 = blk * BLOCK_ROWS + j0 % BLOCK_ROWS
            BL: tl.constexpr = jr.shape[0]
            base = (k_ptr + r0 * s_k) + tl.arange(0, BL) * s_k
        else:
            if PAGED:
                blk = tl.load(tbl_ptr + slot * s_tbl + jr // BLOCK_ROWS, mask=k_ok, other=0).to(tl.int64)
                rows = blk * BLOCK_ROWS + jr % BLOCK_ROWS
            else:
                rows = jr
            base = k_ptr + rows * s_k
        return base

    @triton.jit
    def _key_tile(base, k_ok, c, c_ok, D, D_P: tl.constexpr, PACKED: tl.constexpr, WORDS: tl.constexpr):
        """[BLOCK_L, D_P] bf16 index keys of the pool rows at `base` (0 where not k_ok)."""
        if PACKED:
            # fp4_e8m0 rows (attnv41.packed): D/2 code bytes (value 2i in the low nibble),
            # then D/32 e8m0 scale bytes; code · 2^(e − 127) is the bf16 key exactly
            k = fp4_rows_bf16(base, k_ok, 0, D, D_P, 32, True, WORDS)
        else:
            k = tl.load(base[:, None] + c[None, :], mask=k_ok[:, None] & c_ok[None, :], other=0.0)
        return k

    @triton.jit
    def _block_scores(k, q, w, DOT_F32: tl.constexpr, KEYS_M: tl.constexpr, INNER: tl.constexpr, EPI2: tl.constexpr):
        """[BLOCK_L] fp32: Σ_h w_h · ReLU(q_h · k_j) of one token over a block of keys k
        [BLOCK_L, D_P] (q [H_P, D_P] bf16, w [H_P] fp32), before the −∞ of rows past the
        token's visible count and the final rounding. Every caller runs this same code, so
        a score's bits do not depend on which launch form computed it."""
        # dots in fp32, rounded to bf16, ReLU; weighted, rounded to bf16; summed over
        # heads in fp32. KEYS_M: [BLOCK_L, H_P], the keys as the MMA's rows (64: a
        # warpgroup MMA at 4 warps), the heads as its columns, so the sum over heads
        # stays within a thread and its quad; else [H_P, BLOCK_L] (across warps)
        if KEYS_M:
            a_op, b_op, w_b = k, q, w[None, :]
        else:
            a_op, b_op, w_b = q, k, w[:, None]
        if DOT_F32:
            dots = tl.dot(a_op.to(tl.float32), tl.trans(b_op.to(tl.float32)), input_precision="ieee")
        else:
            dots = tl.dot(a_op, tl.trans(b_op), out_dtype=tl.float32)
        # INNER (production): round_bf16_inner, the same bits (a NaN dot becomes 0 in
        # the max either way, and a NaN product reaches memory only through the
        # sum's round_bf16, which makes it canonical)
        if EPI2:
            prod = _relu_weighted(dots, tl.broadcast_to(w_b.to(tl.bfloat16), dots.shape)).to(tl.float32)
        elif INNER:
            dots = tl.maximum(round_bf16_inner(dots), 0.0)
            prod = round_bf16_inner(dots * w_b)
        else:
            dots = tl.maximum(round_bf16(dots).to(tl.float32), 0.0)
            prod = round_bf16(dots * w_b).to(tl.float32)
        return tl.sum(prod, axis=1 if KEYS_M else 0)

    @triton.jit
    def _token_qw(iq_ptr, w_ptr, t, s_iq_m, s_iq_h, s_w_m, s_w_h, H: tl.constexpr, D: tl.constexpr,
                  H_P: tl.constexpr, D_P: tl.constexpr):  # fmt: skip
        """Token t's index queries [H_P, D_P] bf16 and head weights [H_P] fp32 (padded heads 0,
        so they add 0)."""
        # [H_P] head h, [D_P] channel c
        h = tl.arange(0, H_P)
        c = tl.arange(0, D_P)
        h_ok = h < H
        h64 = h.to(tl.int64)
        q = tl.load(
            iq_ptr + t * s_iq_m + h64[:, None] * s_iq_h + c[None, :], mask=h_ok[:, None] & (c < D)[None, :], other=0.0
        )
        w = tl.load(w_ptr + t * s_w_m + h64 * s_w_h, mask=h_ok, other=0.0).to(tl.float32)
        return q, w

    @triton.jit
    def _token_blocks(
        iq_ptr, w_ptr, k_ptr, vis_ptr, out_ptr, t, lb, L, s_iq_m, s_iq_h, s_w_m, s_w_h, s_k, s_out,
        tbl_ptr, slot_ptr, s_tbl, ids_ptr, s_ids, NK,
        H: tl.constexpr, D: tl.constexpr, H_P: tl.constexpr, D_P: tl.constexpr, BLOCK_L: tl.constexpr,
        SUB: tl.constexpr, DOT_F32: tl.constexpr, PAGED: tl.constexpr, BLOCK_ROWS: tl.constexpr,
        PACKED: tl.constexpr, WORDS: tl.constexpr, SKIP: tl.constexpr, KEYS_M: tl.constexpr,
        INNER: tl.constexpr, EPI2: tl.constexpr, GATHER: tl.constexpr, CB: tl.constexpr, ROW0: tl.constexpr,
    ):  # fmt: skip
        """Token t (int64), keys lb·SUB·BLOCK_L … +SUB·BLOCK_L−1 in SUB blocks of BLOCK_L (a
        loop: the token's queries and weights loaded once, the blocks' key loads
        pipelined), all heads; each block's bits are those of a program of one."""
        vis = tl.load(vis_ptr + t).to(tl.int64)
        c = tl.arange(0, D_P)
        c_ok = c < D
        q, w = _token_qw(iq_ptr, w_ptr, t, s_iq_m, s_iq_h, s_w_m, s_w_h, H, D, H_P, D_P)
        if PAGED:
            slot = tl.load(slot_ptr + t).to(tl.int64)
        else:
            slot = 0
        for sb in range(SUB):
            # [BLOCK_L] key row j
            j0 = (lb * SUB + sb) * BLOCK_L
            j = j0 + tl.arange(0, BLOCK_L)
            j_ok = j < L
            j64 = j.to(tl.int64)
            if GATHER:
                # entry j scores logical row ids[t, j // CB] · CB + j % CB (a kept candidate
                # block's rows; a block past the rows, e.g. the padding id, scores −∞)
                cid = tl.load(ids_ptr + t * s_ids + j64 // CB, mask=j_ok, other=0).to(tl.int64)
                jr = tl.where(j_ok, cid * CB + j64 % CB, NK)
                vis_r = tl.minimum(vis, NK)
            else:
                jr = j64
                vis_r = vis
            if SKIP:  # a block wholly past the visible rows: −∞, no dot (production: _TUNE, _PAGED_TUNE)
                if GATHER:
                    live = tl.min(jr, 0) < vis_r
                else:
                    live = j0 < vis
            else:
                live = True
            if live:
                # [BLOCK_L, D_P] index keys; rows past the visible count are not read (their
                # scores are −∞ whatever they hold), so a wide L costs no key traffic
                k_ok = j_ok & (jr < vis_r)
                base = _key_rows(
                    k_ptr, s_k, tbl_ptr, slot, s_tbl, jr, k_ok, j0, (j0 < L) & (j0 < vis_r), PAGED, BLOCK_ROWS, ROW0,
                )  # fmt: skip
                k = _key_tile(base, k_ok, c, c_ok, D, D_P, PACKED, WORDS)
                s = _block_scores(k, q, w, DOT_F32, KEYS_M, INNER, EPI2)
                # −inf past the visible rows
                s = tl.where(jr < vis_r, s, float("-inf"))
                tl.store(out_ptr + t * s_out + j64, round_bf16(s), mask=j_ok)
            else:
                tl.store(
                    out_ptr + t * s_out + j64, tl.full([BLOCK_L], float("-inf"), tl.float32).to(tl.bfloat16), mask=j_ok
                )

    @triton.jit
    def _index_scores_kernel(
        iq_ptr,
        w_ptr,
        k_ptr,
        vis_ptr,
        out_ptr,
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
        DOT_F32: tl.constexpr,
        PAGED: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        PACKED: tl.constexpr,
        WORDS: tl.constexpr,  # packed key rows: packed_rows.fp4_words_mode
        PDL: tl.constexpr = False,
        SKIP: tl.constexpr = False,
        KEYS_M: tl.constexpr = False,
        INNER: tl.constexpr = True,
        EPI2: tl.constexpr = False,
        ids_ptr=None,  # GATHER: int32 [m, ≥ L / CB] kept candidate blocks (`_gather`)
        s_ids=0,
        NK=0,  # GATHER: logical key rows that exist (rows ≥ NK score −∞, unread)
        GATHER: tl.constexpr = False,
        CB: tl.constexpr = 1,
        M=1,  # TM > 1: the tokens
        TM: tl.constexpr = 1,
        ROW0: tl.constexpr = False,  # `_key_rows`, `_row0`
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        lb = tl.program_id(1)
        if TM == 1:
            # program (t, lb): token t (`_token_blocks`)
            _token_blocks(
                iq_ptr, w_ptr, k_ptr, vis_ptr, out_ptr, tl.program_id(0).to(tl.int64), lb, L,
                s_iq_m, s_iq_h, s_w_m, s_w_h, s_k, s_out, tbl_ptr, slot_ptr, s_tbl, ids_ptr, s_ids, NK,
                H, D, H_P, D_P, BLOCK_L, SUB, DOT_F32, PAGED, BLOCK_ROWS, PACKED, WORDS, SKIP, KEYS_M, INNER,
                EPI2, GATHER, CB, ROW0,
            )  # fmt: skip
        else:
            # program (g, lb): tokens g·TM … g·TM + TM − 1 (< M) over the same keys. When they
            # are one sequence's (one slot), each block's keys are loaded (and dequantized)
            # once for all of them, up to their widest visible count, and each token's scores
            # are `_block_scores` of those keys (its own row's keys, the same code: the bits of
            # TM = 1; a key row past its visible count only moves its own −∞ score). Tokens of
            # several slots: each alone, as TM = 1. Not the gathered form (the wrapper).
            g0 = tl.program_id(0).to(tl.int64) * TM
            # [TM] the group's tokens
            tg = g0 + tl.arange(0, TM)
            tg_ok = tg < M
            vis_max = tl.max(tl.load(vis_ptr + tg, mask=tg_ok, other=0).to(tl.int64), 0)
            if PAGED:
                slot0 = tl.load(slot_ptr + g0).to(tl.int64)
                sl = tl.load(slot_ptr + tg, mask=tg_ok, other=0).to(tl.int64)
                mixed = tl.sum((tg_ok & (sl != slot0)).to(tl.int32), 0) > 0
            else:
                slot0 = g0 * 0
                mixed = False
            if mixed:
                for tt in range(TM):
                    t = g0 + tt
                    if t < M:
                        _token_blocks(
                            iq_ptr, w_ptr, k_ptr, vis_ptr, out_ptr, t, lb, L,
                            s_iq_m, s_iq_h, s_w_m, s_w_h, s_k, s_out, tbl_ptr, slot_ptr, s_tbl, ids_ptr, s_ids, NK,
                            H, D, H_P, D_P, BLOCK_L, SUB, DOT_F32, PAGED, BLOCK_ROWS, PACKED, WORDS, SKIP, KEYS_M,
                            INNER, EPI2, False, 1, ROW0,
                        )  # fmt: skip
            else:
                c = tl.arange(0, D_P)
                c_ok = c < D
                for sb in range(SUB):
                    # [BLOCK_L] key row j
                    j0 = (lb * SUB + sb) * BLOCK_L
                    j = j0 + tl.arange(0, BLOCK_L)
                    j_ok = j < L
                    j64 = j.to(tl.int64)
                    if SKIP:
                        live = j0 < vis_max
                    else:
                        live = True
                    if live:
                        # [BLOCK_L, D_P] the keys of the group's widest visible count
                        k_ok = j_ok & (j64 < vis_max)
                        base = _key_rows(
                            k_ptr, s_k, tbl_ptr, slot0, s_tbl, j64, k_ok, j0, (j0 < L) & (j0 < vis_max), PAGED,
                            BLOCK_ROWS, ROW0,
                        )  # fmt: skip
                        k = _key_tile(base, k_ok, c, c_ok, D, D_P, PACKED, WORDS)
                        # no branch in this loop (a token past M reloads token M − 1 and
                        # stores nothing), so that its query loads may be pipelined
                        for tt in range(TM):
                            t = g0 + tt
                            tc = tl.minimum(t, M - 1)
                            vis = tl.load(vis_ptr + tc).to(tl.int64)
                            q, w = _token_qw(iq_ptr, w_ptr, tc, s_iq_m, s_iq_h, s_w_m, s_w_h, H, D, H_P, D_P)
                            s = _block_scores(k, q, w, DOT_F32, KEYS_M, INNER, EPI2)
                            s = tl.where(j64 < vis, s, float("-inf"))
                            tl.store(out_ptr + tc * s_out + j64, round_bf16(s), mask=j_ok & (t < M))
                    else:
                        for tt in range(TM):
                            t = g0 + tt
                            if t < M:
                                tl.store(
                                    out_ptr + t * s_out + j64,
                                    tl.full([BLOCK_L], float("-inf"), tl.float32).to(tl.bfloat16),
                                    mask=j_ok,
                                )
