"""The decode-step driver: segments, the split path on the CPU, the oracle."""

import pytest
import torch

from attnv41.runtime import RuntimeStack
from attnv41.runtime.graphs import DecodeGraphs, segments_of
from helpers import random_inputs, random_weights, small_cfg


def test_segments_of_flash_schedule():
    from attnv41.config import v41_flash

    cfg = v41_flash()
    cap = [not (r.is_kv_source or r.is_index_source) for r in cfg.roles]
    segs = segments_of(cap)
    assert segs[0] == [0, 1] and segs[1] == [2] and segs[2] == list(range(3, 8)) and segs[3] == [8]
    assert [s for s in segs if len(s) == 1 and not cap[s[0]]] == [[i] for i in (2, 8, 14, 20, 24, 28, 32, 36)]
    assert sum(len(s) for s in segs) == 40


@pytest.mark.parametrize("index_keys", ["own", "released"])
def test_driver_equals_forward_and_oracle_passes(index_keys):
    cfg = small_cfg(max_seq=48, max_tokens=48)
    w = random_weights(cfg, 41)
    xs = random_inputs(cfg, 40, 42)
    a = RuntimeStack(cfg, w, index_keys=index_keys)
    b = RuntimeStack(cfg, w, index_keys=index_keys)
    for s in (a, b):
        s.step([x[:11] for x in xs], 0)
    drv = DecodeGraphs(b, oracle=True)
    assert not drv.use_graphs  # CPU: the split path eagerly
    for p in range(11, 40):
        want = a.step([x[p : p + 1] for x in xs], p, keep=True)
        got = drv.step([x[p : p + 1] for x in xs], p)
        for i in range(cfg.n_layers):
            assert torch.equal(want[i], got[i]), f"p{p} L{i}"
    assert drv.oracle_checks == (40 - 11) * 3  # three capturable segments per step: [0], [2], [4]
    assert drv.captures == 0


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
