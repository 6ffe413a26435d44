"""Cases a randomized differential fuzzer (runtime against the reference, bit for bit on
the CPU; 2026-12-04) found, shrunk to their smallest configurations. Each failed before
its fix."""

from __future__ import annotations

import pytest
import torch

from attnv41.reference.layer import RefStack
from attnv41.runtime import BatchGraphs, BatchV41, RuntimeStack
from attnv41.runtime.checks import check_released_keys, released_owners
from attnv41.synthetic import random_inputs, random_weights
from attnv41.weights import AttnV41LayerWeights
from helpers import small_cfg


@pytest.mark.parametrize("kv_format", ["bf16", "packed"])
def test_a_small_pool_keeps_every_row_of_a_step(kv_format):
    """One ratio-2 layer, max_seq = max_tokens = 8, one slot of 1-row blocks: a pool of 5
    rows took a step of 6 tokens (and a graph step padded to 8), and the cache writes
    (which keep a step's last `rows` writes) dropped the first rows: out off by up to 2.7.
    The pool now holds max_tokens rows at least; the batch equals the reference."""
    cfg = small_cfg(
        n_layers=1,
        compress_ratios=(2,),
        kv_source_layers=(0,),
        index_source_layers=(0,),
        candidate_source_layer=None,
        window=8,
        max_seq=8,
        max_tokens=8,
    )
    w = random_weights(cfg, 1)
    x = random_inputs(cfg, 8, 2)[0]
    wt = [AttnV41LayerWeights.from_state_dict(cfg.roles[0], w[0], cfg=cfg)]
    ref, bt = RefStack(cfg, w), BatchV41(cfg, n_slots=1, block_rows=1, kv_format=kv_format)
    for s, m in ((0, 1), (1, 6)):
        want = ref.layer(0, x[s : s + m], s).out
        assert torch.equal(bt.step(wt, [x[s : s + m]], [0], [s], [m])[0], want), (s, m)
    ref, bt = RefStack(cfg, w), BatchV41(cfg, n_slots=1, block_rows=1, kv_format=kv_format)
    y = BatchGraphs(bt, wt, sizes=[8]).step(x[None, :4], [0], [4], [0])[0]
    assert torch.equal(y, ref.layer(0, x[:4], 0).out)


def _two_publishers_cfg():
    """Two index-and-kv sources, ratios 4 then 8: layer 0 may score layer 1's keys."""
    return small_cfg(
        n_layers=2,
        compress_ratios=(4, 8),
        kv_source_layers=(0, 1),
        index_source_layers=(0, 1),
        candidate_source_layer=None,
        window=2,
        index_topk=1,
        max_seq=24,
        max_tokens=8,
    )


def test_released_keys_past_the_publishers_rows_are_refused():
    """index_keys='released': layer 0 (ratio 4) completes no group at 8 and would score L = 2
    keys of layer 1 (ratio 8), which holds 1. The released code reads an unwritten row
    there; the single-sequence runtime read its decode's group in progress instead (out
    off by up to 3.9 at 9). Refused before anything is written, as BatchV41 refuses it."""
    cfg = _two_publishers_cfg()
    w = random_weights(cfg, 1)
    xs = random_inputs(cfg, 24, 2)
    rt = RuntimeStack(cfg, w, index_keys="released")
    rt.step([x[:8] for x in xs], 0)
    before = rt.shared.snapshot()
    msg = r"layer 0 at start_pos 8 would score 2 index keys of layer 1, which holds 1 \(the released code reads"
    with pytest.raises(ValueError, match=msg):
        rt.step([x[8:9] for x in xs], 8)
    after = rt.shared.snapshot()
    assert all(torch.equal(v, after[k]) if isinstance(v, torch.Tensor) else v == after[k] for k, v in before.items())
    bt = BatchV41(cfg, n_slots=1, block_rows=4, index_keys="released")
    bt.step(rt.weights, [x[:8] for x in xs], [0], [0], [8])
    with pytest.raises(
        ValueError, match=r"slot 0: layer 0 at start_pos 8 would score 2 index keys of layer 1, which holds 1"
    ):
        bt.step(rt.weights, [x[8:9] for x in xs], [0], [8], [1])


