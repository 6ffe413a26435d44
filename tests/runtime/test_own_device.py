"""The runtimes run on their own device whatever the current CUDA device is: Triton launches
on the current device (and CUDA graphs capture and replay on its streams), so every method
that launches work runs under `kernels._triton.on_device(runtime device)`
(`runtime.device.on_own_device`). On the CPU: the rule (which methods carry it, what the
context does, with torch.cuda's answers replaced); on a host with two GPUs: a runtime on
cuda:1 driven while cuda:0 is current gives the bytes of the same runtime on cuda:0."""

from __future__ import annotations

import random

import pytest
import torch

from attnv41 import ops as public_ops
from attnv41.kernels import _triton
from attnv41.runtime import AttnV41, BatchGraphs, BatchV41, RuntimeStack
from attnv41.runtime import device as device_mod
from attnv41.runtime.graphs import DecodeGraphs
from attnv41.weights import AttnV41LayerWeights
from helpers import random_inputs, random_weights, small_cfg

# every public method of the runtimes that launches kernels or replays graphs
LAUNCHING = {
    AttnV41: ("forward", "rollback", "decode_prep", "decode_prep_role", "decode_body"),
    BatchV41: ("begin", "forward", "fork", "rollback", "rollback_many", "step"),
    RuntimeStack: ("layer", "step", "rollback"),
    DecodeGraphs: ("step",),
    BatchGraphs: ("step", "capture"),
}


@pytest.mark.parametrize("cls", list(LAUNCHING), ids=lambda c: c.__name__)
def test_every_launching_method_runs_on_its_runtimes_device(cls):
    for name in LAUNCHING[cls]:
        assert getattr(getattr(cls, name), "on_own_device", False), f"{cls.__name__}.{name}"


def test_on_device_switches_only_to_another_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    ctx = _triton.on_device(torch.device("cuda", 1))
    assert isinstance(ctx, torch.cuda.device) and ctx.idx == 1
    for dev in (torch.device("cuda", 0), torch.device("cpu")):
        assert _triton.on_device(dev) is _triton._SAME_DEVICE


def test_the_decorator_enters_the_runtimes_device_and_leaves_it(monkeypatch):
    seen = []

    class Recorder:
        def __init__(self, dev):
            self.dev = dev

        def __enter__(self):
            seen.append(("enter", self.dev))

        def __exit__(self, *exc):
            seen.append(("exit", self.dev, exc[0]))
            return False

    monkeypatch.setattr(device_mod, "on_device", Recorder)

    class Rt:
        device = torch.device("cuda", 1)
        counters: dict = {}

        @device_mod.on_own_device(lambda self: self)
        def run(self, x, *, y=0):
            """doc kept"""
            seen.append(("run", x, y))
            assert _triton._COUNTER_OWNER.get() is self.counters  # its own arrival counters
            if x < 0:
                raise ValueError("bad")
            return x + y

        @device_mod.on_own_device(lambda self: self)
        def outer(self):
            return self.run(1) + self.run(2)

    rt = Rt()
    assert rt.run(2, y=3) == 5 and Rt.run.__doc__ == "doc kept"
    assert seen == [("enter", rt.device), ("run", 2, 3), ("exit", rt.device, None)]
    seen.clear()
    with pytest.raises(ValueError, match="bad"):
        rt.run(-1)
    assert seen[-1] == ("exit", rt.device, ValueError)
    assert _triton._COUNTER_OWNER.get() is None  # restored after a raise too
    seen.clear()
    assert rt.outer() == 3  # a call inside another of its own calls enters nothing again
    assert seen == [("enter", rt.device), ("run", 1, 0), ("run", 2, 0), ("exit", rt.device, None)]


def test_arrival_counters_belong_to_their_owner():
    """`counters_of(owner)`: a module's counters live in the owner's dict under (op,
    device), apart from the module-wide ones and from every other owner's; outside any
    owner the module-wide buffer as before; nested owners restore the outer one."""
    c = _triton.ArrivalCounters("probe", "probe.prepare", 8)
    cpu = torch.device("cpu")
    shared = c.buffer(cpu)
    assert c.buffer("cpu") is shared and list(c._bufs) == [cpu]
    a, b = {}, {}
    with _triton.counters_of(a):
        ba = c.buffer(cpu)
        with _triton.counters_of(b):
            c.prepare(cpu)
            bb = c.buffer(cpu)
        assert c.buffer(cpu) is ba
    assert ba is not shared and bb is not shared and ba is not bb
    assert a == {("probe", cpu): ba} and b == {("probe", cpu): bb} and list(c._bufs) == [cpu]
    assert c.buffer(cpu) is shared and int(ba.abs().sum()) == int(bb.abs().sum()) == 0


@pytest.mark.skipif(not _triton.HAVE_TRITON or not _triton.interpreting(), reason="the interpreter (no GPU)")
def test_each_runtime_launches_with_its_own_counters():
    """Two runtimes on the Triton kernels (the interpreter on the CPU) each take their split
    kernels' counters from their own dict, never from the module-wide buffers: a decode
    call's block-parallel attention combine (`sparse_attn_split`) is one of them. So
    runtimes may run at once on different streams of one GPU (the module-wide counters
    were shared by every launch on a device)."""
    from attnv41.kernels import sparse_attn_split

    cfg = small_cfg(window=8, index_topk=6, max_seq=32, max_tokens=32)
    w = random_weights(cfg, 21)
    xs = random_inputs(cfg, 14, 22)
    module_wide = dict(sparse_attn_split._counters._bufs)
    stacks = [RuntimeStack(cfg, w, ops="triton") for _ in range(2)]
    for rt in stacks:
        rt.step([x[:13] for x in xs], 0)
        for i in range(cfg.n_layers):
            rt.layer(i, xs[i][13:14], 13)
    key = ("sparse_attn_split", torch.device("cpu"))
    a, b = (rt.attn.counters.get(key) for rt in stacks)
    assert a is not None and b is not None and a is not b, [sorted(rt.attn.counters, key=str) for rt in stacks]
    assert sparse_attn_split._counters._bufs == module_wide  # no launch took the module-wide ones
    assert int(a.abs().sum()) == int(b.abs().sum()) == 0  # every last arrival reset its counter


