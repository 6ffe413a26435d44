"""The one table that picks each op's implementation: Triton kernels on CUDA, their
torch twins on the CPU (so the runtime runs and is tested without a GPU)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels import (
    compressor,
    fp8_linear,
    fused,
    gemv,
    indexer,
    linear,
    norm,
    paged_sel,
    qdq,
    ring,
    rope,
    select,
    tc_mm,
    topk,
)
from ..kernels import sparse_attn as sparse
from ..kernels import sparse_attn_split as sparse_split

__all__ = ["Ops", "ops_for", "compacts", "TORCH_OPS", "TRITON_OPS", "TRITON_BATCH_OPS"]


@dataclass(frozen=True)
class Ops:
    name: str
    mm: Callable
    # several weights reading one input: one launch where the GEMV serves it; `xq=` the
    # input's FP8 round trip (for FP8 weights), `rope=(i, head_dim, cos, sin, pos)` output i
    # rotated (in the GEMV's epilogue, else by the rope op after the products)
    mm_many: Callable
    group_mm: Callable  # (o, w, out, scale=None): w bf16, or FP8-stored with its e8m0 block scale (wo_a)
    rms_norm: Callable
    apply_rope: Callable
    fp8_qdq: Callable
    fp4_e8m0_qdq: Callable
    fp4_e4m3_qdq: Callable
    ring_write: Callable
    compress_pool: Callable
    index_scores: Callable
    index_scores_paged: Callable  # many sequences' tokens over a paged key pool (runtime/batch.py)
    sparse_attn: Callable  # prefill regime
    sparse_attn_decode: Callable  # decode regime (every decode token, whatever m); rot= fuses the inverse RoPE
    candidate_mask: Callable
    topk_select: Callable
    candidate_mask_fixed: Callable
    topk_fixed: Callable
    window_selection: Callable
    fp8_mm: Callable
    paged_selection: Callable  # a batched step's selection in one launch (kernels/paged_sel.py)
    kv_chain: Callable  # kernels/fused.py: chains of the small ops above in one kernel, same bytes
    compress_kv_chain: Callable
    index_k_chain: Callable
    index_q_chain: Callable
    # reindex layers score only their candidates (`compact_reindex`, below): the Triton tables
    compact_reindex: bool = False


TORCH_OPS = Ops(
    name="torch",
    mm=linear.mm_exact,
    mm_many=gemv.mm_many_exact,
    group_mm=linear.group_mm_exact,
    rms_norm=norm.rms_norm_torch,
    apply_rope=rope.apply_rope_torch,
    fp8_qdq=qdq.fp8_qdq_torch,
    fp4_e8m0_qdq=qdq.fp4_e8m0_qdq_torch,
    fp4_e4m3_qdq=qdq.fp4_e4m3_qdq_torch,
    ring_write=ring.ring_write_torch,
    compress_pool=compressor.compress_pool_torch,
    index_scores=indexer.index_scores_torch,
    index_scores_paged=indexer.index_scores_paged_torch,
    sparse_attn=sparse.sparse_attn_torch,
    sparse_attn_decode=sparse_split.sparse_attn_split_torch,  # the reference order: the CPU path stays bit for bit
    candidate_mask=select.candidate_mask,
    topk_select=select.topk_select,
    candidate_mask_fixed=select.candidate_mask_fixed,
    topk_fixed=select.topk_fixed,
    window_selection=select.window_selection,
    paged_selection=paged_sel.paged_selection_torch,
    fp8_mm=fp8_linear.fp8_mm_torch,
    kv_chain=fused.kv_chain_torch,
    compress_kv_chain=fused.compress_kv_chain_torch,
    index_k_chain=fused.index_k_chain_torch,
    index_q_chain=fused.index_q_chain_torch,
)

TRITON_OPS = Ops(
    name="triton",
    mm=gemv.mm_auto,  # one token (gemv.AUTO_MAX_M): the Triton GEMV; else cuBLAS
    mm_many=gemv.mm_many,
    group_mm=gemv.group_mm_auto,  # bf16 wo_a: cuBLAS (group_gemv 7% slower at m = 1); FP8-stored: group_gemv at m = 1
    rms_norm=norm.rms_norm,
    apply_rope=rope.apply_rope,
    fp8_qdq=qdq.fp8_qdq,
    fp4_e8m0_qdq=qdq.fp4_e8m0_qdq,
    fp4_e4m3_qdq=qdq.fp4_e4m3_qdq,
    ring_write=ring.ring_write,
    compress_pool=compressor.compress_pool,
    index_scores=indexer.index_scores,
    index_scores_paged=indexer.index_scores_paged,
    sparse_attn=sparse.sparse_attn,
    sparse_attn_decode=sparse_split.sparse_attn_split,
    candidate_mask=select.candidate_mask,
    topk_select=select.topk_select,
    candidate_mask_fixed=topk.candidate_mask_fixed,  # Triton radix select (exact, the tie rule)
    topk_fixed=topk.topk_fixed,
    window_selection=select.window_selection,
    paged_selection=paged_sel.paged_selection,
    fp8_mm=fp8_linear.fp8_mm,
    kv_chain=fused.kv_chain,
    compress_kv_chain=fused.compress_kv_chain,
    index_k_chain=fused.index_k_chain,
    index_q_chain=fused.index_q_chain,
    compact_reindex=True,
)


# Reindex layers over their candidates only ("compact reindex", 2026-12-06): once a bucket is
# wider than the candidate mask (cand_blocks · cand_block positions: 16,384 on Flash), a layer
# that applies the candidate source's mask scores only the rows of the kept blocks, named by
# ascending block ids the candidate source writes with its mask (`candidate_mask_fixed(ids_out=)`),
# and its top-k maps each taken entry back to its position (`topk_fixed(ids=)`). Every score has
# the bytes of the full form (`index_scores(ids=)`), so the selection is the full form's
# whenever at least index_topk candidates score above −∞, which `compacts` requires of the
# geometry (index_topk ≤ cand_blocks · cand_block − cand_block + 1: the newest kept block may be
# partly past the visible rows) and finite scores give: no NaN block, no −∞ score inside the
# visible rows. On the CPU (TORCH_OPS) it is off: the CPU path stays the reference's own steps.
# COMPACT_REINDEX = False turns it off everywhere (A/B runs, tests of the full form).
COMPACT_REINDEX = True


# A prompt's index scores (prefills, continuations, steps with prompt chunks; not the gathered
# form, not a decode step's tokens of many sequences) take the kernels' `tokens` launch option
# (`kernels.indexer.index_scores`): this many consecutive tokens per program share each block
# of keys. The same bits for any value (tests/kernels/test_indexer_tokens.py, on the GPU too);
# 1 launches as before it existed. The torch twins take it and ignore it. Only calls of at least
# PROMPT_MIN tokens (and batched steps with a sequence of that many) take it: a program runs its
# tokens one after another, so a few tokens over a short context would lose parallelism, and
# a group of several sequences' tokens (a verify step's) shares nothing. A batched step with a
# prompt chunk passes it for all its rows, its decode tokens (one per slot) then in groups of
# several slots, each program scoring its tokens one after another: H100, 2026-12-06
# (thirty-eighth entry, index_prefill_probe's mixed steps, µs, with the option / without):
# 64 decode tokens and a 256-token chunk at 4K 79.0 / 79.2; 64 and 512 at 32K 582 / 852 bf16,
# 686 / 865 packed: those groups run among the chunk's programs. A launch per prompt run and
# one for the other rows (tried that session: 180, 614 and 624 µs) lost to the extra launch's
# host cost except over packed keys at 32K, and was not kept.
# H100, 2026-12-06 (thirty-seventh entry; scripts/index_prefill_probe.py, the Flash index shapes,
# paged, µs, one token per program → tokens 4 / 16): a 64-token tile at a 1M context, 90 %
# visible, bf16 keys 3,043 → 2,351 / 1,869, packed 3,074 → 2,615 / 2,017; a 2,048-token chunk
# over 29,490 keys, bf16 2,885 → 2,269 / 1,899, packed 3,070 → 2,789 / 2,158 (tokens 2: slower
# than 1). A 131,072-token prompt (bench --parts long, FP8 weights, last chunk): 229.7 → 223.8
# ms with 4, 229.8 → 219.2 with 16 (there the index scores are a small part of a chunk).
PROMPT_TOKENS = 16
PROMPT_MIN = 64


def prompt_tokens(m: int, longest: int | None = None) -> dict:
    """The index scores' `tokens` keyword for a call of m tokens whose longest run of one
    sequence's tokens is `longest` (None: m, one sequence): {} below PROMPT_MIN."""
    run = m if longest is None else min(m, longest)
    return {"tokens": PROMPT_TOKENS} if run >= PROMPT_MIN and PROMPT_TOKENS > 1 else {}


