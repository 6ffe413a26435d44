"""FP8 weights in the runtime (issue 12): the released checkpoint's format as a second
weight format, run on the CPU through `ops.fp8_mm` bit for bit like the reference, the
checks of `AttnV41LayerWeights` on it, and the refusal on an op table without an FP8 GEMM."""

import pytest
import torch

from attnv41.checkpoint import quantize_fp8
from attnv41.reference.fp8 import dequant_weight, fp8_linear
from attnv41.reference.layer import RefStack
from attnv41.runtime import RuntimeStack
from attnv41.runtime.ops import TORCH_OPS
from attnv41.weights import FP8_LINEARS, AttnV41LayerWeights, NonFiniteWeightError, expected_tensors
from helpers import random_inputs, random_weights, small_cfg

TRACE = ("q", "kv_win", "sel", "o", "out", "compress_kv", "index_k", "candidates")


def _cfg(**kw):
    return small_cfg(q_rank=32, **kw)  # every FP8 linear's in-dim a multiple of 32


def _fp8(w: dict, role) -> dict:
    """Layer weights in the released FP8 format: FP8_LINEARS and wo_a as e4m3 + e8m0 scale."""
    out = dict(w)
    for n in FP8_LINEARS + ("wo_a",):
        k = f"{n}.weight"
        if k in out:
            out[k], out[f"{n}.scale"] = quantize_fp8(out[k])
    return out


def _fp8_layers(cfg, seed):
    return [_fp8(w, cfg.roles[i]) for i, w in enumerate(random_weights(cfg, seed))]


@pytest.mark.parametrize(
    "n, steps, index_keys",
    [(13, 6, "own"), (1, 5, "released"), (17, 3, "released")],
    ids=["odd_prefill", "one_token", "wrap"],
)
def test_fp8_runtime_equals_reference_bit_for_bit(n, steps, index_keys):
    cfg = _cfg(window=8, max_seq=40, max_tokens=40)
    w = _fp8_layers(cfg, 11 + n)
    xs = random_inputs(cfg, n + steps, 12 + n)
    ref = RefStack(cfg, w, index_keys=index_keys)
    rt = RuntimeStack(cfg, w, index_keys=index_keys)
    assert all(lw.format == "fp8" for lw in rt.weights)
    for p, m in [(0, n)] + [(p, 1) for p in range(n, n + steps)]:
        for i in range(cfg.n_layers):
            a, b = ref.layer(i, xs[i][p : p + m], p), rt.layer(i, xs[i][p : p + m], p)
            for name in TRACE:
                ta, tb = getattr(a, name), getattr(b, name)
                if ta is None:
                    continue
                assert tb is not None, f"pos {p} L{i} {name}: missing from the runtime"
                assert not torch.isnan(tb.float()).any(), f"pos {p} L{i} {name}: NaN"
                assert torch.equal(ta.to(tb.dtype), tb), f"pos {p} L{i} {name}: differs from the reference"


def test_fp8_differs_from_bf16_dequantized():
    """The FP8 path is not the bf16 path on dequantized weights (activations are quantized)."""
    cfg = _cfg()
    w = _fp8_layers(cfg, 3)
    plain = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg) for i in range(cfg.n_layers)]
    deq = []
    for lw in plain:
        t = {k: v for k, v in lw.state_dict().items() if not k.endswith(".scale")}
        for n in FP8_LINEARS + ("wo_a",):
            k = f"attn.{n}.weight"
            if k in t and lw.get(f"{n}.scale") is not None:
                t[k] = dequant_weight(t[k], lw[f"{n}.scale"])
        deq.append(t)
    x = random_inputs(cfg, 9, 4)[0]
    a = RuntimeStack(cfg, plain).layer(0, x, 0).out
    b = RuntimeStack(cfg, deq).layer(0, x, 0).out
    assert not torch.equal(a, b), "out: FP8 path equals the bf16 path on dequantized weights"


def test_fp8_wo_a_runs_as_its_bf16_dequantization():
    """wo_a given as the checkpoint stores it (e4m3 + scale) is kept so with wo_a='fp8', and the runtime
    gives the bits of the same layers with wo_a dequantized to bf16 (the released
    conversion's values; CPU: exact sums either way), prefill and decode."""
    cfg = _cfg(window=8, max_seq=24, max_tokens=24, o_rank=32)
    w = _fp8_layers(cfg, 21)
    deq = []
    for lw in w:
        t = dict(lw)
        t["wo_a.weight"] = dequant_weight(t["wo_a.weight"], t.pop("wo_a.scale"))
        deq.append(t)
    a, b = RuntimeStack(cfg, w, wo_a="fp8"), RuntimeStack(cfg, deq)
    assert all(lw["wo_a.weight"].dtype == torch.float8_e4m3fn for lw in a.weights)
    assert all(lw["wo_a.weight"].dtype == torch.bfloat16 for lw in b.weights)
    xs = random_inputs(cfg, 12, 22)
    for p, m in [(0, 9), (9, 1), (10, 1), (11, 1)]:
        for i in range(cfg.n_layers):
            ra, rb = a.layer(i, xs[i][p : p + m], p), b.layer(i, xs[i][p : p + m], p)
            assert not torch.isnan(ra.out.float()).any(), f"pos {p} L{i}: NaN"
            assert torch.equal(ra.out, rb.out), f"pos {p} L{i} out: FP8-stored wo_a differs from its bf16"


