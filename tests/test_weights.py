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
    format 'fp8', holding wo_a as its bytes by default (wo_a='fp8') and as its bf16 with wo_a='bf16'."""
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
        lw = AttnV41LayerWeights.from_state_dict(cfg.roles[i], b, cfg=cfg, wo_a="bf16")
        assert lw.format == "fp8", f"layer {i}"
        assert lw.get("wo_a.scale") is None, f"layer {i}: wo_a held as its bf16 with wo_a='bf16'"
        assert torch.equal(lw["wo_a.weight"], dequant_weight(b["wo_a.weight"], b["wo_a.scale"])), f"layer {i}"
        for kept in (
            AttnV41LayerWeights.from_state_dict(cfg.roles[i], b, cfg=cfg, wo_a="fp8"),
            AttnV41LayerWeights.from_state_dict(cfg.roles[i], b, cfg=cfg),  # the default keeps the bytes
        ):
            assert kept.format == "fp8", f"layer {i}"
            assert torch.equal(kept["wo_a.weight"].view(torch.uint8), b["wo_a.weight"].view(torch.uint8)), f"layer {i}"
            assert torch.equal(kept["wo_a.scale"].view(torch.uint8), b["wo_a.scale"].view(torch.uint8)), f"layer {i}"
        assert AttnV41LayerWeights.from_state_dict(cfg.roles[i], a, cfg=cfg).format == "bf16", f"layer {i}"


def test_random_weights_format_checked():
    cfg = small_preset(max_tokens=8, max_seq=16)
    with pytest.raises(ValueError, match=r"weights = 'fp4'; allowed: 'bf16', 'fp8'"):
        random_weights(cfg, 0, weights="fp4")
    with pytest.raises(ValueError, match=r"layer 0: wq_b\.weight: shape \[128, 16\]; allowed: .*multiple of 32"):
        random_weights(small_cfg(), 0, weights="fp8")  # q_rank 16: not whole FP8 blocks


@pytest.mark.parametrize("name", ["wq_a", "wo_a"])
def test_fp8_weight_that_dequantizes_to_inf_is_named(name):
    """A finite e4m3 byte times a finite e8m0 scale can overflow: 448 · 2^(0xF7 − 127) rounds
    to bf16 inf, 448 · 2^(0xF6 − 127) does not. Refused as the checkpoint loader refuses it
    (before 2026-12-04 `from_state_dict` took it and every output of the layer was NaN),
    for a kept FP8 linear and for wo_a kept as its bytes; the largest finite case loads."""
    cfg = small_preset(max_tokens=8, max_seq=16)
    w = dict(random_weights(cfg, 6, weights="fp8")[0])
    kw = dict(wo_a="fp8") if name == "wo_a" else {}
    q = w[f"{name}.weight"].clone()
    q.view(torch.uint8)[32, 0] = 0x7E  # e4m3 448, in scale block [1, 0]
    w[f"{name}.weight"] = q
    for byte, ok in ((0xF6, True), (0xF7, False), (0xFE, False)):
        s = w[f"{name}.scale"].clone()
        s.view(torch.uint8)[1, 0] = byte
        w[f"{name}.scale"] = s
        if ok:
            lw = AttnV41LayerWeights.from_state_dict(cfg.roles[0], w, cfg=cfg, **kw)
            assert torch.isfinite(dequant_weight(q, s).float()).all() and lw.format == "fp8"
            continue
        with pytest.raises(NonFiniteWeightError) as e:
            AttnV41LayerWeights.from_state_dict(cfg.roles[0], w, cfg=cfg, **kw)
        assert e.value.key == f"attn.{name}.weight"
        assert str(e.value).startswith(f"layers.0.attn.{name}.weight: ")
        assert f"(after dequantization; scale bytes up to 0x{byte:02X})" in str(e.value)


def test_state_dict_inputs_are_named():
    """Two names for one tensor, a role the config does not give that layer, a non-tensor
    value and a meta tensor: each refused naming it (before: the later name silently won,
    the role passed until the runtime's check, AttributeError, a meta .item() error)."""
    from attnv41.config import LayerRole

    cfg = small_cfg()
    w = dict(random_weights(cfg, 3)[1])
    with pytest.raises(
        KeyError, match=r"layer 1: 'wq_a\.weight' and 'attn\.wq_a\.weight' both name 'attn\.wq_a\.weight'"
    ):
        AttnV41LayerWeights.from_state_dict(cfg.roles[1], {**w, "attn.wq_a.weight": w["wq_a.weight"]}, cfg=cfg)
    other = LayerRole(1, 1, True, True, False, False)
    with pytest.raises(ValueError, match=r"role LayerRole\(layer=1, ratio=1.*allowed: the config's role for its layer"):
        AttnV41LayerWeights.from_state_dict(other, w, cfg=cfg)
    with pytest.raises(ValueError, match=r"allowed: the config's role for its layer \(layer 0\.\.5\)"):
        AttnV41LayerWeights.from_state_dict(LayerRole(99, 0, False, False, False, False), w, cfg=cfg)
    with pytest.raises(TypeError, match=r"role is a str; allowed: a LayerRole"):
        AttnV41LayerWeights.from_state_dict("full", w, cfg=cfg)
    with pytest.raises(TypeError, match=r"layer 1: 'q_norm\.weight' is a list; allowed: a torch\.Tensor"):
        AttnV41LayerWeights.from_state_dict(cfg.roles[1], {**w, "q_norm.weight": [1.0]}, cfg=cfg)
    meta = torch.empty(w["q_norm.weight"].shape, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match=r"layer 1: 'q_norm\.weight' is on the meta device"):
        AttnV41LayerWeights.from_state_dict(cfg.roles[1], {**w, "q_norm.weight": meta}, cfg=cfg)
    assert AttnV41LayerWeights.from_state_dict(cfg.roles[1], w, cfg=cfg).role == cfg.roles[1]
