"""Deterministic synthetic weights and inputs for demos, benchmarks and tests.

Distributions as the golden files' (../shared/golden/README.md), so that every
activation is O(1) and the attention softmax is not saturated: matrices N(0,1)·in^-1/2
(`wo_a` ×3), norm weights 1 + 0.1·N(0,1), sinks U(-1, 1); inputs are standard normal
rows scaled to unit RMS, bf16. Generated on the target device from a seeded generator.

`random_weights(..., weights="fp8")` is the same bf16 model (the same draws) put into the
released checkpoint's FP8 format by the released conversion: each of `FP8_LINEARS`
block-quantized (`reference.fp8.quant_weight`: e4m3 weight + e8m0 `.scale`), and `wo_a`
too, as the checkpoint stores it (it runs as its exact bf16 dequantization: `weights.py`).
"""

from __future__ import annotations

import torch

from .config import AttnV41Cfg, v41_flash
from .reference.fp8 import quant_weight
from .weights import FP8_LINEARS, WEIGHT_FORMATS

__all__ = ["random_weights", "random_inputs", "unit_rms_bf16", "small_preset", "PRESETS"]


def unit_rms_bf16(x: torch.Tensor) -> torch.Tensor:
    """Rows of `x` scaled to unit RMS (over the last dim), as bf16: the inputs' distribution."""
    return (x / x.square().mean(-1, keepdim=True).sqrt()).to(torch.bfloat16)


def random_weights(
    cfg: AttnV41Cfg, seed: int, device: str | torch.device = "cpu", weights: str = "bf16"
) -> list[dict[str, torch.Tensor]]:
    """One dict per layer, under the released module's names (`wq_a.weight`, ...), in the
    weight format `weights` (`WEIGHT_FORMATS`; see the module doc for "fp8", which needs
    every FP8 linear's in-dim a multiple of 32)."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights = {weights!r}; allowed: {', '.join(repr(f) for f in WEIGHT_FORMATS)}")
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def mat(out, inp, dtype=torch.bfloat16, mult=1.0):
        return (torch.randn(out, inp, generator=gen, device=device) * (inp**-0.5 * mult)).to(dtype)

    def norm(n):
        return (1 + 0.1 * torch.randn(n, generator=gen, device=device)).to(torch.bfloat16)

    H, D = cfg.n_heads, cfg.head_dim
    layers = []
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
        if weights == "fp8":
            _to_fp8(w, role.layer)
        layers.append(w)
    return layers


def _to_fp8(w: dict[str, torch.Tensor], layer: int) -> None:
    """The checkpoint's quantization, in place: FP8_LINEARS and wo_a → e4m3 + e8m0 scale (the
    weights keep wo_a so and read it as its exact bf16, the released conversion's values)."""
    for n in (*FP8_LINEARS, "wo_a"):
        if f"{n}.weight" in w:
            w[f"{n}.weight"], w[f"{n}.scale"] = quant_weight(w[f"{n}.weight"], name=f"layer {layer}: {n}.weight")


def random_inputs(cfg: AttnV41Cfg, n: int, seed: int, device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """Per-layer inputs `[n, dim]`: standard normal rows scaled to unit RMS, bf16."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    xs = []
    for _ in range(cfg.n_layers):
        x = torch.randn(n, cfg.dim, generator=gen, device=device)
        xs.append(unit_rms_bf16(x))
    return xs


def small_preset(max_tokens: int = 256, max_seq: int | None = None) -> AttnV41Cfg:
    """The V4.1-Flash layer schedule (40 layers, every role) at a width a CPU runs quickly.
    `max_seq` left out: max(512, max_tokens) (valid whatever `max_tokens` is)."""
    if max_seq is None and isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        max_seq = max(512, max_tokens)
    return v41_flash(max_tokens=max_tokens, max_seq=max_seq).replace(
        dim=256,
        n_heads=4,
        head_dim=64,
        rope_dim=16,
        q_rank=64,
        o_rank=32,
        groups=2,
        window=32,
        index_heads=2,
        index_head_dim=32,
        index_topk=16,
        cand_blocks=4,
        cand_block=4,
    )


PRESETS = {"flash": v41_flash, "small": small_preset}