def test_wo_a_across_groups_holds_its_bf16():
    """o_rank 16: a 32-row scale block spans two groups, so wo_a is held as its exact bf16."""
    cfg = _cfg()
    assert cfg.o_rank % 32
    w = _fp8_layers(cfg, 23)[0]
    lw = AttnV41LayerWeights.from_state_dict(cfg.roles[0], w, cfg=cfg, wo_a="fp8")
    assert lw.get("wo_a.scale") is None and lw["wo_a.weight"].dtype == torch.bfloat16
    assert torch.equal(lw["wo_a.weight"], dequant_weight(w["wo_a.weight"], w["wo_a.scale"]))


def test_wo_a_bad_pairs_raise():
    cfg = _cfg(o_rank=32)
    w = _fp8_layers(cfg, 2)[0]
    role = cfg.roles[0]
    bare = {k: v for k, v in w.items() if k != "wo_a.scale"}
    with pytest.raises(KeyError, match=r"attn\.wo_a\.weight is float8_e4m3fn without its scale"):
        AttnV41LayerWeights.from_state_dict(role, bare, cfg=cfg)
    sc = w["wo_a.scale"]
    short = dict(w, **{"wo_a.scale": torch.cat([sc, sc[:1]])})  # one block row too many
    with pytest.raises(ValueError, match=rf"attn\.wo_a\.scale\.shape = \({sc.shape[0] + 1}, {sc.shape[1]}\) for"):
        AttnV41LayerWeights.from_state_dict(role, short, cfg=cfg)
    on_bf16 = dict(w, **{"wo_a.weight": dequant_weight(w["wo_a.weight"], w["wo_a.scale"])})
    with pytest.raises(TypeError, match=r"attn\.wo_a\.weight torch\.bfloat16 with attn\.wo_a\.scale"):
        AttnV41LayerWeights.from_state_dict(role, on_bf16, cfg=cfg)


def test_fp8_mm_torch_is_the_reference():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, 64, generator=g).to(torch.bfloat16)
    q, s = quantize_fp8(torch.randn(40, 64, generator=g) / 8)
    out = torch.full((7, 40), float("nan"), dtype=torch.bfloat16)
    TORCH_OPS.fp8_mm(x, q, s, out=out)
    assert torch.equal(out, fp8_linear(x, q, s)), "fp8_mm out differs from reference fp8_linear"


def test_weights_format_and_state_dict():
    cfg = _cfg(o_rank=32)  # wo_a's scale blocks within its groups: kept FP8
    w = _fp8_layers(cfg, 6)
    for i, role in enumerate(cfg.roles):
        lw = AttnV41LayerWeights.from_state_dict(role, w[i], cfg=cfg, wo_a="fp8")
        assert lw.format == "fp8"
        sd = lw.state_dict()
        want = set(expected_tensors(cfg, role, "fp8")) | {"attn.wo_a.scale"}  # wo_a kept as given
        assert set(sd) == want, f"layer {i}: state_dict names"
        for n in FP8_LINEARS + ("wo_a",):
            if f"{n}.weight" in w[i]:
                assert sd[f"attn.{n}.weight"].view(torch.uint8).equal(w[i][f"{n}.weight"].view(torch.uint8)), n
                assert sd[f"attn.{n}.scale"].view(torch.uint8).equal(w[i][f"{n}.scale"].view(torch.uint8)), n
        assert "attn.indexer.wq_b.scale" in sd or not role.is_index_source
    bf = AttnV41LayerWeights.from_state_dict(cfg.roles[0], random_weights(cfg, 6)[0], cfg=cfg)
    assert bf.format == "bf16"


