"""A stack of layers over one sequence on one `AttnV41`: weights, states, shared state.

The smallest driver an engine would write; the golden replay, the demo and the tests
use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..config import AttnV41Cfg
from ..weights import AttnV41LayerWeights
from .attn import AttnV41, AttnV41Run

__all__ = ["RuntimeStack"]


class RuntimeStack:
    def __init__(
        self,
        cfg: AttnV41Cfg,
        weights: Sequence[AttnV41LayerWeights | Mapping[str, torch.Tensor]],
        device: torch.device | str = "cpu",
        index_keys: str = "own",
        ops=None,
        check_finite: bool = False,
        bucket_min: int | None = None,
        kv_format: str = "bf16",
        wo_a: str = "bf16",
    ):
        """`wo_a`: how an FP8 `wo_a` given with its scale is held (`AttnV41LayerWeights.from_state_dict`)."""
        if len(weights) != cfg.n_layers:
            raise ValueError(f"{len(weights)} weight sets; allowed: exactly n_layers = {cfg.n_layers}")
        self.cfg = cfg
        extra = {} if bucket_min is None else {"bucket_min": bucket_min}
        self.attn = AttnV41(
            cfg, device, index_keys=index_keys, ops=ops, check_finite=check_finite, kv_format=kv_format, **extra
        )
        self.weights = [
            w
            if isinstance(w, AttnV41LayerWeights)
            else AttnV41LayerWeights.from_state_dict(cfg.roles[i], w, cfg=cfg, device=self.attn.device, wo_a=wo_a)
            for i, w in enumerate(weights)
        ]
        self.states = [self.attn.new_layer_state(i) for i in range(cfg.n_layers)]
        self.shared = self.attn.new_shared()

    def layer(self, i: int, x: torch.Tensor, start_pos: int) -> AttnV41Run:
        return self.attn.forward(self.weights[i], self.states[i], self.shared, x, start_pos)

    def step(self, xs: Sequence[torch.Tensor], start_pos: int, keep: bool = False) -> list:
        """All layers in order; `xs[i]` is layer i's input. With `keep`, returns each
        layer's output cloned (runs are views, overwritten by the next layer)."""
        outs = []
        for i in range(self.cfg.n_layers):
            run = self.layer(i, xs[i], start_pos)
            outs.append(run.out.clone() if keep else run)
        return outs

    def rollback(self, pos: int) -> None:
        """`AttnV41.rollback` of this stack's sequence to `pos`."""
        self.attn.rollback(self.states, self.shared, pos)
