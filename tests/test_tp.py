"""Tensor parallelism over heads (`attnv41.tp`): the shares' geometry and weights, every
value before `wo_b` bit for bit the full layer's on the rank's heads, the reduced output
within its rounding bound of the full layer's, the golden files through two ranks, the
checkpoint loader's shares, the Triton kernels (interpreter) on a share, clear refusals."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnv41 import AttnV41LayerWeights, v41_flash
from attnv41.checkpoint import FP8_NAMES, load_layer, load_model, write_checkpoint
from attnv41.golden import GoldenFile, replay
from attnv41.reference.layer import RefStack
from attnv41.synthetic import random_inputs, random_weights
from attnv41.testing import bf16_ulp
from attnv41.tp import TPStack, check_tp, shard_weights, tp_config, tp_impl, tp_reduce, tp_sizes
from attnv41.weights import PREFIX
from helpers import TRACE, golden_path, small_cfg, split_sizes

# 8 heads in 4 groups (group width 64), every FP8 linear's input a multiple of 32: tp 2 and 4
_KW = dict(n_heads=8, groups=4, q_rank=32, o_rank=32)


def _full(cfg, w):
    return [AttnV41LayerWeights.from_state_dict(cfg.roles[i], x, cfg=cfg) for i, x in enumerate(w)]


def test_sizes_and_config():
    flash = v41_flash()
    assert tp_sizes(flash) == (1, 2, 4, 8) == tp_sizes(flash, fp8=True)
    local = tp_config(flash, 8)
    assert (local.n_heads, local.groups, local.group_width) == (8, 1, flash.group_width)
    assert local.roles == flash.roles and local.max_seq == flash.max_seq
    assert tp_config(flash, 1) is flash
    tiny = small_cfg()  # 4 heads, 2 groups of o_rank 16: a rank's FP8 wo_b input would be 16 wide
    assert tp_sizes(tiny) == (1, 2) and tp_sizes(tiny, fp8=True) == (1,)


@pytest.mark.parametrize(
    "args, err, msg",
    [
        ((3,), ValueError, r"tp_size = 3; allowed: \[1, 2, 4, 8\] \(divisors of groups \(8\)"),
        ((16,), ValueError, r"tp_size = 16; allowed: \[1, 2, 4, 8\]"),
        ((0,), ValueError, r"tp_size = 0; allowed"),
        ((True,), TypeError, r"tp_size = True; allowed: an int"),
        ((2.0,), TypeError, r"tp_size = 2.0; allowed: an int"),
        ((2, 2), ValueError, r"tp_rank = 2; allowed: 0..1"),
        ((2, -1), ValueError, r"tp_rank = -1; allowed: 0..1"),
    ],
)
def test_refusals_name_the_value(args, err, msg):
    with pytest.raises(err, match=msg):
        check_tp(v41_flash(), *args)


def test_fp8_refusal_names_the_block_rule():
    cfg = small_cfg(q_rank=32, o_rank=16, dim=64)
    w = _full(cfg, random_weights(cfg, 1, weights="fp8"))
    with pytest.raises(ValueError, match=r"tp_size = 2; allowed: \[1\] \(divisors of groups \(2\) whose rank's wo_b"):
        shard_weights(w[0], cfg, 0, 2)
    with pytest.raises(ValueError, match="tp_size = 2; allowed"):
        TPStack(cfg, w, 2)


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_shard_slices(fmt):
    cfg = small_cfg(**_KW)
    full = _full(cfg, random_weights(cfg, 3, weights=fmt))
    H, D, R = cfg.n_heads, cfg.head_dim, cfg.o_rank
    for w in full:
        parts = [shard_weights(w, cfg, r, 4) for r in range(4)]
        for name, dim in (("wq_b.weight", 0), ("attn_sink", 0), ("wo_a.weight", 0), ("wo_b.weight", 1)):
            got = torch.cat([p[name] for p in parts], dim=dim)
            assert torch.equal(got.view(torch.uint8) if got.dtype.itemsize == 1 else got, _bytes(w[name])), name
        assert parts[1]["wq_b.weight"].shape == (H // 4 * D, cfg.q_rank) and parts[1]["wo_b.weight"].is_contiguous()
        assert parts[3]["wo_a.weight"].shape == (R, cfg.group_width)
        if fmt == "fp8":  # whole 32-blocks: the scales slice with their weights
            assert torch.equal(_bytes(torch.cat([p["wq_b.scale"] for p in parts])), _bytes(w["wq_b.scale"]))
            assert torch.equal(_bytes(torch.cat([p["wo_b.scale"] for p in parts], 1)), _bytes(w["wo_b.scale"]))
            # wo_a held as its bytes (the default): its scale rows slice with its rows
            assert torch.equal(_bytes(torch.cat([p["wo_a.scale"] for p in parts])), _bytes(w["wo_a.scale"]))
        sliced = ("wq_b.weight", "wq_b.scale", "attn_sink", "wo_a.weight", "wo_a.scale", "wo_b.weight", "wo_b.scale")
        for k, v in w.state_dict().items():  # everything else is the same tensor
            if k.removeprefix(PREFIX) not in sliced:
                assert parts[2].tensors[k] is v, k


def _bytes(t):
    return t.view(torch.uint8) if t.dtype.itemsize == 1 else t


def test_shard_refuses_a_sharded_or_foreign_weight():
    cfg = small_cfg(**_KW)
    w = _full(cfg, random_weights(cfg, 3))
    half = shard_weights(w[1], cfg, 0, 2)
    with pytest.raises(ValueError, match=r"wq_b.weight.shape = \(128, 32\); allowed: dim 0 of 256 .*unsharded"):
        shard_weights(half, cfg, 0, 2)
    with pytest.raises(TypeError, match="w is a dict; allowed: AttnV41LayerWeights"):
        shard_weights({}, cfg, 0, 2)


def test_reduce():
    a = torch.tensor([1.0, 2.0**-9, -3.0], dtype=torch.bfloat16)
    b = torch.tensor([2.0**-9, 1.0, 3.0], dtype=torch.bfloat16)
    assert torch.equal(tp_reduce([a, b]), (a.float() + b.float()).bfloat16())
    with pytest.raises(ValueError, match=r"partials\[1\] is torch.float32 \[3\] on cpu; allowed: bf16 \[3\]"):
        tp_reduce([a, b.float()])
    with pytest.raises(ValueError, match="allowed: a non-empty list"):
        tp_reduce([])


def _bound(full_out, partials, out):
    """|out − full_out| ≤ ½ ulp of each bf16 partial (each rounded once from its exact sum)
    + ½ ulp of the full layer's output + ½ ulp of the reduced one, plus the fp32 and fp64
    summation slack (2^-20 of the magnitudes, far below a bf16 half ulp)."""
    f = full_out.double()
    b = (bf16_ulp(full_out).double() + bf16_ulp(out).double()) / 2
    mag = f.abs()
    for p in partials:
        b += bf16_ulp(p).double() / 2
        mag += p.double().abs()
    return b + mag * 2.0**-20


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(2, 40),
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    tp=st.sampled_from([2, 4]),
    fmt=st.sampled_from(["bf16", "fp8"]),
    ratios=st.sampled_from([(0, 2, 2, 1, 1, 1), (0, 4, 4, 2, 2, 2)]),
    seed=st.integers(0, 10_000),
)
def test_ranks_equal_the_full_layer(n, sizes, tp, fmt, ratios, seed):
    """A prompt in random chunks (single tokens among them: decode steps) through tp ranks
    of the runtime and, beside it, the full reference: q and o gathered over the ranks
    and every replicated field bit for bit the full layer's, each rank's partial bit for bit
    the reference's on that rank's share, the reduced output within `_bound`."""
    cfg = small_cfg(compress_ratios=ratios, max_seq=48, max_tokens=48, **_KW)
    w, xs = random_weights(cfg, seed, weights=fmt), random_inputs(cfg, n, seed + 1)
    full = RefStack(cfg, w)
    ranks = TPStack(cfg, w, tp)
    ref_ranks = TPStack(cfg, w, tp, impl="reference")
    s = 0
    for c in split_sizes(sizes, n):
        for i in range(cfg.n_layers):
            x = xs[i][s : s + c]
            ref, got, rr = full.layer(i, x, s), ranks.layer(i, x, s), ref_ranks.layer(i, x, s)
            where = f"[{s}, {s + c}) L{i}"
            for name in TRACE:  # q, o, rows, selection, scores, caches: the full layer's bytes
                if name != "out":
                    a, b = getattr(ref, name), getattr(got, name)
                    if a is None:  # the runtime may report scores the reference does not
                        assert b is None or name == "index_score", (where, name)
                    else:
                        assert b is not None and torch.equal(a, b), (where, name)
            assert ref.index_k_owner == got.index_k_owner, where
            for r in range(tp):
                assert torch.equal(got.partials[r], rr.partials[r]), (where, r)
            err = (got.out.double() - ref.out.double()).abs()
            assert torch.isfinite(got.out).all()
            assert (err <= _bound(ref.out, got.partials, got.out)).all(), (where, err.max().item())
        s += c


@pytest.mark.parametrize("name", ["tiny", "headdim", "fp8"])
def test_golden_through_two_ranks(name):
    """The golden files through 2 ranks of the runtime on the CPU, reduced: every rule of
    `attnv41 check`, both variants."""
    g = GoldenFile(golden_path(name))
    for v in g.variants:
        rep = replay(g, v, tp_impl(2), impl_name="tp2")
        assert rep.n_compared > 0 and rep.n_skipped == 0
        assert rep.ok and not rep.problems(), (v, rep.failures())


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_checkpoint_shares(tmp_path, fmt):
    cfg = small_cfg(**_KW)
    write_checkpoint(tmp_path, cfg, random_weights(cfg, 5), shards=2, fp8_names=() if fmt == "bf16" else FP8_NAMES)
    whole = load_model(tmp_path, cfg=cfg, progress=False)
    for r in range(2):
        part = load_model(tmp_path, cfg=cfg, progress=False, tp_rank=r, tp_size=2)
        for i in range(cfg.n_layers):
            want = shard_weights(whole[i], cfg, r, 2).state_dict()
            got = part[i].state_dict()
            assert got.keys() == want.keys()
            assert all(torch.equal(_bytes(got[k]), _bytes(want[k])) for k in got)
    one = load_layer(tmp_path, 2, cfg=cfg, tp_rank=1, tp_size=4)
    assert one["wq_b.weight"].shape == (2 * cfg.head_dim, cfg.q_rank)
    with pytest.raises(ValueError, match="tp_size = 3; allowed"):
        load_model(tmp_path, cfg=cfg, progress=False, tp_size=3)


def test_checkpoint_fp8_shares(tmp_path):
    cfg = small_cfg(**_KW)
    write_checkpoint(tmp_path, cfg, random_weights(cfg, 5), shards=3)
    whole = load_model(tmp_path, cfg=cfg, progress=False, weights="fp8", wo_a="fp8")
    assert whole[0].format == "fp8" and "attn.wo_a.scale" in whole[0].tensors
    for r in range(4):
        part = load_model(tmp_path, cfg=cfg, progress=False, weights="fp8", wo_a="fp8", tp_rank=r, tp_size=4)
        for i in range(cfg.n_layers):
            want = shard_weights(whole[i], cfg, r, 4).state_dict()
            got = part[i].state_dict()
            assert got.keys() == want.keys() and "attn.wo_a.scale" in got
            assert all(torch.equal(_bytes(got[k]), _bytes(want[k])) for k in got)


def test_triton_kernels_on_a_share():
    """The Triton op table (the interpreter on the CPU, the GPU on CUDA) over 2 ranks of 4
    heads each: the selections and caches equal the torch table's, q, o and out within
    the bf16 tolerance of the kernels' rounding (the interpreter stores bf16 differently)."""
    pytest.importorskip("triton")
    from attnv41.kernels import _triton

    if not (_triton.interpreting() or torch.cuda.is_available()):
        pytest.skip("needs the interpreter or CUDA")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = small_cfg(**_KW)
    w, xs = random_weights(cfg, 11), random_inputs(cfg, 12, 12, device=dev)
    tri = TPStack(cfg, w, 2, device=dev, ops="triton")
    ref = TPStack(cfg, w, 2, impl="reference")
    for s, c in ((0, 9), (9, 1), (10, 2)):
        for i in range(cfg.n_layers):
            x = xs[i][s : s + c]
            a, b = ref.layer(i, x.cpu(), s), tri.layer(i, x, s)
            assert torch.equal(a.sel, b.sel.cpu()), (s, i)
            for name in ("q", "o", "out"):
                g, r = getattr(b, name).double().cpu(), getattr(a, name).double()
                assert torch.isfinite(g).all()
                tol = r.abs().amax() * 2.0**-6 + 1e-3
                assert ((g - r).abs() <= tol).all(), (s, i, name, (g - r).abs().max().item())


