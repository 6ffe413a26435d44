"""attnv41's kernels as PyTorch custom ops, for engines that own their caches.

Registered with `torch.library` under the namespace `attnv41` (`torch.ops.attnv41.*`),
each with a fake (meta) implementation, so they run under `torch.compile` and in CUDA
graphs; on CUDA the Triton kernels, elsewhere their torch twins (the CPU runtime's,
bit for bit the reference). Layouts follow what vLLM and SGLang hand an attention layer:
flat cache pools addressed by physical row, block tables, per-token slot mappings,
fixed-width −1 padded index buffers. Each op runs on its inputs' device whatever the
current CUDA device is (`kernels._triton.on_device`: Triton itself launches on the current
one).

- `sparse_attn(q, win, comp, sel, offset, sink, scale)`: sparse attention with the sink
  (attention-v41.md §7) over rows named by `sel` (int32 `[m, K]`, −1 absent): entries
  `< offset` index `win`, the others `comp` at `entry − offset`. With `win` an engine's
  window-ring pool and `comp` its compressed-KV pool, `sel` holds physical rows: paged
  caches read in place. The decode regime's kernel (split over 64-entry blocks), whose
  bits do not depend on m or on the other tokens. `sparse_attn_out(..., cos, sin, pos, out,
  out_rot)`: the same into the caller's buffers, with o's inverse RoPE (what `wo_a` reads)
  from the same launch. `sparse_attn_prefill(...)`: a prompt from position 0 over its own
  rows, on the prefill regime's kernel.
- `index_scores(iq, weights, keys, block_table, tok_slot, visible, block_rows, width)`:
  index scores `[m, width]` of every token over its own sequence's keys in a paged pool
  (−∞ past each token's visible rows). `index_topk(...)` adds the fixed-width top-k: the
  `k` best logical rows ascending, −1 tail, plus `offset` (lower position wins ties),
  written straight into an int32 `[m, k]` buffer.
- `cache_write(cache, rows, slot_mapping)`: `cache[slot_mapping[i]] = rows[i]`, −1 skips
  (the ring, compressed-KV and index-key writes by slot mapping). Mutates `cache`.
- `compress_pool(a, g)`: the compressor's pooling of groups of r tokens (fp32, softmax
  over r per channel), and `compress_rows(...)`: pooled rows → RMSNorm → RoPE at
  `row_pos` → fp4 round trip, written into the compressed-KV pool at `row` (a slot
  mapping: −1 writes nothing; returns the normed latent, the index key's input).
- `kv_rows(kv_pre, norm_w, eps, cos, sin, pos, slot_mapping, cache)`: the window rows
  (attention-v41.md §4.3: RMSNorm → RoPE at `pos` → fp8 round trip, returned) written into
  the window pool by slot mapping. `index_key_rows(...)`: the index keys (§6.1: RMSNorm →
  RoPE at `row_pos` → fp4 e8m0 round trip) into the index-key pool. `index_queries(iq,
  cos, sin, pos)`: §6.2's RoPE and fp4 e8m0 round trip per head.
- `rms_norm(x, weight, eps)` and `rope(x, cos, sin, pos, inverse)`: §3's RMSNorm and RoPE,
  for q's norm and rotation and o's inverse rotation before `wo_a`.
- `candidate_mask(scores, visible, cand_blocks, cand_block)` and `topk(scores, visible, k,
  offset, mask)`: §6.5-6.6 on scores an engine holds (a reindex layer's top-k restricted to
  the candidate source's mask).
- `candidate_ids(scores, visible, cand_blocks, cand_block)`: the candidate source's top
  blocks as ids, ascending (int32 `[m, min(cand_blocks, n_blocks)]`, n_blocks for a block
  that is not kept), and `index_topk_candidates(iq, weights, keys, block_table, tok_slot,
  visible, block_rows, width, ids, cand_block, k, offset)`: a reindex layer's selection
  scoring only those blocks' rows (cand_blocks · cand_block of them, not `width`), equal
  to `index_topk` with the candidate mask applied whenever at least k kept positions
  score above −∞ (with finite scores: whenever k ≤ cand_blocks · cand_block − cand_block
  + 1 or every visible block is kept; the runtime's rule, `runtime.ops.compacts`).

Cache formats. Every pool is either bf16 rows on V4.1's grids or V4.1's packed rows
(`attnv41.packed`, uint8 `[rows, row_bytes]`): window rows `fp8_e8m0` (528 B at D = 512),
compressed rows `fp4_e4m3` (288 B), index keys `fp4_e8m0` (68 B at d = 128). The ops that
write rows (`kv_rows`, `compress_rows`, `index_key_rows`) pack them when the pool is uint8;
`sparse_attn` and `index_scores` / `index_topk` read either and give the same bits over
both (the packing is lossless). `cache_write` copies rows of the pool's own dtype (packed
rows as bytes).

Slot mappings (int32/int64 `[m]`): token i writes pool row `slot_mapping[i]`; −1 writes
nothing (padding). The rows ≥ 0 must be distinct and inside the pool: not checked (that
would be a host sync).
"""

