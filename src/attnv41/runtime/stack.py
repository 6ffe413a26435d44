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
from .checks import check_released_keys
from .device import on_own_device

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
        wo_a: str = "fp8",
    ):
        """`wo_a`: how an FP8 `wo_a` given with its scale is held (`AttnV41LayerWeights.from_state_dict`;
        default: its bytes)."""
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

    @on_own_device(lambda self: self.attn)
    def layer(self, i: int, x: torch.Tensor, start_pos: int) -> AttnV41Run:
        return self.attn.forward(self.weights[i], self.states[i], self.shared, x, start_pos)

    @on_own_device(lambda self: self.attn)
    def step(self, xs: Sequence[torch.Tensor], start_pos: int, keep: bool = False) -> list:
        """All layers in order; `xs[i]` is layer i's input. With `keep`, returns each
        layer's output cloned (runs are views, overwritten by the next layer). Every
        layer's input and weights are checked before layer 0 runs: a refused step changes
        nothing (a bad input of layer 3 does not leave layers 0-2 stepped)."""
        self.check_step(xs, start_pos)
        outs = []
        for i in range(self.cfg.n_layers):
            run = self.layer(i, xs[i], start_pos)
            outs.append(run.out.clone() if keep else run)
        return outs

    def check_step(self, xs: Sequence[torch.Tensor], start_pos: int) -> int:
        """What `step` checks before its first layer: n_layers inputs of the same m
        (`AttnV41.forward`'s rules for x), each layer's weights and state, with released
        index keys the rows each index source would score (`check_released_keys`), and with
        `check_finite` the inputs' values. Returns m."""
        n, attn = self.cfg.n_layers, self.attn
        if isinstance(xs, torch.Tensor) or not isinstance(xs, Sequence) or len(xs) != n:
            got = f"a {type(xs).__name__}" + (f" of {len(xs)}" if isinstance(xs, Sequence) else "")
            raise ValueError(f"xs is {got}; allowed: a sequence of n_layers = {n} tensors (layer i's input)")
        ms = []
        for i, x in enumerate(xs):
            try:
                ms.append(attn._check_x(x))
            except (TypeError, ValueError) as e:
                raise type(e)(f"xs[{i}]: {e}") from None
        if len(set(ms)) != 1:
            raise ValueError(f"xs rows per layer {ms}; allowed: the same m for every layer")
        for i, (w, st) in enumerate(zip(self.weights, self.states)):
            attn._check_layer(w, st)
            if w.role.layer != i:
                raise ValueError(f"weights[{i}] are layer {w.role.layer}'s; allowed: layer {i}'s")
        if attn.index_keys == "released" and isinstance(start_pos, int) and start_pos > 0:
            # what the index sources would score, for the whole step (forward checks it per layer)
            check_released_keys(self.cfg, self.shared.index_k_owner, start_pos, ms[0])
        if attn.check_finite:
            for i, x in enumerate(xs):
                attn._check_values(x, i, start_pos)
        return ms[0]

    @on_own_device(lambda self: self.attn)
    def rollback(self, pos: int) -> None:
        """`AttnV41.rollback` of this stack's sequence to `pos`."""
        self.attn.rollback(self.states, self.shared, pos)