def test_batched_runtime_on_a_share():
    """`BatchV41` over a rank's share (two sequences at other positions in each step) gives
    each sequence the bytes its rank's `RuntimeStack` gives it alone."""
    from attnv41.runtime import RuntimeStack
    from attnv41.runtime.batch import BatchV41

    cfg = small_cfg(**_KW)
    local = tp_config(cfg, 2)
    full = _full(cfg, random_weights(cfg, 21))
    xs = [random_inputs(cfg, 20, 30 + k) for k in range(2)]
    for r in range(2):
        share = [shard_weights(w, cfg, r, 2) for w in full]
        bt = BatchV41(local, n_slots=2, block_rows=4)
        alone = [RuntimeStack(local, share) for _ in range(2)]
        for slots, starts, lens in (([0], [0], [7]), ([0, 1], [7, 0], [1, 9]), ([1, 0], [9, 8], [2, 1])):
            bx = [torch.cat([xs[sl][i][s : s + m] for sl, s, m in zip(slots, starts, lens)]) for i in range(6)]
            outs = bt.step(share, bx, slots, starts, lens)
            o = 0
            for sl, s, m in zip(slots, starts, lens):
                want = alone[sl].step([x[s : s + m] for x in xs[sl]], s, keep=True)
                for i in range(cfg.n_layers):
                    assert torch.equal(want[i], outs[i][o : o + m]), (r, sl, s, i)
                o += m