from __future__ import annotations

import re
from contextlib import contextmanager

import torch
from torch import Tensor
from torch.library import custom_op

from .kernels import compressor, fused, indexer, norm, ring, select, sparse_attn_split
from .kernels import rope as _rope
from .kernels import sparse_attn as sparse_attn_fused
from .kernels import topk as _topk
from .kernels._triton import on_device

__all__ = [
    "sparse_attn",
    "sparse_attn_out",
    "sparse_attn_prefill",
    "index_scores",
    "index_topk",
    "cache_write",
    "compress_pool",
    "compress_rows",
    "kv_rows",
    "index_key_rows",
    "index_queries",
    "rms_norm",
    "rope",
    "candidate_mask",
    "topk",
    "candidate_ids",
    "index_topk_candidates",
]


def _cuda(t: Tensor) -> bool:
    return t.device.type == "cuda"


@contextmanager
def _arg_names(names: dict[str, str]):
    """A ValueError from the kernel's checks, naming its arguments (`ring`, `slot`) by the
    op's (`cache`, `slot_mapping`): the same message otherwise."""
    try:
        yield
    except ValueError as e:
        msg = str(e)
        for inner, outer in names.items():
            msg = re.sub(rf"\b{inner}\b", outer, msg)
        raise ValueError(msg) from None


@custom_op("attnv41::sparse_attn", mutates_args=())
def sparse_attn(q: Tensor, win: Tensor, comp: Tensor, sel: Tensor, offset: int, sink: Tensor, scale: float) -> Tensor:
    """o = bf16 `[m, H, D]` (module doc). q bf16 `[m, H, D]`; win, comp bf16 `[*, D]`, or
    both packed (uint8: win `fp8_e8m0` `[*, D + D/32]`, comp `fp4_e4m3` `[*, D/2 + D/16]`;
    comp may have 0 rows); sel int32 `[m, K]`; sink fp32 `[H]`; scale = head_dim^-½."""
    fn = sparse_attn_split.sparse_attn_split if _cuda(q) else sparse_attn_split.sparse_attn_split_torch
    with on_device(q.device):
        return fn(q, win, comp, sel, offset, sink, scale)


@sparse_attn.register_fake
def _(q, win, comp, sel, offset, sink, scale):
    return torch.empty_like(q)


@custom_op("attnv41::sparse_attn_out", mutates_args=("out", "out_rot"))
def sparse_attn_out(
    q: Tensor,
    win: Tensor,
    comp: Tensor,
    sel: Tensor,
    offset: int,
    sink: Tensor,
    scale: float,
    cos: Tensor,
    sin: Tensor,
    pos: Tensor,
    out: Tensor,
    out_rot: Tensor,
) -> None:
    """`sparse_attn` into the caller's buffers, for engines that hand the layer its output
    (vLLM's `forward_mqa(..., output)`): `out` = o (bf16 `[m, H, D]`) and `out_rot` = o's
    inverse RoPE at `pos` (§8, what `wo_a` reads; bf16 `[m, H, D]`, a buffer of its own),
    on CUDA in the attention's epilogue (one launch: the runtimes' decode form). The same
    bits as `sparse_attn` followed by `rope(o, cos, sin, pos, inverse=True)`."""
    fn = sparse_attn_split.sparse_attn_split if _cuda(q) else sparse_attn_split.sparse_attn_split_torch
    with on_device(q.device):
        fn(q, win, comp, sel, offset, sink, scale, out=out, rot=(cos, sin, pos, out_rot))


