"""AttnV41LayerWeights.from_state_dict: NaN and ±inf are refused once, when the weights
are built, naming the tensor (issue 10); synthetic weights in the FP8 format (issue 12)."""

from __future__ import annotations

import pytest
import torch

from attnv41.reference.fp8 import dequant_weight, quant_weight
from attnv41.synthetic import small_preset
from attnv41.weights import FP8_LINEARS, AttnV41LayerWeights, NonFiniteWeightError
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


# ---------------------------------------------------------------------------- synthetic FP8 weights
def test_random_weights_fp8_is_the_bf16_model_quantized():
    """weights='fp8': the same draws as 'bf16', each FP8 linear block-quantized by
    quant_weight, wo_a too (e4m3 with its scale, as the checkpoint stores it); it loads as
    format 'fp8', holding wo_a as its bf16 by default and as its bytes with wo_a='fp8'."""
    cfg = small_preset(max_tokens=8, max_seq=16)
    bf = random_weights(cfg, 5)
    f8 = random_weights(cfg, 5, weights="fp8")
    assert [sorted(w) for w in bf] == [sorted(w) for w in random_weights(cfg, 5, weights="bf16")]
    for i, (a, b) in enumerate(zip(bf, f8)):
        lin = [n for n in FP8_LINEARS if f"{n}.weight" in a] + ["wo_a"]
        assert set(b) == set(a) | {f"{n}.scale" for n in lin}, f"layer {i}: names"
        for k, v in a.items():
            n = k.removesuffix(".weight")
            if n in lin:
                q, s = quant_weight(v)
                assert b[k].dtype == torch.float8_e4m3fn and b[f"{n}.scale"].dtype == torch.float8_e8m0fnu, k
                assert torch.equal(b[k].view(torch.uint8), q.view(torch.uint8)), f"layer {i} {k}: e4m3 bytes"
                assert torch.equal(b[f"{n}.scale"].view(torch.uint8), s.view(torch.uint8)), f"layer {i} {n}.scale"
                if n == "wo_a":
                    assert not torch.equal(dequant_weight(q, s), v), f"layer {i} wo_a: not quantized"
            else:
                assert b[k].dtype == v.dtype and torch.equal(b[k], v), f"layer {i} {k}: unchanged"
        lw = AttnV41LayerWeights.from_state_dict(cfg.roles[i], b, cfg=cfg)
        assert lw.format == "fp8", f"layer {i}"
        assert lw.get("wo_a.scale") is None, f"layer {i}: wo_a held as its bf16 by default"
        assert torch.equal(lw["wo_a.weight"], dequant_weight(b["wo_a.weight"], b["wo_a.scale"])), f"layer {i}"
        kept = AttnV41LayerWeights.from_state_dict(cfg.roles[i], b, cfg=cfg, wo_a="fp8")
        assert torch.equal(kept["wo_a.weight"].view(torch.uint8), b["wo_a.weight"].view(torch.uint8)), f"layer {i}"
        assert torch.equal(kept["wo_a.scale"].view(torch.uint8), b["wo_a.scale"].view(torch.uint8)), f"layer {i}"
        assert AttnV41LayerWeights.from_state_dict(cfg.roles[i], a, cfg=cfg).format == "bf16", f"layer {i}"


def test_random_weights_format_checked():
    cfg = small_preset(max_tokens=8, max_seq=16)
    with pytest.raises(ValueError, match=r"weights = 'fp4'; allowed: 'bf16', 'fp8'"):
        random_weights(cfg, 0, weights="fp4")
    with pytest.raises(ValueError, match=r"layer 0: wq_b\.weight: shape \[128, 16\]; allowed: .*multiple of 32"):
        random_weights(small_cfg(), 0, weights="fp8")  # q_rank 16: not whole FP8 blocks
