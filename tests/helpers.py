"""Test helpers shared by the suite: golden file lookup, small configs, seeded weights
and inputs. (Kept out of conftest.py so that test files import them by a unique name.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attnv41.config import AttnV41Cfg
from attnv41.synthetic import random_inputs, random_weights  # noqa: F401  (re-exported for tests)

REPO = Path(__file__).resolve().parents[1]


def interp_subset(full: list, cpu: list) -> list:
    """A kernel test's parametrization: every value of `full` on CUDA, only `cpu` (a subset)
    on Triton's CPU interpreter, where each case costs seconds of CI's two cores. Leave out
    only cases the interpreter runs through the same steps as one kept, or middle values of
    a range whose ends are kept (say which where it is used)."""
    missing = [v for v in cpu if v not in full]
    assert not missing, f"interp_subset: {missing} not among {full}"
    return full if torch.cuda.is_available() else cpu


def golden_dir() -> Path:
    """`$ATTNV41_GOLDEN_DIR`, else `../shared/golden` beside the repository."""
    env = os.environ.get("ATTNV41_GOLDEN_DIR")
    return Path(env) if env else REPO.parent / "shared" / "golden"


def golden_path(name: str) -> Path:
    p = golden_dir() / f"v41_{name}.safetensors"
    if not p.is_file():
        # The golden data is the external oracle: its absence is a broken setup, not a skip.
        pytest.fail(f"golden file {p} not found (set ATTNV41_GOLDEN_DIR to the folder holding it)")
    return p


def small_cfg(**kw) -> AttnV41Cfg:
    """A small geometry with the golden files' 6-layer schedule (all five roles)."""
    base = dict(
        dim=64,
        n_layers=6,
        n_heads=4,
        head_dim=32,
        rope_dim=8,
        q_rank=16,
        o_rank=16,
        groups=2,
        window=8,
        index_heads=2,
        index_head_dim=32,
        index_topk=6,
        cand_blocks=4,
        cand_block=2,
        rope_theta=10000.0,
        compress_rope_theta=40000.0,
        rope_factor=2.0,
        original_seq_len=32,
        beta_fast=32.0,
        beta_slow=1.0,
        norm_eps=1e-20,
        max_position_embeddings=1 << 20,
        compress_ratios=(0, 2, 2, 1, 1, 1),
        kv_source_layers=(1, 3),
        index_source_layers=(1, 3, 5),
        candidate_source_layer=3,
        max_tokens=64,
        max_seq=64,
    )
    base.update(kw)
    return AttnV41Cfg(**base)


TRACE = ("q", "kv_win", "sel", "o", "out", "compress_kv", "index_k", "index_score", "candidates")


def assert_same_run(ref, run, where):
    """A reference trace and a runtime run hold the same bytes in every field of `TRACE`."""
    for n in TRACE:
        a, b = getattr(ref, n), getattr(run, n)
        if a is None:
            assert b is None or n in ("index_score",), f"{where} {n}: runtime produced it, reference not"
            continue
        assert b is not None, f"{where} {n}: missing from the runtime"
        a, b = a.cpu(), b.cpu()
        assert a.shape == b.shape, f"{where} {n}: shape {tuple(b.shape)} vs {tuple(a.shape)}"
        assert torch.equal(a.to(b.dtype), b), f"{where} {n}: differs, max {(a.double() - b.double()).abs().max()}"
    assert ref.index_k_owner == run.index_k_owner, where


def stack_snapshot(rt):
    """Every state tensor (cloned) and host field of a `RuntimeStack`."""
    snap = [
        {k: v.clone() for k, v in s.tensors().items()} | {"n_rows": s.n_rows, "next_pos": s.next_pos} for s in rt.states
    ]
    return snap, rt.shared.snapshot()


def same_snapshot(a, b):
    (sa, ha), (sb, hb) = a, b
    for x, y in zip(sa, sb):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k], k
    assert ha.keys() == hb.keys()
    for k in ha:
        if isinstance(ha[k], torch.Tensor):
            assert torch.equal(ha[k], hb[k]), k
        else:
            assert ha[k] == hb[k], k


