"""The decode plan: device metadata from one position, buckets, static wiring, a plan
and position buffer the caller owns."""

import pytest
import torch

from attnv41.runtime import AttnV41, DecodePlan, RuntimeStack, bucket_of
from attnv41.runtime.plan import DONE, ROW, ROW_POS, SLOT, VIS
from helpers import random_inputs, random_weights, small_cfg


@pytest.mark.parametrize(
    "p, max_seq, bucket_min, want",
    [(0, 8192, 1024, 1024), (1023, 8192, 1024, 1024), (1024, 8192, 1024, 2048), (4096, 8192, 1024, 8192),
     (8191, 8192, 1024, 8192), (5000, 6000, 1024, 6000), (2, 48, 4, 4), (4, 48, 4, 8), (40, 48, 4, 48)],
)  # fmt: skip
def test_bucket_rule(p, max_seq, bucket_min, want):
    assert bucket_of(p, max_seq, bucket_min) == want
    assert want >= p + 1 or want == max_seq


@pytest.mark.parametrize("p", [1, 2, 3, 7, 8, 13, 14, 15, 16, 47])
def test_derive_equals_host_arithmetic(p):
    """Every metadata field the device derives equals the host formula (attention-v41.md
    §4.5, §5) for the ratios of the config."""
    cfg = small_cfg(compress_ratios=(0, 4, 4, 1, 1, 1), max_seq=48, max_tokens=48)
    plan = DecodePlan(cfg, "cpu")
    plan.set_pos(p)
    assert plan.ratios == (1, 4)
    for r in plan.ratios:
        m = plan.meta[r][:, 0].tolist()
        assert m[VIS] == (p + 1) // r and m[ROW] == p // r and m[ROW_POS] == (p // r) * r and m[SLOT] == p % r
        assert m[DONE] == int((p + 1) % r == 0) == int(plan.done[r].item())
    W = cfg.window
    want = [s if s <= p else -1 for s in [(p % W + 1 + j) % W for j in range(W)]]
    assert plan.sel0[0].tolist() == want
    assert all(plan.sel[k, 0, :W].tolist() == want for k in range(plan.sel.shape[0]))


def test_wiring_is_static_from_the_config():
    cfg = small_cfg()  # kv sources 1, 3; index sources 1, 3, 5
    assert [cfg.kv_source_of(i) for i in range(6)] == [None, 1, 1, 3, 3, 3]
    assert [cfg.index_source_of(i) for i in range(6)] == [None, 1, 1, 3, 3, 5]
    plan = DecodePlan(cfg, "cpu")
    assert plan.sel_for(0) is plan.sel0
    assert [plan.sel_slot(i) for i in range(1, 6)] == [0, 0, 1, 1, 2]


def test_caller_owned_plan_and_position():
    """An engine may own the plan and its position buffer: the runtime reads and advances
    that tensor (a whole-step driver step ends with pos + 1 there)."""
    from attnv41.runtime.graphs import DecodeGraphs

    cfg = small_cfg(max_seq=48, max_tokens=48)
    w = random_weights(cfg, 81)
    xs = random_inputs(cfg, 16, 82)
    mine = torch.zeros(1, dtype=torch.int32)
    plan = DecodePlan(cfg, "cpu", pos=mine)
    b = RuntimeStack(cfg, w)
    b.attn.free()
    b.attn = AttnV41(cfg, "cpu", plan=plan)
    b.states = [b.attn.new_layer_state(i) for i in range(cfg.n_layers)]
    b.shared = b.attn.new_shared()
    a = RuntimeStack(cfg, w)
    for s in (a, b):
        s.step([x[:11] for x in xs], 0)
    drv = DecodeGraphs(b)
    for p in range(11, 16):
        want = a.step([x[p : p + 1] for x in xs], p, keep=True)
        got = drv.step([x[p : p + 1] for x in xs], p)
        assert all(torch.equal(want[i], got[i]) for i in range(cfg.n_layers)), p
        assert int(mine.item()) == p + 1  # the caller's buffer is the position the step advanced
    with pytest.raises(ValueError, match=r"pos = torch.int64 \(1,\) on cpu; allowed: None or an int32 \[1\] tensor"):
        DecodePlan(cfg, "cpu", pos=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="plan was built for cpu and another config"):
        AttnV41(small_cfg(window=4), "cpu", plan=plan)
    with pytest.raises(TypeError, match="plan is a dict; allowed: None or a DecodePlan"):
        AttnV41(cfg, "cpu", plan={})
    with pytest.raises(ValueError, match="bucket_min = 0; allowed: an int >= 1"):
        DecodePlan(cfg, "cpu", bucket_min=0)