def test_one_walk_of_the_released_keys_rule():
    """`released_owners` is the one walk of the released-keys rule (the single-sequence
    runtime's whole-step checks and `BatchV41.begin` per sequence both call it; the two
    copies it replaced named the missing publisher differently): owners per index source
    and after the call, the refusal past the publisher's rows, and no publisher at all
    (−1 in the single-sequence runtime's shared state) named as such."""
    cfg = _two_publishers_cfg()
    assert released_owners(cfg, None, 0, 8) == ({0: 0, 1: 1}, 1)  # both complete groups: own keys
    assert released_owners(cfg, 1, 8, 4) == ({0: 0, 1: 0}, 0)  # layer 0 publishes 3 rows, layer 1 reads 1
    assert released_owners(cfg, 0, 12, 1) == ({0: 0, 1: 0}, 0)  # nobody publishes: layer 0's 3 rows
    with pytest.raises(ValueError, match=r"layer 0 at start_pos 8 would score 2 index keys of layer 1, which holds 1"):
        released_owners(cfg, 1, 8, 1)
    for owner in (None, -1):
        with pytest.raises(
            ValueError, match=r"layer 0 at start_pos 4 would score 1 index keys .* no layer has published"
        ):
            (released_owners if owner is None else check_released_keys)(cfg, owner, 4, 1)


def test_window_only_layers_decode():
    """A geometry of ratio-0 layers only (valid): the decode step's plan had no compressed
    rows to describe and raised; it now equals the reference."""
    cfg = small_cfg(
        n_layers=1,
        compress_ratios=(0,),
        kv_source_layers=(),
        index_source_layers=(),
        candidate_source_layer=None,
        max_seq=16,
        max_tokens=16,
    )
    w = random_weights(cfg, 1)
    x = random_inputs(cfg, 4, 2)[0]
    ref, rt = RefStack(cfg, w), RuntimeStack(cfg, w)
    for s, m in ((0, 1), (1, 1), (2, 2)):
        assert torch.equal(rt.layer(0, x[s : s + m], s).out, ref.layer(0, x[s : s + m], s).out), (s, m)


def test_a_graph_step_checks_released_keys_as_forward_does():
    """index_keys='released', ratios (0, 4, 4, 8, 8): at 24, layer 1 completes no group and
    would score 6 keys of layer 4, which holds 3. `forward` refused it at layer 1 (layer 0
    of the step had run); a `DecodeGraphs` step ran it (reading rows the released code
    never wrote). `DecodeGraphs.step` and `RuntimeStack.step` now refuse it before their
    first layer."""
    from attnv41.runtime.graphs import DecodeGraphs

    cfg = small_cfg(
        dim=48,
        n_layers=5,
        n_heads=1,
        head_dim=32,
        rope_dim=16,
        q_rank=24,
        o_rank=16,
        groups=1,
        window=8,
        index_heads=2,
        index_head_dim=32,
        index_topk=6,
        cand_blocks=3,
        cand_block=5,
        compress_ratios=(0, 4, 4, 8, 8),
        kv_source_layers=(1, 2, 3, 4),
        index_source_layers=(1, 2, 3, 4),
        candidate_source_layer=None,
        max_seq=40,
        max_tokens=40,
        original_seq_len=16,
    )
    w = random_weights(cfg, 3)
    xs = random_inputs(cfg, 40, 4)
    rt = RuntimeStack(cfg, w, index_keys="released")
    rt.step([x[:4] for x in xs], 0)
    for s, m in ((4, 3), (7, 1), (8, 16)):
        rt.step([x[s : s + m] for x in xs], s)
    before = rt.shared.snapshot()
    msg = r"layer 1 at start_pos 24 would score 6 index keys of layer 4, which holds 3"
    with pytest.raises(ValueError, match=msg):
        DecodeGraphs(rt).step([x[24:25] for x in xs], 24)
    with pytest.raises(ValueError, match=msg):  # RuntimeStack.step: refused before its first layer
        rt.step([x[24:25] for x in xs], 24)
    after = rt.shared.snapshot()
    assert all(torch.equal(v, after[k]) if isinstance(v, torch.Tensor) else v == after[k] for k, v in before.items())
    with pytest.raises(ValueError, match=r"layer 1: needs 6 published index keys"):  # forward, layer by layer
        for i in range(cfg.n_layers):
            rt.layer(i, xs[i][24:25], 24)