@sparse_attn_out.register_fake
def _(q, win, comp, sel, offset, sink, scale, cos, sin, pos, out, out_rot):
    return None


@custom_op("attnv41::sparse_attn_prefill", mutates_args=())
def sparse_attn_prefill(
    q: Tensor, win: Tensor, comp: Tensor, sel: Tensor, offset: int, sink: Tensor, scale: float
) -> Tensor:
    """`sparse_attn` in the prefill regime: a prompt's tokens from position 0, each over its
    own chunk rows (`win`: bf16, e.g. `kv_rows`' return, entries `< offset`) and the
    compressed pool (`comp`: bf16 or packed fp4_e4m3). One program per token (the kernel
    the runtimes prefill with, fast for many tokens); a token's bits are the runtime's
    prefill's, which may differ from the decode kernel's within the bf16 tolerance: choose
    the op by regime (a prompt from 0 here; continuations and decode `sparse_attn`), never
    by the number of tokens."""
    fn = sparse_attn_fused.sparse_attn if _cuda(q) else sparse_attn_fused.sparse_attn_torch
    with on_device(q.device):
        return fn(q, win, comp, sel, offset, sink, scale)


@sparse_attn_prefill.register_fake
def _(q, win, comp, sel, offset, sink, scale):
    return torch.empty_like(q)


@custom_op("attnv41::index_scores", mutates_args=())
def index_scores(
    iq: Tensor,
    weights: Tensor,
    keys: Tensor,
    block_table: Tensor,
    tok_slot: Tensor,
    visible: Tensor,
    block_rows: int,
    width: int,
    tokens: int = 1,
) -> Tensor:
    """bf16 `[m, width]` (module doc; `kernels.indexer.index_scores_paged`). keys: the pool,
    bf16 `[rows, d]` or packed `fp4_e8m0` uint8 `[rows, d/2 + d/32]`. tokens: the kernel's
    launch option for a prompt's tokens (1, 2, 4, 8 or 16 consecutive tokens per program,
    sharing each block of keys when they are one sequence's; the same bits for any value;
    the runtimes use 16 for runs of at least 64 tokens, `runtime.ops.PROMPT_TOKENS`)."""
    fn = indexer.index_scores_paged if _cuda(iq) else indexer.index_scores_paged_torch
    with on_device(iq.device):
        return fn(iq, weights, keys, block_table, tok_slot, block_rows, visible, width, tokens=tokens)


@index_scores.register_fake
def _(iq, weights, keys, block_table, tok_slot, visible, block_rows, width, tokens=1):
    return iq.new_empty((iq.shape[0], width))