def compacts(ops: Ops, cfg, width: int) -> bool:
    """Whether a reindex layer (and the candidate source, for its ids) of a step whose
    index scores span `width` rows takes the compact form (the comment above)."""
    C = cfg.cand_blocks * cfg.cand_block
    return COMPACT_REINDEX and ops.compact_reindex and width > C and cfg.index_topk <= C - cfg.cand_block + 1


# The batched runtime on CUDA (runtime/batch.py): the projections batch-invariant (cuBLAS
# picks its algorithm by m, so a token's bits would follow the step's other tokens): bf16
# (and fp32, and FP8 with their scales) weights on the tensor cores with one launch shape
# for every m (kernels/tc_mm.py); the decode attention with a launch shape
# for batches (`sparse_attn_batch`); the rest as TRITON_OPS (their kernels are
# batch-invariant already).
TRITON_BATCH_OPS = dataclasses.replace(
    TRITON_OPS,
    name="triton-batch",
    mm=tc_mm.mm_batch,
    mm_many=tc_mm.mm_many_batch,
    rms_norm=tc_mm.rms_norm_batch,  # norm.rms_norm; `xq` renamed for `mm_many_batch` under tc_mm.FP8_GLUON
    group_mm=tc_mm.tc_group_mm,
    fp8_mm=tc_mm.fp8_mm_batch,
    sparse_attn_decode=sparse_split.sparse_attn_batch,  # one launch shape for every m, tiled for batches
)


def ops_for(device: torch.device) -> Ops:
    """Triton on CUDA devices, torch elsewhere."""
    return TRITON_OPS if torch.device(device).type == "cuda" else TORCH_OPS