def test_wo_a_bytes_shared_by_whole_blocks_else_as_their_bf16():
    """An FP8 `wo_a` held as bytes: a share on whole 32-row blocks keeps the bytes and its
    scale rows; where a block would straddle two ranks (o_rank 48, a weight built without
    a cfg, which keeps the bytes) the share holds the exact bf16 of its rows. Either way the
    share's values are the full weight's rows."""
    from attnv41.checkpoint import quantize_fp8
    from attnv41.reference.fp8 import dequant_weight

    for kw, bytes_kept in ((_KW, True), (dict(o_rank=48), False)):
        cfg = small_cfg(**kw)
        w = random_weights(cfg, 9)[2]  # bf16 linears, wo_a as the checkpoint's bytes
        w["wo_a.weight"], w["wo_a.scale"] = quantize_fp8(w["wo_a.weight"])
        full = AttnV41LayerWeights.from_state_dict(cfg.roles[2], w, wo_a="fp8")
        assert full["wo_a.weight"].dtype == torch.float8_e4m3fn
        values = dequant_weight(full["wo_a.weight"], full["wo_a.scale"], 32)
        rows = cfg.groups // 2 * cfg.o_rank
        for r in range(2):
            part = shard_weights(full, cfg, r, 2)
            got = part["wo_a.weight"]
            assert (got.dtype == torch.float8_e4m3fn) == bytes_kept and (
                "attn.wo_a.scale" in part.tensors
            ) == bytes_kept
            if bytes_kept:
                got = dequant_weight(got, part["wo_a.scale"], 32)
            assert torch.equal(got, values[r * rows : (r + 1) * rows]), (kw, r)