@custom_op("attnv41::index_topk", mutates_args=())
def index_topk(
    iq: Tensor,
    weights: Tensor,
    keys: Tensor,
    block_table: Tensor,
    tok_slot: Tensor,
    visible: Tensor,
    block_rows: int,
    width: int,
    k: int,
    offset: int,
    tokens: int = 1,
) -> Tensor:
    """int32 `[m, k]`: the fixed-width top-k of `index_scores` (module doc), exact, the
    tie rule of the reference (lower position first). tokens: `index_scores`' option."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= width:
        raise ValueError(f"k = {k!r}; allowed: 1..{width} (width)")
    with on_device(iq.device):
        return _scores_topk(iq, weights, keys, block_table, tok_slot, visible, block_rows, width, k, offset, {}, tokens)


def _scores_topk(
    iq, weights, keys, block_table, tok_slot, visible, block_rows, width, k, offset, gather: dict, tokens: int = 1
):
    """`index_topk`'s and `index_topk_candidates`' work: the paged scores (the gathered form
    with `gather` = {ids, cand_block}; `tokens`: the scores' launch option), then the
    fixed-width top-k into a new int32 `[m, k]`; the callers run it under `on_device`."""
    cuda = _cuda(iq)
    fn = indexer.index_scores_paged if cuda else indexer.index_scores_paged_torch
    scores = fn(iq, weights, keys, block_table, tok_slot, block_rows, visible, width, **gather, tokens=tokens)
    out = torch.empty(iq.shape[0], k, dtype=torch.int32, device=iq.device)
    (_topk.topk_fixed if cuda else select.topk_fixed)(scores, visible, k, offset, out, **gather)
    return out


@index_topk.register_fake
def _(iq, weights, keys, block_table, tok_slot, visible, block_rows, width, k, offset, tokens=1):
    return iq.new_empty((iq.shape[0], k), dtype=torch.int32)


@custom_op("attnv41::cache_write", mutates_args=("cache",))
def cache_write(cache: Tensor, rows: Tensor, slot_mapping: Tensor) -> None:
    """`cache[slot_mapping[i]] = rows[i]` where `slot_mapping[i] >= 0` (distinct slots)."""
    with on_device(cache.device):
        (ring.slot_write if _cuda(cache) else ring.slot_write_torch)(cache, rows, slot_mapping)


@cache_write.register_fake
def _(cache, rows, slot_mapping):
    return None


@custom_op("attnv41::compress_pool", mutates_args=())
def compress_pool(a: Tensor, g: Tensor) -> Tensor:
    """fp32 `[n, D]` from fp32 `[n, r, D]` values and gate scores (attention-v41.md §5)."""
    with on_device(a.device):
        return (compressor.compress_pool if _cuda(a) else compressor.compress_pool_torch)(a, g)


@compress_pool.register_fake
def _(a, g):
    return a.new_empty((a.shape[0], a.shape[2]))


@custom_op("attnv41::compress_rows", mutates_args=("compress_kv",))
def compress_rows(
    pooled: Tensor,
    norm_w: Tensor,
    eps: float,
    cos: Tensor,
    sin: Tensor,
    row_pos: Tensor,
    row: Tensor,
    compress_kv: Tensor,
) -> Tensor:
    """Pooled rows (bf16 `[n, D]`) → RMSNorm → RoPE at `row_pos` → fp4 e4m3 round trip,
    written at `compress_kv[row]` (a slot mapping; the pool bf16 `[rows, D]` or packed
    uint8 `[rows, D/2 + D/16]`); returns the normed latent (bf16 `[n, D]`)."""
    latent = torch.empty_like(pooled)
    fn = fused.compress_kv_chain if _cuda(pooled) else fused.compress_kv_chain_torch
    with on_device(pooled.device), _arg_names({"lat_pre": "pooled"}):
        fn(pooled, norm_w, eps, cos, sin, row_pos, row, latent, compress_kv, mapped=True)
    return latent


@compress_rows.register_fake
def _(pooled, norm_w, eps, cos, sin, row_pos, row, compress_kv):
    return torch.empty_like(pooled)


@custom_op("attnv41::kv_rows", mutates_args=("cache",))
def kv_rows(
    kv_pre: Tensor,
    norm_w: Tensor,
    eps: float,
    cos: Tensor,
    sin: Tensor,
    pos: Tensor,
    slot_mapping: Tensor,
    cache: Tensor,
) -> Tensor:
    """The window rows of m tokens: `fp8_qdq(rope(rms_norm(kv_pre) at pos))` (bf16 `[m, D]`,
    returned; kv_pre is `x · W_kvᵀ`), each written at `cache[slot_mapping[i]]` (−1: none).
    cache: the window pool, bf16 `[rows, D]` or packed uint8 `[rows, D + D/32]`. One launch
    on CUDA (`kernels.fused.kv_chain`)."""
    kv = torch.empty_like(kv_pre)
    fn = fused.kv_chain if _cuda(kv_pre) else fused.kv_chain_torch
    with on_device(kv_pre.device), _arg_names({"ring": "cache", "slot": "slot_mapping"}):
        fn(kv_pre, norm_w, eps, cos, sin, pos, kv, cache, slot=slot_mapping, mapped=True)
    return kv


@kv_rows.register_fake
def _(kv_pre, norm_w, eps, cos, sin, pos, slot_mapping, cache):
    return torch.empty_like(kv_pre)


@custom_op("attnv41::index_key_rows", mutates_args=("index_k",))
def index_key_rows(
    kp: Tensor,
    norm_w: Tensor,
    eps: float,
    cos: Tensor,
    sin: Tensor,
    row_pos: Tensor,
    slot_mapping: Tensor,
    index_k: Tensor,
) -> None:
    """The index keys of n new compressed rows: `fp4_e8m0_qdq(rope(rms_norm(kp) at row_pos))`
    (kp bf16 `[n, d]`: the latent times the indexer's `wk`), each written at
    `index_k[slot_mapping[i]]` (−1: none); index_k bf16 `[rows, d]` or packed uint8
    `[rows, d/2 + d/32]`."""
    fn = fused.index_k_chain if _cuda(kp) else fused.index_k_chain_torch
    with on_device(kp.device), _arg_names({"row": "slot_mapping"}):
        fn(kp, norm_w, eps, cos, sin, row_pos, slot_mapping, index_k, mapped=True)


@index_key_rows.register_fake
def _(kp, norm_w, eps, cos, sin, row_pos, slot_mapping, index_k):
    return None


@custom_op("attnv41::index_queries", mutates_args=())
def index_queries(iq: Tensor, cos: Tensor, sin: Tensor, pos: Tensor) -> Tensor:
    """`fp4_e8m0_qdq(rope(iq at pos))` per head: iq bf16 `[m, index_heads, d]` (the q latent
    times the indexer's `wq_b`), the same shape back."""
    out = torch.empty_like(iq)
    fn = fused.index_q_chain if _cuda(iq) else fused.index_q_chain_torch
    with on_device(iq.device):
        fn(iq, cos, sin, pos, out)
    return out


@index_queries.register_fake
def _(iq, cos, sin, pos):
    return torch.empty_like(iq)


@custom_op("attnv41::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`bf16(w ⊙ v / sqrt(mean(v²) + eps))` per row of bf16 `x [rows, width]` (§3; weight
    fp32 or bf16 `[width]`). CUDA within one bf16 ulp of the CPU's bits (`kernels/norm.py`)."""
    with on_device(x.device):
        return (norm.rms_norm if _cuda(x) else norm.rms_norm_torch)(x, weight, eps)


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@custom_op("attnv41::rope", mutates_args=())
def rope(x: Tensor, cos: Tensor, sin: Tensor, pos: Tensor, inverse: bool = False) -> Tensor:
    """§3's RoPE on the last `2·cos.shape[1]` values of each vector of bf16 `x` (`[m, width]`
    or `[m, n_vec, width]`) at `pos` (int `[m]`), or its inverse: bit for bit the
    reference's on CUDA too (`kernels/rope.py`)."""
    with on_device(x.device):
        return (_rope.apply_rope if _cuda(x) else _rope.apply_rope_torch)(x, cos, sin, pos, inverse=inverse)


@rope.register_fake
def _(x, cos, sin, pos, inverse=False):
    return torch.empty_like(x)


@custom_op("attnv41::candidate_mask", mutates_args=())
def candidate_mask(scores: Tensor, visible: Tensor, cand_blocks: int, cand_block: int) -> Tensor:
    """bool `[m, Lb]`: the candidate source's position mask (§6.5) over bf16 scores `[m, Lb]`
    with `visible` (int `[m]`, each token's L_t); exact on every device."""
    out = torch.empty(scores.shape, dtype=torch.bool, device=scores.device)
    fn = _topk.candidate_mask_fixed if _cuda(scores) else select.candidate_mask_fixed
    with on_device(scores.device):
        fn(scores, visible, cand_blocks, cand_block, out)
    return out


@candidate_mask.register_fake
def _(scores, visible, cand_blocks, cand_block):
    return scores.new_empty(scores.shape, dtype=torch.bool)


@custom_op("attnv41::topk", mutates_args=())
def topk(scores: Tensor, visible: Tensor, k: int, offset: int, mask: Tensor | None = None) -> Tensor:
    """int32 `[m, k]`: §6.6's fixed-width top-k of bf16 scores `[m, Lb]` (the k best
    positions ascending, lower position first among equal scores, positions ≥ visible[t]
    → −1, the others + offset); with `mask` (bool `[m, Lb]`, e.g. `candidate_mask`'s) the
    scores where it is False count as −∞ (a reindex layer's restriction). Exact on every
    device."""
    out = torch.empty(scores.shape[0], k, dtype=torch.int32, device=scores.device)
    with on_device(scores.device):
        if _cuda(scores):
            _topk.topk_fixed(scores, visible, k, offset, out, mask=mask)
        else:
            if mask is not None:
                _topk._check_mask("topk", mask, tuple(scores.shape), scores.device)
                scores = scores.masked_fill(~mask, float("-inf"))
            select.topk_fixed(scores, visible, k, offset, out)
    return out


@topk.register_fake
def _(scores, visible, k, offset, mask=None):
    return scores.new_empty((scores.shape[0], k), dtype=torch.int32)


@custom_op("attnv41::candidate_ids", mutates_args=())
def candidate_ids(scores: Tensor, visible: Tensor, cand_blocks: int, cand_block: int) -> Tensor:
    """int32 `[m, min(cand_blocks, n_blocks)]`: the candidate source's top blocks (§6.5, as
    `candidate_mask` keeps them) in ascending order, a block among them that is not kept
    (−∞ or NaN) named n_blocks = ⌈Lb / cand_block⌉: the ids `index_topk_candidates` takes."""
    m, Lb = scores.shape
    mask = torch.empty(scores.shape, dtype=torch.bool, device=scores.device)
    out = torch.empty(m, min(cand_blocks, -(-Lb // max(cand_block, 1))), dtype=torch.int32, device=scores.device)
    fn = _topk.candidate_mask_fixed if _cuda(scores) else select.candidate_mask_fixed
    with on_device(scores.device):
        fn(scores, visible, cand_blocks, cand_block, mask, ids_out=out)
    return out


@candidate_ids.register_fake
def _(scores, visible, cand_blocks, cand_block):
    m, Lb = scores.shape
    return scores.new_empty((m, min(cand_blocks, -(-Lb // max(cand_block, 1)))), dtype=torch.int32)


@custom_op("attnv41::index_topk_candidates", mutates_args=())
def index_topk_candidates(
    iq: Tensor,
    weights: Tensor,
    keys: Tensor,
    block_table: Tensor,
    tok_slot: Tensor,
    visible: Tensor,
    block_rows: int,
    width: int,
    ids: Tensor,
    cand_block: int,
    k: int,
    offset: int,
) -> Tensor:
    """int32 `[m, k]`: a reindex layer's selection over its candidates only (module doc):
    each token scores the rows of its blocks `ids` (`candidate_ids`) among its sequence's
    first `width` logical key rows, and the k best of them are written as logical rows
    ascending (−1 past visible[t], the others + offset; lower position first among equal
    scores)."""
    n = ids.shape[1] * cand_block if ids.dim() == 2 else 0
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= max(n, 1):
        raise ValueError(f"k = {k!r}; allowed: 1..{n} (ids.shape[1] · cand_block)")
    gather = dict(ids=ids, cand_block=cand_block)
    with on_device(iq.device):
        return _scores_topk(iq, weights, keys, block_table, tok_slot, visible, block_rows, width, k, offset, gather)


@index_topk_candidates.register_fake
def _(iq, weights, keys, block_table, tok_slot, visible, block_rows, width, ids, cand_block, k, offset):
    return iq.new_empty((iq.shape[0], k), dtype=torch.int32)