def split_sizes(sizes, n: int) -> list[int]:
    """Chunk sizes covering n tokens: `sizes` in order, each cut to what is left, and the
    remainder as a last chunk."""
    out, left = [], n
    for c in sizes:
        if left == 0:
            break
        out.append(min(c, left))
        left -= out[-1]
    return out + ([left] if left else [])


def paged_table(gen, rows, block_rows: int, width: int, spare: int = 2):
    """A block table for sequences of `rows` key rows each, their blocks scattered over a
    pool of the blocks they need plus `spare` (int32 `[len(rows), ⌈width/B⌉]`, −1 where
    unallocated); returns (table, pool blocks)."""
    B = block_rows
    n_blocks = sum(-(-r // B) for r in rows) + spare
    perm = iter(torch.randperm(n_blocks, generator=gen).tolist())
    table = torch.full((len(rows), -(-width // B)), -1, dtype=torch.int32)
    for s, r in enumerate(rows):
        for b in range(-(-r // B)):
            table[s, b] = next(perm)
    return table, n_blocks


def pool_snapshot(bt, real: bool = False) -> dict:
    """A `BatchV41`'s pool: host bookkeeping and copies of every tensor; `real`: only the
    caller's slots' parts (not the pad slot's ring rows, state and spare block)."""
    p = bt.pool
    S, W, B = p.n_slots, bt.cfg.window, p.block_rows

    def cut(kind, t, r=None):
        if not real:
            return t.clone()
        if kind == "ring":
            return t[: S * W].clone()
        if kind == "state":
            return t[:S].clone()
        return t[: p.n_blocks[r] * B].clone()  # pools: the spare block is the last

    ratio = {i: bt.cfg.roles[i].ratio for i in p.compress_kv}
    tensors = [cut("state", t) for t in p.tables.values()] + [cut("ring", t) for t in p.ring]
    tensors += [cut("pool", t, ratio[i]) for d in (p.compress_kv, p.index_k) for i, t in d.items()]
    tensors += [cut("state", t) for d in (p.comp_a, p.comp_g) for t in d.values()]
    return {
        "length": list(p.length),
        "free": {r: list(v) for r, v in p.free_blocks.items()},
        "owned": {r: [list(b) for b in v] for r, v in p.blocks_of.items()},
        "refs": {r: list(v) for r, v in p.refs.items()},
        "tensors": tensors,
    }


def same_pool(a: dict, b: dict) -> None:
    for k in ("length", "free", "owned", "refs"):
        assert a[k] == b[k], k
    assert len(a["tensors"]) == len(b["tensors"])
    for j, (x, y) in enumerate(zip(a["tensors"], b["tensors"])):
        assert torch.equal(x.cpu(), y.cpu()), f"pool tensor {j}"


def save_gpu_report(name: str, data: dict) -> None:
    """Add `name: data` to `$ATTNV41_REPORT_DIR/gpu_report.json` (nothing when unset),
    merging with what is there under a file lock: pytest-xdist workers write it at once."""
    import fcntl  # noqa: PLC0415
    import json  # noqa: PLC0415

    d = os.environ.get("ATTNV41_REPORT_DIR")
    if not d:
        return
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "gpu_report.json")
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rep = {}
        if os.path.exists(path):
            with open(path) as f:
                rep = json.load(f)
        rep[name] = data
        with open(path + ".tmp", "w") as f:
            json.dump(rep, f, indent=1, default=str)
        os.replace(path + ".tmp", path)


def stage_run(cfg, weights, inputs, index_keys="own"):
    """The runtime on CUDA through `inputs` [(start_pos, [x per layer])], every layer call
    stage-checked (our o and out against the reference on our own inputs)."""
    from attnv41.runtime import RuntimeStack  # noqa: PLC0415
    from attnv41.stages import StageChecker  # noqa: PLC0415

    rt = RuntimeStack(cfg, weights, device="cuda", index_keys=index_keys)
    chk = StageChecker(cfg, "cuda")
    for start, xs in inputs:
        for i in range(cfg.n_layers):
            chk.check(i, rt.weights[i], rt.layer(i, xs[i], start), start)
    return chk.tally


class NoStream:
    """Stands for a CUDA stream on the CPU (the runtime's second stream taken in a CPU test
    of its forks): joins are no-ops."""

    def wait_stream(self, other) -> None:
        pass
