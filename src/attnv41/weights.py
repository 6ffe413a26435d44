"""`AttnV41LayerWeights`: one layer's attention tensors under their checkpoint names.

Names are relative to the layer (`attn.wq_a.weight`, `attn.compressor.wkv.weight`,
`attn.indexer.wq_b.weight`, `attn.attn_sink`, ...), as in the released checkpoint
without the `layers.{i}.` prefix. Runtime dtypes (attention-v41.md §1–§2): bf16
projections, fp32 sink, the ratio>=2 compressor in fp32, norm weights as given (bf16
or fp32; both hold the same values). No compute here beyond the checks of names,
shapes, dtypes and finite values, done once when the weights are built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .config import AttnV41Cfg, LayerRole, v41_flash

__all__ = ["AttnV41LayerWeights", "NonFiniteWeightError", "describe_nonfinite", "expected_tensors"]

PREFIX = "attn."
_STANDIN = v41_flash()  # names and dtypes do not depend on the geometry
_NORM_DTYPES = (torch.bfloat16, torch.float32)


def expected_tensors(
    cfg: AttnV41Cfg | None, role: LayerRole
) -> dict[str, tuple[tuple[int, ...] | None, tuple[torch.dtype, ...]]]:
    """Checkpoint name (relative to the layer) → (shape, allowed runtime dtypes) for a
    role; shapes are None without a geometry."""
    if cfg is None:
        return {k: (None, dt) for k, (_, dt) in expected_tensors(_STANDIN, role).items()}
    H, D, G = cfg.n_heads, cfg.head_dim, cfg.groups
    bf16 = (torch.bfloat16,)
    e: dict[str, tuple[tuple[int, ...] | None, tuple[torch.dtype, ...]]] = {
        "attn.wq_a.weight": ((cfg.q_rank, cfg.dim), bf16),
        "attn.q_norm.weight": ((cfg.q_rank,), _NORM_DTYPES),
        "attn.wq_b.weight": ((H * D, cfg.q_rank), bf16),
        "attn.wkv.weight": ((D, cfg.dim), bf16),
        "attn.kv_norm.weight": ((D,), _NORM_DTYPES),
        "attn.wo_a.weight": ((G * cfg.o_rank, cfg.group_width), bf16),
        "attn.wo_b.weight": ((cfg.dim, G * cfg.o_rank), bf16),
        "attn.attn_sink": ((H,), (torch.float32,)),
    }
    if role.is_kv_source:
        comp = (torch.float32,) if role.ratio >= 2 else bf16
        e["attn.compressor.wkv.weight"] = ((D, cfg.dim), comp)
        if role.ratio >= 2:
            e["attn.compressor.wgate.weight"] = ((D, cfg.dim), comp)
        e["attn.compressor.norm.weight"] = ((D,), _NORM_DTYPES)
        e["attn.indexer.wk.weight"] = ((cfg.index_head_dim, D), bf16)
        e["attn.indexer.k_norm.weight"] = ((cfg.index_head_dim,), _NORM_DTYPES)
    if role.is_index_source:
        e["attn.indexer.wq_b.weight"] = ((cfg.index_heads * cfg.index_head_dim, cfg.q_rank), bf16)
        e["attn.indexer.weights_proj.weight"] = ((cfg.index_heads, cfg.dim), bf16)
    return e


class NonFiniteWeightError(ValueError):
    """A weight holding NaN or ±inf. `key`: its name relative to the layer; `detail`: the
    count, the first index and what is allowed."""

    def __init__(self, layer: int, key: str, detail: str):
        super().__init__(f"layers.{layer}.{key}: {detail}")
        self.layer, self.key, self.detail = layer, key, detail


def describe_nonfinite(t: torch.Tensor) -> str | None:
    """None when every value of `t` is finite, else "<n> non-finite values (first at [i, j]);
    allowed: finite"."""
    bad = ~torch.isfinite(t)
    if not bool(bad.any()):
        return None
    n = int(bad.sum())
    return f"{n} non-finite value{'s' if n > 1 else ''} (first at {bad.nonzero()[0].tolist()}); allowed: finite"


def _canonical(name: str) -> str:
    return name if name.startswith(PREFIX) else PREFIX + name


@dataclass
class AttnV41LayerWeights:
    """The role plus every tensor the role needs, keyed by checkpoint name."""

    role: LayerRole
    tensors: dict[str, torch.Tensor]

    @classmethod
    def from_state_dict(
        cls,
        role: LayerRole,
        tensors: Mapping[str, torch.Tensor],
        cfg: AttnV41Cfg | None = None,
        device: torch.device | str | None = None,
    ) -> AttnV41LayerWeights:
        """Take a layer's tensors (names with or without the `attn.` prefix).

        Upcasts the ratio>=2 compressor to fp32 (the checkpoint stores it bf16). With
        `cfg`, checks every name, shape and dtype against the role and raises naming the
        tensor; without it, checks names only (the runtime checks shapes on use). Either
        way a tensor holding NaN or ±inf raises `NonFiniteWeightError` (a ValueError)
        naming it, `layers.{i}.attn.<name>`.
        """
        got = {_canonical(k): v for k, v in tensors.items()}
        if role.is_kv_source and role.ratio >= 2:
            for k in ("attn.compressor.wkv.weight", "attn.compressor.wgate.weight"):
                if k in got and got[k].dtype == torch.bfloat16:
                    got[k] = got[k].float()
        spec = expected_tensors(cfg, role)
        missing = sorted(set(spec) - set(got))
        extra = sorted(set(got) - set(spec))
        if missing:
            raise KeyError(f"layer {role.layer} ({role.name}): tensor {missing[0]!r} is missing (missing: {missing})")
        if extra:
            raise KeyError(
                f"layer {role.layer} ({role.name}): unexpected tensor {extra[0]!r} for this role "
                f"(allowed: {sorted(spec)})"
            )
        for k, (shape, dtypes) in spec.items():
            t = got[k]
            if t.dtype not in dtypes:
                raise TypeError(f"layer {role.layer}: {k}.dtype = {t.dtype}; allowed: {list(dtypes)}")
            if shape is not None and tuple(t.shape) != shape:
                raise ValueError(f"layer {role.layer}: {k}.shape = {tuple(t.shape)}; allowed: {shape}")
        for k in spec:  # every tensor is float (dtypes checked above); once per construction, never per forward
            detail = describe_nonfinite(got[k])
            if detail is not None:
                raise NonFiniteWeightError(role.layer, k, detail)
        if device is not None:
            got = {k: v.to(device) for k, v in got.items()}
        return cls(role, got)

    @classmethod
    def from_checkpoint(
        cls,
        path,
        layer: int,
        cfg: AttnV41Cfg | None = None,
        device: torch.device | str = "cpu",
    ) -> AttnV41LayerWeights:
        """Layer `layer` from a checkpoint directory in the released layout, fp8 weights
        dequantized to bf16 (see `attnv41.checkpoint.load_layer`)."""
        from .checkpoint import load_layer  # checkpoint imports this module

        return load_layer(path, layer, cfg=cfg, device=device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The runtime tensors under the checkpoint's names relative to the layer."""
        return dict(self.tensors)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[_canonical(name)]

    def get(self, name: str) -> torch.Tensor | None:
        return self.tensors.get(_canonical(name))

    @property
    def device(self) -> torch.device:
        return self.tensors["attn.wq_a.weight"].device

    def to(self, device) -> AttnV41LayerWeights:
        return AttnV41LayerWeights(self.role, {k: v.to(device) for k, v in self.tensors.items()})