def test_stack_details():
    """TPStack: an FP8 wo_a held as asked (`wo_a=`), the non-finite counter summed over the
    ranks (what `check --tp` reports), partials that are copies, `stored` of the gathered
    fields; `tp_reduce` refuses what is not a list of tensors."""
    cfg = small_cfg(**_KW)
    w, xs = random_weights(cfg, 13, weights="fp8"), random_inputs(cfg, 6, 14)
    st = TPStack(cfg, w, 2, wo_a="fp8")
    assert st.ranks[1].weights[3]["wo_a.weight"].dtype == torch.float8_e4m3fn
    assert TPStack(cfg, w, 2).ranks[1].weights[3]["wo_a.weight"].dtype == torch.float8_e4m3fn  # the default
    assert TPStack(cfg, w, 2, wo_a="bf16").ranks[1].weights[3]["wo_a.weight"].dtype == torch.bfloat16
    runs = [st.layer(i, xs[i], 0) for i in range(cfg.n_layers)]
    for r in runs:  # each layer's partials survive the later layers' calls
        assert torch.equal(tp_reduce(r.partials), r.out)
    assert runs[0].stored("q").shape == runs[0].q.shape == (6, cfg.n_heads, cfg.head_dim)
    assert st.nonfinite_count() == 0 and TPStack(cfg, w, 2, impl="reference").nonfinite_count() is None
    g = GoldenFile(golden_path("tiny"))
    assert replay(g, "released", tp_impl(2)).nonfinite == 0
    with pytest.raises(ValueError, match=r"partials is \[1.0, 2.0\]; allowed: a non-empty list"):
        tp_reduce([1.0, 2.0])


def test_decode_graphs_driver_on_a_share():
    """`DecodeGraphs` over a share (on the CPU the same device-driven step, eagerly) with
    its oracle: each step byte for byte the eager `forward` step of the share."""
    from attnv41.runtime import RuntimeStack
    from attnv41.runtime.graphs import DecodeGraphs

    cfg = small_cfg(**_KW)
    full = _full(cfg, random_weights(cfg, 31))
    share = [shard_weights(w, cfg, 3, 4) for w in full]
    xs = random_inputs(cfg, 24, 32)
    stack = RuntimeStack(tp_config(cfg, 4), share)
    stack.step([x[:16] for x in xs], 0)
    drv = DecodeGraphs(stack, oracle=True)
    for p in range(16, 24):
        drv.step(torch.stack([x[p : p + 1] for x in xs]), p)
    drv.oracle_flush()
    assert drv.oracle_checks == 8 and stack.attn.nonfinite_count() == 0
