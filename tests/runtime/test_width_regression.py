"""Regressions of the runtime against the reference, bit for bit, at pinned examples that
hypothesis found (tests/runtime/test_attn.py::test_runtime_equals_reference_bit_for_bit)."""

import pytest

from attnv41.reference.layer import RefStack
from attnv41.runtime import RuntimeStack
from helpers import random_inputs, random_weights, small_cfg

TRACE = ("q", "kv_win", "sel", "o", "out")


def _same(ref, run, where):
    for name in TRACE:
        a, b = getattr(ref, name).cpu(), getattr(run, name).cpu()
        assert a.shape == b.shape, f"{where} {name}: shape {tuple(b.shape)} vs {tuple(a.shape)}"
        n_diff = int((a.to(b.dtype) != b).sum())
        assert n_diff == 0, f"{where} {name}: {n_diff} elements differ"


@pytest.mark.parametrize(
    "n, decode_steps, window, topk, ratios, index_keys, seed",
    [pytest.param(8, 7, 16, 6, (0, 2, 2, 1, 1, 1), "own", 105, id="hypothesis-seed4-prefill-L4-o")],
)
def test_fixed_launch_width_keeps_bits(n, decode_steps, window, topk, ratios, index_keys, seed):
    """The runtime launches sparse attention at the fixed width window + index_topk (22
    here), the reference at the natural width (14 at prefill layer 4): before the reference
    padded its last 64-entry block, prefill L4 `o` was one bf16 ulp off (issue 10 item 18)."""
    cfg = small_cfg(window=window, index_topk=topk, compress_ratios=ratios, max_seq=48, max_tokens=48)
    w = random_weights(cfg, seed)
    xs = random_inputs(cfg, n + decode_steps, seed + 1)
    ref = RefStack(cfg, w, index_keys=index_keys)
    rt = RuntimeStack(cfg, w, index_keys=index_keys)
    for i in range(cfg.n_layers):
        _same(ref.layer(i, xs[i][:n], 0), rt.layer(i, xs[i][:n], 0), f"prefill L{i}")
    for p in range(n, n + decode_steps):
        for i in range(cfg.n_layers):
            _same(ref.layer(i, xs[i][p : p + 1], p), rt.layer(i, xs[i][p : p + 1], p), f"decode{p} L{i}")