def test_public_ops_run_on_their_inputs_device():
    """Each `attnv41.ops` op enters `on_device` of its first tensor's device (the source
    says so; its behaviour on two GPUs is the GPU test below)."""
    import inspect

    src = inspect.getsource(public_ops)
    for name in ("sparse_attn", "index_scores", "index_topk", "cache_write", "compress_pool", "compress_rows"):
        body = inspect.getsource(getattr(public_ops, name)._init_fn)
        assert "with on_device(" in body, name
    assert "from .kernels._triton import on_device" in src


def _stack_run(cfg, w, dev, xs_prompt, xs_dec, start):
    """A RuntimeStack on dev: the prompt (eager), then decode steps through DecodeGraphs;
    the outputs on the CPU."""
    st = RuntimeStack(cfg, w, device=dev)
    outs = [o.cpu() for o in st.step([x.to(dev) for x in xs_prompt], 0, keep=True)]
    dg = DecodeGraphs(st)
    for j, x in enumerate(xs_dec):
        outs.append(dg.step(x.to(dev), start + j).cpu().clone())
    return outs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_runtime_on_the_second_gpu_while_the_first_is_current():
    cfg = small_cfg(window=8, index_topk=6, compress_ratios=(0, 2, 2, 1, 1, 1), max_seq=96, max_tokens=32)
    w = random_weights(cfg, 7)
    gen = torch.Generator().manual_seed(3)
    prompt = [torch.randn(20, cfg.dim, generator=gen).to(torch.bfloat16) for _ in range(cfg.n_layers)]
    dec = [torch.randn(cfg.n_layers, 1, cfg.dim, generator=gen).to(torch.bfloat16) for _ in range(12)]
    torch.cuda.set_device(0)
    ref = _stack_run(cfg, w, torch.device("cuda", 0), prompt, dec, 20)
    got = _stack_run(cfg, w, torch.device("cuda", 1), prompt, dec, 20)
    assert torch.cuda.current_device() == 0
    assert len(ref) == len(got) and all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(ref, got))

    # the batched runtime and its graphs, the same steps on both devices
    def batch_run(dev):
        wts = [
            AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg, device=dev) for i in range(cfg.n_layers)
        ]
        bt = BatchV41(cfg, dev, n_slots=4, block_rows=8, kv_format="packed")
        bg = BatchGraphs(bt, wts)
        rng, g2 = random.Random(5), torch.Generator().manual_seed(9)
        lens = [rng.randint(1, 10) for _ in range(4)]
        x = torch.randn(cfg.n_layers, sum(lens), cfg.dim, generator=g2).to(torch.bfloat16).to(dev)
        outs = [o.cpu() for o in bt.step(wts, list(x), [0, 1, 2, 3], [0] * 4, lens)]
        for _ in range(10):
            slots = sorted(rng.sample(range(4), rng.randint(1, 4)))
            xd = torch.randn(cfg.n_layers, len(slots), cfg.dim, generator=g2).to(torch.bfloat16).to(dev)
            outs.append(bg.step(xd, slots).cpu().clone())
        return outs

    ref, got = batch_run(torch.device("cuda", 0)), batch_run(torch.device("cuda", 1))
    assert torch.cuda.current_device() == 0
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(ref, got))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_two_runtimes_replay_at_once_on_two_streams():
    """Two batched runtimes on one GPU replay their decode graphs at once on two streams
    (B = 1 steps: the block-parallel attention combine, whose arrival counters were shared
    by every launch on a device before they became each runtime's own): each gives the
    bytes of a third runtime stepped alone on the default stream."""
    dev = torch.device("cuda", torch.cuda.current_device())
    cfg = small_cfg(window=8, index_topk=6, compress_ratios=(0, 2, 2, 1, 1, 1), max_seq=128, max_tokens=32)
    w = random_weights(cfg, 11)
    wts = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg, device=dev) for i in range(cfg.n_layers)]
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randn(cfg.n_layers, 9, cfg.dim, generator=gen).to(torch.bfloat16).to(dev)
    steps = [torch.randn(cfg.n_layers, 1, cfg.dim, generator=gen).to(torch.bfloat16).to(dev) for _ in range(40)]
    runs = []
    for _ in range(3):
        bt = BatchV41(cfg, dev, n_slots=2, block_rows=8)
        bt.step(wts, list(prompt), [0], [0], [9])
        bg = BatchGraphs(bt, wts, sizes=(1,))
        bg.step(steps[0], [0])  # captured here, before the streams below
        runs.append(bg)
    outs = [[], [], []]
    for x in steps[1:]:  # the reference: alone on the default stream
        outs[2].append(runs[2].step(x, [0]).clone())
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    s1.wait_stream(torch.cuda.current_stream())
    s2.wait_stream(torch.cuda.current_stream())
    for x in steps[1:]:
        for k, s in ((0, s1), (1, s2)):
            with torch.cuda.stream(s):
                outs[k].append(runs[k].step(x, [0]).clone())
    torch.cuda.synchronize()
    for k in (0, 1):
        bad = [
            j
            for j, (a, b) in enumerate(zip(outs[k], outs[2]))
            if not torch.equal(a.view(torch.int16), b.view(torch.int16))
        ]
        assert not bad, f"runtime {k}: steps {bad} differ from the runtime stepped alone"
