"""The lightning indexer (attention-v41.md §6), in plain PyTorch: index keys,
queries, head weights, scores, the candidate mask and the position top-k."""

from __future__ import annotations

import torch

__all__ = ["index_scores", "candidate_mask", "candidate_block_order", "topk_select", "visible_rows"]


def visible_rows(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """`L_t = ⌊(t+1)/r⌋`: how many compressed rows the token at each position may see."""
    return torch.div(positions.long() + 1, ratio, rounding_mode="floor")


def index_scores(iq: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Scores `I[t, j] = Σ_h w[t,h] · ReLU(iq[t,h] · k_j)` as bf16 `[m, L]`.

    iq: bf16 `[m, H, d]` (fp4 round-tripped), weights: bf16 `[m, H]`, keys: bf16 `[L, d]`,
    visible: `[m]` int, the `L_t` of each token. Rounding as the released code: the dot
    products accumulate in fp32 and are rounded to bf16, ReLU, the products with the head
    weights are rounded to bf16, and the sum over heads accumulates in fp32 before its
    final bf16 rounding. Entries `j ≥ L_t` are −∞.
    """
    dots = torch.einsum("mhd,ld->mhl", iq.float(), keys.float()).to(torch.bfloat16)
    prod = (dots.relu().float() * weights.float().unsqueeze(-1)).to(torch.bfloat16)
    scores = prod.float().sum(dim=1).to(torch.bfloat16)
    cols = torch.arange(keys.shape[0], device=keys.device)
    return scores.masked_fill(cols[None, :] >= visible[:, None], float("-inf"))


def candidate_mask(scores: torch.Tensor, visible: torch.Tensor, cand_blocks: int, cand_block: int) -> torch.Tensor:
    """The candidate source's position mask, bool `[m, L]`.

    Each row is cut into blocks of `cand_block` positions; a block scores the max of its
    entries (−∞ padding past L); the block holding position `L_t − 1` is forced to +∞;
    the top `min(cand_blocks, n_blocks)` blocks scoring above −∞ are kept, whole (so a
    kept block may mark positions ≥ L_t; they score −∞ anyway). Tie rule: among blocks
    of equal score the lower block index is kept first.
    """
    L = scores.shape[1]
    block, order, kept = candidate_block_order(scores, visible, cand_blocks, cand_block)
    mask = torch.zeros_like(block, dtype=torch.bool)
    mask.scatter_(1, order, kept)
    return mask.repeat_interleave(cand_block, dim=1)[:, :L]


def candidate_block_order(
    scores: torch.Tensor, visible: torch.Tensor, cand_blocks: int, cand_block: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`candidate_mask`'s blocks: their scores fp32 `[m, n_blocks]` (the newest pinned to
    +∞), the top `min(cand_blocks, n_blocks)` block indices `[m, keep]` in order (score
    descending, lower block first among ties) and whether each is kept (above −∞)."""
    m, L = scores.shape
    n_blocks = -(-L // cand_block)
    pad = n_blocks * cand_block - L
    s = torch.nn.functional.pad(scores.float(), (0, pad), value=float("-inf"))
    block = s.view(m, n_blocks, cand_block).amax(-1)
    newest = ((visible.long() - 1).clamp_min(0) // cand_block)[:, None]
    pin = (torch.arange(n_blocks, device=scores.device)[None, :] == newest) & (visible.long() >= 1)[:, None]
    block = torch.where(pin, torch.full_like(block, float("inf")), block)
    keep_n = min(cand_blocks, n_blocks)
    order = torch.sort(block, dim=-1, descending=True, stable=True).indices[:, :keep_n]
    return block, order, torch.gather(block, 1, order) > float("-inf")


def topk_select(scores: torch.Tensor, visible: torch.Tensor, k: int, offset: int) -> torch.Tensor:
    """The compressed part of the selection, int32 `[m, k]`.

    The k largest scores of each row (tie rule: among equal scores the lower position is
    taken first), sorted ascending by position; positions `≥ L_t` become −1, the others
    are shifted by `offset` (where compressed rows start in the attended row list).
    """
    order = torch.sort(scores.float(), dim=-1, descending=True, stable=True).indices[:, :k]
    idx = torch.sort(order, dim=-1).values
    idx = torch.where(idx >= visible[:, None], torch.full_like(idx, -1), idx + offset)
    return idx.to(torch.int32)
