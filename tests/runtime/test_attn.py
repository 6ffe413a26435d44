"""The runtime `AttnV41` on the CPU: against the golden files, against the reference (bit
for bit: the CPU op table uses the reference's rounding), errors and state safety."""

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from attnv41.golden import GoldenFile, replay, runtime_impl
from attnv41.reference.layer import RefStack
from attnv41.runtime import AttnV41, RuntimeStack
from attnv41.weights import AttnV41LayerWeights
from helpers import assert_same_run as _assert_same
from helpers import golden_path, random_inputs, random_weights, small_cfg
from helpers import same_snapshot as _same_snapshot
from helpers import stack_snapshot as _snapshot


@pytest.mark.parametrize("variant", ["released", "intended"])
@pytest.mark.parametrize("name", ["tiny", "headdim"])
def test_runtime_matches_golden(name, variant):
    rep = replay(GoldenFile(golden_path(name)), variant, runtime_impl, impl_name="runtime")
    assert rep.n_compared > 0 and rep.n_skipped == 0
    assert rep.ok, "\n".join(rep.failures())


def _run_both(cfg, n, decode_steps, seed, index_keys, bucket_min=None):
    w = random_weights(cfg, seed)
    xs = random_inputs(cfg, n + decode_steps, seed + 1)
    ref = RefStack(cfg, w, index_keys=index_keys)
    rt = RuntimeStack(cfg, w, index_keys=index_keys, bucket_min=bucket_min)
    for i in range(cfg.n_layers):
        _assert_same(ref.layer(i, xs[i][:n], 0), rt.layer(i, xs[i][:n], 0), f"prefill L{i}")
    for p in range(n, n + decode_steps):
        for i in range(cfg.n_layers):
            _assert_same(ref.layer(i, xs[i][p : p + 1], p), rt.layer(i, xs[i][p : p + 1], p), f"decode{p} L{i}")
    return rt


@example(n=1, decode_steps=1, window=4, topk=2, ratios=(0, 4, 4, 1, 1, 1), index_keys="own", seed=0, bucket_min=1)
@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 30),
    decode_steps=st.integers(0, 12),
    window=st.sampled_from([4, 8, 16]),
    topk=st.sampled_from([2, 6, 9]),
    ratios=st.sampled_from([(0, 2, 2, 1, 1, 1), (0, 4, 4, 1, 1, 1), (0, 1, 1, 1, 1, 1), (0, 4, 4, 2, 2, 2)]),
    index_keys=st.sampled_from(["own", "released"]),
    seed=st.integers(0, 10_000),
    bucket_min=st.sampled_from([1, 4, 16, 1024]),
)
def test_runtime_equals_reference_bit_for_bit(n, decode_steps, window, topk, ratios, index_keys, seed, bucket_min):
    """Random geometries and lengths, covering window wrap, group completion and
    non-completion, and the first decode after a prefill. Decode runs the device-driven
    step; small `bucket_min` values make steps cross context buckets (4, 8, 16, 32, 48)
    and score over fewer keys than index_topk (the top-k width then shrinks, −1 padded)."""
    cfg = small_cfg(window=window, index_topk=topk, compress_ratios=ratios, max_seq=48, max_tokens=48)
    _run_both(cfg, n, decode_steps, seed, index_keys, bucket_min)


@pytest.mark.parametrize(
    "n, steps", [(13, 6), (1, 9), (8, 9), (17, 1)], ids=["odd_prefill", "one_token", "window_exact", "wrap"]
)
def test_hostile_positions(n, steps):
    cfg = small_cfg(window=8, max_seq=40, max_tokens=40)
    _run_both(cfg, n, steps, 5, "own")


def test_fixed_launch_width_keeps_bits():
    """Pinned hypothesis example (seed 4): the runtime launches sparse attention at the
    fixed width window + index_topk (22 here), the reference at the natural width (14 at
    prefill layer 4); before the reference padded its last 64-entry block, prefill L4 `o`
    was one bf16 ulp off (issue 10 item 18)."""
    cfg = small_cfg(window=16, index_topk=6, compress_ratios=(0, 2, 2, 1, 1, 1), max_seq=48, max_tokens=48)
    _run_both(cfg, 8, 7, 105, "own")


def test_candidate_mask_bites():
    """More visible rows than cand_blocks·cand_block: the reindex layer's scores are
    masked and its selection differs from an unmasked top-k."""
    cfg = small_cfg(cand_blocks=2, cand_block=2, index_topk=3, max_seq=48, max_tokens=48)
    rt = _run_both(cfg, 30, 3, 9, "own")
    assert rt.shared.candidates is not None
    assert (~rt.shared.candidates).any()


# ---------------------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def mid_sequence():
    """A stack after a 13-token prefill and one decode step, plus the inputs."""
    cfg = small_cfg()
    w = random_weights(cfg, 21)
    xs = random_inputs(cfg, 20, 22)
    return cfg, w, xs


def _fresh(mid):
    cfg, w, xs = mid
    rt = RuntimeStack(cfg, w)
    rt.step([x[:13] for x in xs], 0)
    rt.step([x[13:14] for x in xs], 13)
    return rt


