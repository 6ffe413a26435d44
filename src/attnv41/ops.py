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
  bits do not depend on m or on the other tokens.
- `index_scores(iq, weights, keys, block_table, tok_slot, visible, block_rows, width)`:
  index scores `[m, width]` of every token over its own sequence's keys in a paged pool
  (−∞ past each token's visible rows). `index_topk(...)` adds the fixed-width top-k: the
  `k` best logical rows ascending, −1 tail, plus `offset` (lower position wins ties),
  written straight into an int32 `[m, k]` buffer.
- `cache_write(cache, rows, slot_mapping)`: `cache[slot_mapping[i]] = rows[i]`, −1 skips
  (the ring, compressed-KV and index-key writes by slot mapping). Mutates `cache`.
- `compress_pool(a, g)`: the compressor's pooling of groups of r tokens (fp32, softmax
  over r per channel), and `compress_rows(...)`: pooled rows → RMSNorm → RoPE at
  `row_pos` → fp4 round trip, written into the compressed-KV pool at `row` (returns the
  normed latent, the index key's input).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.library import custom_op

from .kernels import compressor, fused, indexer, ring, select, sparse_attn_split, topk
from .kernels._triton import on_device

__all__ = ["sparse_attn", "index_scores", "index_topk", "cache_write", "compress_pool", "compress_rows"]


def _cuda(t: Tensor) -> bool:
    return t.device.type == "cuda"


@custom_op("attnv41::sparse_attn", mutates_args=())
def sparse_attn(q: Tensor, win: Tensor, comp: Tensor, sel: Tensor, offset: int, sink: Tensor, scale: float) -> Tensor:
    """o = bf16 `[m, H, D]` (module doc). q bf16 `[m, H, D]`; win, comp bf16 `[*, D]`
    (comp may have 0 rows); sel int32 `[m, K]`; sink fp32 `[H]`; scale = head_dim^-½."""
    fn = sparse_attn_split.sparse_attn_split if _cuda(q) else sparse_attn_split.sparse_attn_split_torch
    with on_device(q.device):
        return fn(q, win, comp, sel, offset, sink, scale)


@sparse_attn.register_fake
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
) -> Tensor:
    """bf16 `[m, width]` (module doc; `kernels.indexer.index_scores_paged`)."""
    fn = indexer.index_scores_paged if _cuda(iq) else indexer.index_scores_paged_torch
    with on_device(iq.device):
        return fn(iq, weights, keys, block_table, tok_slot, block_rows, visible, width)


@index_scores.register_fake
def _(iq, weights, keys, block_table, tok_slot, visible, block_rows, width):
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
) -> Tensor:
    """int32 `[m, k]`: the fixed-width top-k of `index_scores` (module doc), exact, the
    tie rule of the reference (lower position first)."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= width:
        raise ValueError(f"k = {k!r}; allowed: 1..{width} (width)")
    cuda = _cuda(iq)
    fn = indexer.index_scores_paged if cuda else indexer.index_scores_paged_torch
    with on_device(iq.device):
        scores = fn(iq, weights, keys, block_table, tok_slot, block_rows, visible, width)
        out = torch.empty(iq.shape[0], k, dtype=torch.int32, device=iq.device)
        (topk.topk_fixed if cuda else select.topk_fixed)(scores, visible, k, offset, out)
    return out


@index_topk.register_fake
def _(iq, weights, keys, block_table, tok_slot, visible, block_rows, width, k, offset):
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
    written at `compress_kv[row]`; returns the normed latent (bf16 `[n, D]`)."""
    latent = torch.empty_like(pooled)
    fn = fused.compress_kv_chain if _cuda(pooled) else fused.compress_kv_chain_torch
    with on_device(pooled.device):
        fn(pooled, norm_w, eps, cos, sin, row_pos, row, latent, compress_kv)
    return latent


@compress_rows.register_fake
def _(pooled, norm_w, eps, cos, sin, row_pos, row, compress_kv):
    return torch.empty_like(pooled)
