"""The decode-step driver: the whole step eagerly on the CPU, buckets, the oracle."""

import pytest
import torch

from attnv41.runtime import RuntimeStack
from attnv41.runtime.graphs import DecodeGraphs
from helpers import random_inputs, random_weights, small_cfg


@pytest.mark.parametrize("index_keys", ["own", "released"])
@pytest.mark.parametrize("bucket_min", [1024, 4], ids=["one_bucket", "buckets_16_32_48"])
def test_driver_equals_forward_and_oracle_passes(index_keys, bucket_min):
    """Positions 11..39 with buckets of 16, 32 and 48 (capped at max_seq) crossed twice:
    the driver equals eager forward on every layer, and the oracle (eager forward on
    saved state against the driver's step: outputs, rings, compressor state, cache rows,
    scores, selections, candidate mask, position) passes at every step."""
    cfg = small_cfg(max_seq=48, max_tokens=48)
    w = random_weights(cfg, 41)
    xs = random_inputs(cfg, 40, 42)
    a = RuntimeStack(cfg, w, index_keys=index_keys)
    b = RuntimeStack(cfg, w, index_keys=index_keys, bucket_min=bucket_min)
    for s in (a, b):
        s.step([x[:11] for x in xs], 0)
    drv = DecodeGraphs(b, oracle=True)
    assert not drv.use_graphs  # CPU: the whole step eagerly
    buckets = set()
    for p in range(11, 40):
        want = a.step([x[p : p + 1] for x in xs], p, keep=True)
        got = drv.step([x[p : p + 1] for x in xs], p)
        buckets.add(b.attn.bucket(p))
        for i in range(cfg.n_layers):
            assert torch.equal(want[i], got[i]), f"p{p} L{i}"
            assert torch.equal(a.states[i].ring, b.states[i].ring), f"p{p} L{i} ring"
            if a.states[i].compress_kv is not None:
                L = a.states[i].n_rows
                assert L == b.states[i].n_rows == (p + 1) // cfg.compress_ratios[i]
                assert torch.equal(a.states[i].compress_kv[:L], b.states[i].compress_kv[:L]), f"p{p} L{i} ckv"
                assert torch.equal(a.states[i].index_k[:L], b.states[i].index_k[:L]), f"p{p} L{i} keys"
    assert drv.oracle_checks == 40 - 11
    assert drv.captures == 0
    assert buckets == ({48} if bucket_min == 1024 else {16, 32, 48})


def test_driver_rejects_skipped_positions_and_graphs_on_cpu():
    cfg = small_cfg()
    st = RuntimeStack(cfg, random_weights(cfg, 1))
    xs = random_inputs(cfg, 20, 2)
    st.step([x[:5] for x in xs], 0)
    drv = DecodeGraphs(st)
    with pytest.raises(ValueError, match=r"start_pos = 7; allowed: 0 \(a new sequence\) or 5"):
        drv.step([x[7:8] for x in xs], 7)
    with pytest.raises(ValueError, match="use_graphs = True on cpu"):
        DecodeGraphs(st, use_graphs=True)
