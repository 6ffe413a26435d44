"""GPU tests of tensor parallelism over heads (`attnv41.tp`; marked `gpu`, skipped without
CUDA; the quick tier): the golden files through two ranks of the runtime, and one rank of
eight at the V4.1-Flash geometry. A file of its own so that pytest-xdist's per-file
distribution runs it beside test_gpu.py's long Flash run.

Adds to `$ATTNV41_REPORT_DIR/gpu_report.json` when set (`helpers.save_gpu_report`)."""

import pytest
import torch

from attnv41 import AttnV41LayerWeights
from attnv41.config import v41_flash
from attnv41.golden import GoldenFile, replay
from attnv41.runtime import RuntimeStack
from attnv41.runtime.graphs import DecodeGraphs
from attnv41.tp import shard_weights, tp_config, tp_impl
from helpers import golden_path, random_inputs, random_weights, save_gpu_report, stage_run

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kv_format", ["bf16", "packed"])
@pytest.mark.parametrize("name", ["headdim", "fp8"])
def test_golden_two_ranks_on_cuda(name, kv_format):
    """Tensor parallelism (`attnv41.tp`): the golden files through 2 ranks of the runtime
    on CUDA (each its heads and output groups; the Triton kernels at 4 heads), their
    partial outputs reduced: every rule of `attnv41 check`, both variants."""
    g = GoldenFile(golden_path(name))
    for v in g.variants:
        rep = replay(g, v, tp_impl(2, kv_format=kv_format), device="cuda", impl_name=f"tp2-{kv_format}")
        save_gpu_report(
            f"golden_tp2_{name}_{v}_{kv_format}", {"ok": rep.ok, "compared": rep.n_compared, "worst": rep.worst()}
        )
        assert rep.n_compared > 0 and rep.n_skipped == 0
        assert rep.ok and not rep.problems(), "\n".join(rep.failures())


def test_flash_tp8_share():
    """Tensor parallelism at the Flash geometry's largest split: rank 5 of 8 (8 heads, one
    output group: the kernels at their smallest head count), a 160-token prefill and 4
    decode steps stage-checked; on a second stack after the same prefill, 8 decode steps
    through whole-step graphs compared byte for byte with eager forward by the oracle."""
    n, steps = 160, 4
    cfg = v41_flash(max_tokens=n, max_seq=n + steps + 16)
    local = tp_config(cfg, 8)
    full = random_weights(cfg, 4131, device="cuda")
    share = [
        shard_weights(AttnV41LayerWeights.from_state_dict(cfg.roles[i], w, cfg=cfg), cfg, 5, 8)
        for i, w in enumerate(full)
    ]
    del full
    xs = random_inputs(cfg, n + steps + 8, 4132, device="cuda")
    inputs = [(0, [x[:n] for x in xs])] + [(p, [x[p : p + 1] for x in xs]) for p in range(n, n + steps)]
    tally = stage_run(local, share, inputs)
    save_gpu_report("stages_flash_tp8_share", tally.summary())
    assert tally.ok, "\n".join(tally.failures[:20])
    assert sum(tally.excused.values()) == 0
    stack = RuntimeStack(local, share, device="cuda")
    stack.step([x[:n] for x in xs], 0)
    drv = DecodeGraphs(stack, oracle=True)
    for p in range(n, n + 8):
        drv.step(torch.stack([x[p : p + 1] for x in xs]), p)
    drv.oracle_flush()
    assert drv.oracle_checks == 8 and drv.recaptures == 0 and stack.attn.nonfinite_count() == 0
