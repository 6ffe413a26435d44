"""The runtimes' prompt index scores take the kernels' `tokens` launch option
(`runtime.ops.PROMPT_TOKENS`): prefills, continuations and batched steps with a prompt
chunk of at least `PROMPT_MIN` tokens pass it (not the gathered form, not shorter calls,
not a decode-only batched step), and on CUDA every output has the bytes of one token per
program. The small geometries here lower PROMPT_MIN to reach it."""

import dataclasses
import random

import pytest
import torch

from attnv41.runtime import RuntimeStack
from attnv41.runtime import ops as runtime_ops
from attnv41.runtime.batch import BatchV41
from attnv41.runtime.ops import TORCH_OPS
from helpers import random_inputs, random_weights, small_cfg
from runtime.test_batch import _run, _schedule, _setup


def _spying():
    """TORCH_OPS whose index scores record (m, tokens keyword, gathered) per call."""
    calls = []

    def spy(fn):
        def wrapped(iq, *a, **kw):
            calls.append((iq.shape[0], kw.get("tokens"), kw.get("ids") is not None))
            return fn(iq, *a, **kw)

        return wrapped

    ops = dataclasses.replace(
        TORCH_OPS,
        index_scores=spy(TORCH_OPS.index_scores),
        index_scores_paged=spy(TORCH_OPS.index_scores_paged),
    )
    return ops, calls


def _check(calls):
    assert calls, "no index scores"
    for m, tokens, gathered in calls:
        want = None if gathered or m < runtime_ops.PROMPT_MIN else runtime_ops.PROMPT_TOKENS
        assert tokens == want, (m, tokens, gathered)


@pytest.mark.parametrize("tile_entries", [100, 1 << 26], ids=["tiles", "untiled"])
def test_single_sequence_prompts_pass_the_option(tile_entries, monkeypatch):
    monkeypatch.setattr(runtime_ops, "PROMPT_MIN", 3)
    cfg = small_cfg(max_seq=48, max_tokens=48)
    w, xs = random_weights(cfg, 3), random_inputs(cfg, 48, 4)
    ops, calls = _spying()
    rt = RuntimeStack(cfg, w, ops=ops)
    rt.attn.index_tile_entries = tile_entries
    rt.step([x[:40] for x in xs], 0, keep=True)  # a prompt: m > 1
    rt.step([x[40:45] for x in xs], 40, keep=True)  # a continuation
    assert any(t is not None for _, t, _ in calls)
    rt.step([x[45:47] for x in xs], 45, keep=True)  # two tokens: below PROMPT_MIN
    assert any(m == 2 and t is None for m, t, _ in calls)
    n = len(calls)
    rt.step([x[47:48] for x in xs], 47, keep=True)  # a decode step: one token
    assert all(m == 1 and t is None for m, t, _ in calls[n:]) and len(calls) > n
    _check(calls)


def test_batched_steps_pass_it_with_prompts_only(monkeypatch):
    monkeypatch.setattr(runtime_ops, "PROMPT_MIN", 6)
    cfg, w, wts, xs, _ = _setup((0, 2, 2, 1, 1, 1), 8, 5, 3, 4)
    ops, calls = _spying()
    bt = BatchV41(cfg, n_slots=3, block_rows=4, ops=ops)

    def step(starts, lens):
        xb = [torch.cat([x[i][s : s + m] for x, s, m in zip(xs, starts, lens)]) for i in range(cfg.n_layers)]
        n = len(calls)
        bt.step(wts, xb, [0, 1, 2], starts, lens)
        assert len(calls) > n
        return [t for _, t, g in calls[n:] if not g]

    assert set(step([0, 0, 0], [9, 2, 3])) == {runtime_ops.PROMPT_TOKENS}, "a prompt chunk of 9 ≥ 6"
    assert set(step([9, 2, 3], [3, 4, 5])) == {None}, "verify-sized runs only (< 6)"
    assert set(step([12, 6, 8], [1, 1, 1])) == {None}, "a decode-only step keeps one token"


def test_the_rule(monkeypatch):
    monkeypatch.setattr(runtime_ops, "PROMPT_TOKENS", 1)
    assert runtime_ops.prompt_tokens(640) == {}, "1: the plain launch"
    monkeypatch.setattr(runtime_ops, "PROMPT_TOKENS", 8)
    monkeypatch.setattr(runtime_ops, "PROMPT_MIN", 64)
    assert runtime_ops.prompt_tokens(64) == {"tokens": 8} and runtime_ops.prompt_tokens(63) == {}
    assert runtime_ops.prompt_tokens(2048, 64) == {"tokens": 8} and runtime_ops.prompt_tokens(2048, 8) == {}
    assert runtime_ops.prompt_tokens(10, 2048) == {}, "a tile of 10 tokens of a long chunk"


@pytest.mark.gpu
@pytest.mark.parametrize("kv_format", ["bf16", "packed"])
def test_prompt_tokens_give_the_bytes_of_one_token_on_cuda(kv_format, monkeypatch):
    """On CUDA (the Triton kernels): a prompt, a continuation and decode steps of one
    sequence (tiled and not), and a batched schedule with prompt chunks of several
    sequences (groups of one slot and of several), with PROMPT_TOKENS 4 and 16 against 1
    (PROMPT_MIN 2): every output byte for byte."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    monkeypatch.setattr(runtime_ops, "PROMPT_MIN", 2)
    cfg = small_cfg(max_seq=96, max_tokens=96)
    w, xs = random_weights(cfg, 8), random_inputs(cfg, 90, 9)
    xs = [x.cuda() for x in xs]

    def single(tokens, tiles):
        monkeypatch.setattr(runtime_ops, "PROMPT_TOKENS", tokens)
        rt = RuntimeStack(cfg, w, device="cuda", bucket_min=16, kv_format=kv_format)
        if tiles:
            rt.attn.index_tile_entries = tiles
        out = []
        for s, m in ((0, 41), (41, 7), (48, 1), (49, 1), (50, 30)):
            out += rt.step([x[s : s + m] for x in xs], s, keep=True)
        return out

    for tiles in (None, 100):
        base = single(1, tiles)
        for tokens in (4, 16):
            got = single(tokens, tiles)
            for k, (a, b) in enumerate(zip(got, base)):
                assert torch.equal(a, b), f"single, tiles {tiles}, tokens {tokens}, output {k}"

    bcfg, bw, wts, bxs, _ = _setup((0, 2, 2, 1, 1, 1), 8, 6, 3, 4)
    sched = _schedule(random.Random(6), 3, 10)
    wts = [wt.to("cuda") for wt in wts]
    bxs = [[x.cuda() for x in xl] for xl in bxs]

    def batched(tokens):
        monkeypatch.setattr(runtime_ops, "PROMPT_TOKENS", tokens)
        bt = BatchV41(bcfg, n_slots=3, block_rows=4, device="cuda", kv_format=kv_format)
        return _run(bcfg, bw, wts, bxs, bt, sched, compare=False)

    base = batched(1)
    for tokens in (4, 16):
        got = batched(tokens)
        for k, (a, b) in enumerate(zip(got, base)):
            for i, (x, y) in enumerate(zip(a, b)):
                assert torch.equal(x, y), f"batched step {k} L{i}, tokens {tokens}"
