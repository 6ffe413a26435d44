"""Test helpers shared by the suite: golden file lookup, small configs, seeded weights
and inputs. (Kept out of conftest.py so that test files import them by a unique name.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attnv41.config import AttnV41Cfg

REPO = Path(__file__).resolve().parents[1]


def golden_dir() -> Path:
    """`$ATTNV41_GOLDEN_DIR`, else `../shared/golden` beside the repository."""
    env = os.environ.get("ATTNV41_GOLDEN_DIR")
    return Path(env) if env else REPO.parent / "shared" / "golden"


def golden_path(name: str) -> Path:
    p = golden_dir() / f"v41_{name}.safetensors"
    if not p.is_file():
        # The golden data is the external oracle: its absence is a broken setup, not a skip.
        pytest.fail(f"golden file {p} not found (set ATTNV41_GOLDEN_DIR to the folder holding it)")
    return p


def small_cfg(**kw) -> AttnV41Cfg:
    """A small geometry with the golden files' 6-layer schedule (all five roles)."""
    base = dict(
        dim=64,
        n_layers=6,
        n_heads=4,
        head_dim=32,
        rope_dim=8,
        q_rank=16,
        o_rank=16,
        groups=2,
        window=8,
        index_heads=2,
        index_head_dim=32,
        index_topk=6,
        cand_blocks=4,
        cand_block=2,
        rope_theta=10000.0,
        compress_rope_theta=40000.0,
        rope_factor=2.0,
        original_seq_len=32,
        beta_fast=32.0,
        beta_slow=1.0,
        norm_eps=1e-20,
        max_position_embeddings=1 << 20,
        compress_ratios=(0, 2, 2, 1, 1, 1),
        kv_source_layers=(1, 3),
        index_source_layers=(1, 3, 5),
        candidate_source_layer=3,
        max_tokens=64,
        max_seq=64,
    )
    base.update(kw)
    return AttnV41Cfg(**base)


def random_weights(cfg: AttnV41Cfg, seed: int, device: str = "cpu") -> list[dict[str, torch.Tensor]]:
    """Deterministic weights with the golden files' distributions (activations O(1)):
    matrices N(0,1)·in^-1/2 (wo_a ×3), norm weights 1 + 0.1·N(0,1), sinks U(-1, 1)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def mat(out, inp, dtype=torch.bfloat16, mult=1.0):
        return (torch.randn(out, inp, generator=gen, device=device) * (inp**-0.5 * mult)).to(dtype)

    def norm(n):
        return (1 + 0.1 * torch.randn(n, generator=gen, device=device)).to(torch.bfloat16)

    H, D = cfg.n_heads, cfg.head_dim
    out = []
    for role in cfg.roles:
        w = {
            "attn_sink": torch.rand(H, generator=gen, device=device) * 2 - 1,
            "wq_a.weight": mat(cfg.q_rank, cfg.dim),
            "q_norm.weight": norm(cfg.q_rank),
            "wq_b.weight": mat(H * D, cfg.q_rank),
            "wkv.weight": mat(D, cfg.dim),
            "kv_norm.weight": norm(D),
            "wo_a.weight": mat(cfg.groups * cfg.o_rank, cfg.group_width, mult=3.0),
            "wo_b.weight": mat(cfg.dim, cfg.groups * cfg.o_rank),
        }
        if role.is_kv_source:
            cdt = torch.float32 if role.ratio >= 2 else torch.bfloat16
            w["compressor.wkv.weight"] = mat(D, cfg.dim, cdt)
            if role.ratio >= 2:
                w["compressor.wgate.weight"] = mat(D, cfg.dim, torch.float32)
            w["compressor.norm.weight"] = norm(D)
            w["indexer.wk.weight"] = mat(cfg.index_head_dim, D)
            w["indexer.k_norm.weight"] = norm(cfg.index_head_dim)
        if role.is_index_source:
            w["indexer.wq_b.weight"] = mat(cfg.index_heads * cfg.index_head_dim, cfg.q_rank)
            w["indexer.weights_proj.weight"] = mat(cfg.index_heads, cfg.dim)
        out.append(w)
    return out


def random_inputs(cfg: AttnV41Cfg, n: int, seed: int, device: str = "cpu") -> list[torch.Tensor]:
    """Per-layer inputs `[n, dim]`: standard normal rows scaled to unit RMS, bf16."""
    gen = torch.Generator(device=device).manual_seed(seed)
    xs = []
    for _ in range(cfg.n_layers):
        x = torch.randn(n, cfg.dim, generator=gen, device=device)
        xs.append((x / x.square().mean(-1, keepdim=True).sqrt()).to(torch.bfloat16))
    return xs
