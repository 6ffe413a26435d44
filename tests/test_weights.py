"""AttnV41LayerWeights.from_state_dict: NaN and ±inf are refused once, when the weights
are built, naming the tensor (issue 10)."""

from __future__ import annotations

import pytest
import torch

from attnv41.weights import AttnV41LayerWeights, NonFiniteWeightError
from helpers import random_weights, small_cfg

CASES = [
    pytest.param(1, "wq_b.weight", [(3, 4)], [float("nan")], "1 non-finite value (first at [3, 4])", id="nan_bf16"),
    pytest.param(
        3, "q_norm.weight", [(9,), (5,)], [float("inf"), float("nan")], "2 non-finite values (first at [5])", id="norm"
    ),
    pytest.param(0, "attn_sink", [(1,)], [-float("inf")], "1 non-finite value (first at [1])", id="sink_fp32"),
    pytest.param(
        1, "compressor.wgate.weight", [(0, 2)], [float("inf")], "1 non-finite value (first at [0, 2])", id="ratio2_comp"
    ),
]


@pytest.mark.parametrize("with_cfg", [True, False], ids=["cfg", "no_cfg"])
@pytest.mark.parametrize("layer, key, where, values, detail", CASES)
def test_non_finite_weight_is_named(layer, key, where, values, detail, with_cfg):
    cfg = small_cfg()
    w = dict(random_weights(cfg, 3)[layer])
    t = w[key].clone()
    for idx, v in zip(where, values):
        t[idx] = v
    w[key] = t
    with pytest.raises(NonFiniteWeightError) as e:
        AttnV41LayerWeights.from_state_dict(cfg.roles[layer], w, cfg=cfg if with_cfg else None)
    assert str(e.value) == f"layers.{layer}.attn.{key}: {detail}; allowed: finite"
    assert isinstance(e.value, ValueError) and e.value.key == f"attn.{key}"


def test_finite_weights_accepted_unchanged():
    cfg = small_cfg()
    for i, w in enumerate(random_weights(cfg, 4)):
        lw = AttnV41LayerWeights.from_state_dict(cfg.roles[i], w, cfg=cfg)
        for k, v in w.items():
            assert torch.equal(lw[k], v.to(lw[k].dtype)), f"layer {i} {k}"