BAD_CALLS = {
    "m_zero": (0, lambda x: x[:0], 14, "m = 0; allowed: 1..64"),
    "m_over_max_tokens": (0, lambda x: torch.zeros(65, x.shape[1], dtype=torch.bfloat16), 0, "allowed: 1..64"),
    "continuation_skips_a_position": (0, lambda x: x[:2], 15, "allowed: 0 (a new sequence) or 14"),
    "past_max_seq": (0, lambda x: x[:1], 64, "allowed: 0..63"),
    "dtype": (0, lambda x: x[:1].float(), 14, "x.dtype = torch.float32; allowed: torch.bfloat16"),
    "shape": (0, lambda x: x[:1, :32], 14, "x.shape = (1, 32); allowed: [m, 64]"),
    "skipped_position": (0, lambda x: x[:1], 16, "allowed: 0 (a new sequence) or 14"),
    "out_of_order_layer": (
        2,
        lambda x: x[:1],
        14,
        "allowed: layer 0 at start_pos 0 (a new sequence) or layer 0 at start_pos 14",
    ),
    "negative_pos": (0, lambda x: x[:1], -1, "start_pos = -1; allowed: >= 0"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS), ids=list(BAD_CALLS))
def test_bad_call_raises_and_changes_nothing(mid_sequence, case):
    layer, make_x, pos, msg = BAD_CALLS[case]
    rt = _fresh(mid_sequence)
    before = _snapshot(rt)
    x = make_x(mid_sequence[2][layer][14:])
    with pytest.raises((ValueError, TypeError)) as e:
        rt.layer(layer, x, pos)
    assert msg in str(e.value), str(e.value)
    _same_snapshot(before, _snapshot(rt))


def test_ratio_layer_before_any_kv_source_raises():
    cfg = small_cfg(
        n_layers=2, compress_ratios=(2, 2), kv_source_layers=(0,), index_source_layers=(0,), candidate_source_layer=None
    )
    w = random_weights(cfg, 1)
    attn = AttnV41(cfg)
    wt = AttnV41LayerWeights.from_state_dict(cfg.roles[1], w[1], cfg=cfg)
    st = attn.new_layer_state(1)
    sh = attn.new_shared()
    sh.last_layer, sh.step_pos, sh.step_end = 0, 0, 3  # pretend layer 0 ran but published nothing
    with pytest.raises(ValueError, match="runs before any kv source of ratio 2"):
        attn.forward(wt, st, sh, random_inputs(cfg, 3, 2)[1], 0)


def test_wrong_weights_are_named():
    cfg = small_cfg()
    w = random_weights(cfg, 1)
    bad = dict(w[0])
    bad["wq_a.weight"] = bad["wq_a.weight"][:, :32]
    with pytest.raises(ValueError, match=r"attn.wq_a.weight.shape = \(16, 32\); allowed: \(16, 64\)"):
        AttnV41LayerWeights.from_state_dict(cfg.roles[0], bad, cfg=cfg)
    with pytest.raises(KeyError, match="unexpected tensor .attn.compressor"):
        AttnV41LayerWeights.from_state_dict(cfg.roles[0], w[1], cfg=cfg)  # role mismatch: extra tensors
    missing = {k: v for k, v in w[1].items() if k != "indexer.wk.weight"}
    with pytest.raises(KeyError, match="attn.indexer.wk.weight") as e:
        AttnV41LayerWeights.from_state_dict(cfg.roles[1], missing, cfg=cfg)
    assert isinstance(e.value, ValueError), "a missing tensor is bad input: a ValueError too"
    assert str(e.value).startswith("layer 1 (") and "tensor 'attn.indexer.wk.weight' is missing" in str(e.value)
    f32 = dict(w[0])
    f32["wkv.weight"] = f32["wkv.weight"].float()
    with pytest.raises(TypeError, match="attn.wkv.weight.dtype = torch.float32"):
        AttnV41LayerWeights.from_state_dict(cfg.roles[0], f32, cfg=cfg)


def test_state_dict_round_trip_and_compressor_upcast():
    cfg = small_cfg()
    w = random_weights(cfg, 1)
    w1 = dict(w[1])
    w1["compressor.wkv.weight"] = w1["compressor.wkv.weight"].bfloat16()  # as the checkpoint stores it
    lw = AttnV41LayerWeights.from_state_dict(cfg.roles[1], w1, cfg=cfg)
    sd = lw.state_dict()
    assert all(k.startswith("attn.") for k in sd)
    assert sd["attn.compressor.wkv.weight"].dtype == torch.float32
    again = AttnV41LayerWeights.from_state_dict(cfg.roles[1], sd, cfg=cfg)
    assert all(torch.equal(again.state_dict()[k], sd[k]) for k in sd)


def test_free_is_idempotent():
    attn = AttnV41(small_cfg())
    assert attn.out.shape == (64, 64) and attn.out.dtype == torch.bfloat16
    attn.free()
    attn.free()
    assert attn.out is None