def _bad(kind, w):
    w = dict(w)
    if kind == "e4m3_without_scale":
        del w["wq_b.scale"]
    elif kind == "scale_shape":
        w["wkv.scale"] = w["wkv.scale"][:, :1].contiguous()
    elif kind == "scale_nan_byte":
        s = w["wo_b.scale"].view(torch.uint8).clone()
        s[0, 0] = 0xFF
        w["wo_b.scale"] = s.view(torch.float8_e8m0fnu)
    elif kind == "scale_fp32":
        w["wq_a.scale"] = w["wq_a.scale"].float()
    elif kind == "scale_on_bf16_linear":
        w["indexer.weights_proj.scale"] = w["wq_a.scale"]
    elif kind == "mixed_formats":
        w["wq_b.weight"] = dequant_weight(w["wq_b.weight"], w.pop("wq_b.scale"))
    elif kind == "weight_nan_byte":
        q = w["wq_a.weight"].view(torch.uint8).clone()
        q[1, 2] = 0x7F
        w["wq_a.weight"] = q.view(torch.float8_e4m3fn)
    elif kind == "wo_a_nan_scale":
        s = w["wo_a.scale"].view(torch.uint8).clone()
        s[0, 0] = 0xFF
        w["wo_a.scale"] = s.view(torch.float8_e8m0fnu)
    return w


BAD = {
    "e4m3_without_scale": (KeyError, r"attn\.wq_b\.weight is torch\.float8_e4m3fn without its scale"),
    "scale_shape": (ValueError, r"attn\.wkv\.scale\.shape = \(1, 1\); allowed: \(1, 2\)"),
    "scale_nan_byte": (NonFiniteWeightError, r"attn\.wo_b\.scale: 1 byte 0xFF \(NaN\) \(first at \[0, 0\]\)"),
    "scale_fp32": (TypeError, r"attn\.wq_a\.scale\.dtype = torch\.float32; allowed: \[torch\.float8_e8m0fnu\]"),
    "scale_on_bf16_linear": (KeyError, r"indexer\.weights_proj\.scale' is a scale on a tensor that does not run"),
    "mixed_formats": (ValueError, r"attn\.wq_a is FP8 but attn\.wq_b\.weight is bf16 without a scale"),
    "weight_nan_byte": (NonFiniteWeightError, r"attn\.wq_a\.weight: 1 NaN byte \(first at \[1, 2\]\)"),
    "wo_a_nan_scale": (NonFiniteWeightError, r"attn\.wo_a\.scale: 1 byte 0xFF"),
}


@pytest.mark.parametrize("kind", list(BAD), ids=list(BAD))
@pytest.mark.parametrize("with_cfg", [True, False], ids=["cfg", "no_cfg"])
def test_fp8_weights_rejected(kind, with_cfg):
    cfg = _cfg()
    role = cfg.roles[1]  # kv + index source: every FP8 linear
    w = _fp8(random_weights(cfg, 8)[1], role)
    exc, msg = BAD[kind]
    with pytest.raises(exc, match=msg):
        AttnV41LayerWeights.from_state_dict(role, _bad(kind, w), cfg=cfg if with_cfg else None)
    AttnV41LayerWeights.from_state_dict(role, w, cfg=cfg if with_cfg else None)  # the good set still works


def test_fp8_in_dim_not_whole_blocks_rejected():
    cfg = small_cfg()  # q_rank 16: wq_b's in-dim is not a multiple of 32
    w = _fp8(random_weights(cfg, 9)[0], cfg.roles[0])
    with pytest.raises(ValueError, match=r"attn\.wq_b\.weight\.shape = \(128, 16\); allowed: \[out, in\] with in a"):
        AttnV41LayerWeights.from_state_dict(cfg.roles[0], w, cfg=cfg)


def test_fp8_runs_on_the_triton_table():
    """The Triton table's FP8 kernel (the interpreter here, the GPU on CUDA) runs FP8 weights
    through prefill and decode; its outputs agree with the exact torch table's within
    0.05 of max |out| (the kernel sums in another fp32 order; an ulp moved upstream can move
    an e4m3 activation by a step downstream)."""
    cfg = _cfg(max_seq=16, max_tokens=16)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    w8 = [
        AttnV41LayerWeights.from_state_dict(r, t, cfg=cfg, device=dev) for r, t in zip(cfg.roles, _fp8_layers(cfg, 2))
    ]
    pre_x = [t.to(dev) for t in random_inputs(cfg, 5, 3)]
    dec_x = [t.to(dev) for t in random_inputs(cfg, 1, 4)]
    outs = {}
    for ops in ("torch", "triton"):
        stack = RuntimeStack(cfg, w8, device=dev, ops=ops)
        pre = torch.stack(stack.step(pre_x, 0, keep=True))
        dec = torch.stack(stack.step(dec_x, 5, keep=True))
        outs[ops] = (pre, dec)
    for name, i in (("prefill out", 0), ("decode out", 1)):
        got, want = outs["triton"][i].float(), outs["torch"][i].float()
        assert torch.isfinite(got).all(), f"{name}: non-finite values from the Triton table"
        err = float((got - want).abs().max())
        assert err <= 0.05 * float(want.abs().max()), f"{name}: max |triton - torch| = {err:.3g}"
