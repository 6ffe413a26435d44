"""Test helpers shared by the suite: golden file lookup, small configs, seeded weights
and inputs. (Kept out of conftest.py so that test files import them by a unique name.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attnv41.config import AttnV41Cfg
from attnv41.synthetic import random_inputs, random_weights  # noqa: F401  (re-exported for tests)

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
