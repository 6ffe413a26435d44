"""Differential fuzzer: attnv41.runtime against attnv41.reference on the CPU, bit for bit.

Each trial is generated from its seed into a JSON-able spec (a small random config, bf16 or
FP8 weights, input streams with zeroed/duplicated/constant rows, and a call sequence), then
run through the reference and the runtime side by side; every output (and, where the
runtime exposes them, the trace tensors and final cache rows) must match bit for bit.

Modes (``--mode``; ``mix``, the default, cycles through them by seed):

* ``single``: one sequence, ``RuntimeStack.layer`` / ``DecodeGraphs`` eager step /
  ``decode_prep`` + ``decode_body``, prompt chunks, decode, verify + rollback, restarts;
  with released index keys, now and then a rollback to the end (a no-op, allowed) or into
  the last call (refused), neither changing the runtime's state (``P_KEYS_RB``).
* ``multi``: 2-3 sequences on one ``AttnV41``, interleaved by step or by layer.
* ``batch``: ``BatchV41.step`` / ``begin`` + ``forward`` (bucket, trace) / ``BatchGraphs``
  eager body, with ``rollback`` / ``rollback_many``; and, drawn from a random stream of their
  own (``P_*``), the slots' lifecycle: ``begin`` + ``cancel`` (of the step itself, then run, or
  of other calls; or left for the next ``begin`` to drop), ``cancel`` after a layer ran
  (refused; the step then finishes) or after the step (nothing to do), ``pool.release`` with
  the slot idle for steps and then reused, and rollbacks of released or cancelled-over
  sequences (refused); with released index keys, ``rollback`` / ``rollback_many`` of slots
  to their ends (no-ops) or into their last calls (refused; ``P_KEYS_RB``), changing nothing;
  ``fork`` (``P_FORK*``, a stream of their own) of a slot into 1-2 others, busy or free (the
  reference of each dst a copy of src's), between steps, between a verify step and its
  rollbacks, while a step of other slots is begun or runs, each dst's rollback into src's
  last call (refused) or to its end (a no-op), and refused forks (src among the dsts, a slot
  twice, an empty src, a slot out of range, a slot of a begun or running step), changing
  nothing. The run keeps the documented lifecycle beside the runtime (each slot's length,
  sequence and undo log) and checks every length, the blocks' accounting (each block's count
  of the slots holding it, ``pool.refs``; the free list; the tables), every slot's cache rows
  after each step and fork, and each expected refusal's message (``RB_REFUSAL``,
  ``FORK_REFUSAL``, ``_expect_refusal``) as it goes.

Refusals are not compared: a call both sides refuse ends the trial as REFUSED, and so does
a runtime refusal where the reference runs only for the released-keys rule ("would score
... index keys of layer ..., which holds ...") and the paged pool's ``blocks`` rule (and, in
``multi``, a schedule every sequence of which the runtime refuses to interleave). Any other
one-sided refusal is a MISMATCH; any other exception is EXC. Specs of MISMATCH and EXC
trials are written to the output directory with a log line each; a summary of the counts
per (mode, kv format, weights, index keys, result), the ok trials' stats summed per mode
(``actions``) and the refusals' reasons (``refused_why``) is printed and written there too.

Usage (from the repository root, with the package importable, e.g. its virtualenv):

    python scripts/fuzz_reference.py --seed 0 --time 120            # 2 minutes, all modes
    python scripts/fuzz_reference.py --seed 5000 --trials 300 --mode batch --out /some/dir
    python scripts/fuzz_reference.py --replay fuzz_out/mismatch_batch_5012.json

The output directory defaults to ./fuzz_out. CPU only; one thread (``--threads``).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import random
import re
import sys
import time
import traceback
from pathlib import Path

import torch

from attnv41.reference.layer import RefStack
from attnv41.runtime import AttnV41, BatchGraphs, BatchV41, RuntimeStack
from attnv41.runtime.graphs import DecodeGraphs
from attnv41.synthetic import random_inputs, random_weights
from attnv41.weights import AttnV41LayerWeights

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import small_cfg  # noqa: E402

TRACE = ("q", "kv_win", "sel", "o", "out", "compress_kv", "index_k", "index_score", "candidates")

# Runtime refusals that may meet a reference that runs: every fragment of one rule must occur.
RUNTIME_RULES = (
    ("would score", "index keys of layer", "which holds"),  # released keys past the last publisher's rows
    ("would score", "no layer has published any"),  # released keys and no publisher (`released_owners`)
    ("blocks[", "max_tokens"),  # a paged pool smaller than a step
)
# The reference's own refusals (RuntimeError) all say what was not published.
REF_REFUSAL = "published"
# With released index keys: per single-mode op / batch step, a rollback to the end (a no-op,
# allowed in every mode) or into the last call (refused), from a random stream of its own.
P_KEYS_RB = 0.1


class Mismatch(AssertionError):
    """The runtime and the reference disagree."""


class Refused(Exception):
    """The trial stopped at a refusal that is not compared."""


def runtime_rule(e: Exception) -> bool:
    return isinstance(e, ValueError) and any(all(p in str(e) for p in rule) for rule in RUNTIME_RULES)


def ref_refused(e: Exception) -> bool:
    return isinstance(e, RuntimeError) and REF_REFUSAL in str(e)


def both(where: str, ref_fn, rt_fn):
    """Run ref_fn, then rt_fn; return both results. A refusal by both raises Refused; a
    one-sided refusal raises Mismatch, except a runtime refusal under RUNTIME_RULES."""
    try:
        a = ref_fn()
    except RuntimeError as e:
        if not ref_refused(e):
            raise
        try:
            rt_fn()
        except (ValueError, RuntimeError) as e2:
            raise Refused(f"{where}: refused by both: reference {e}; runtime {e2}") from None
        raise Mismatch(f"{where}: the reference refused ({e}), the runtime ran") from None
    try:
        b = rt_fn()
    except (ValueError, RuntimeError) as e:
        if runtime_rule(e):
            raise Refused(f"{where}: runtime rule: {e}") from None
        raise Mismatch(f"{where}: the runtime refused where the reference ran: {type(e).__name__}: {e}") from e
    return a, b


# ----------------------------------------------------------------------------- config
def rand_schedule(rng: random.Random, n_layers: int, ratio_pool: list[int]):
    ratios, kv, ix = [], [], []
    for i in range(n_layers):
        r = (
            0
            if (rng.random() < 0.25 and (i < n_layers - 1 or ratios and max(ratios) > 0 or rng.random() < 0.1))
            else rng.choice(ratio_pool)
        )
        ratios.append(r)
        if r == 0:
            continue
        must_kv = not kv or ratios[kv[-1]] != r
        if must_kv or rng.random() < 0.3:
            kv.append(i)
            ix.append(i)
            continue
        must_ix = not ix or ratios[ix[-1]] != r
        if must_ix or rng.random() < 0.4:
            ix.append(i)
    cands = [c for c in kv if all(ratios[i] == ratios[c] for i in ix if i > c and i not in kv)]
    cand = rng.choice(cands) if cands and rng.random() < 0.8 else None
    return ratios, kv, ix, cand


def rand_cfg_kw(rng: random.Random, fp8: bool) -> dict:
    n_heads = rng.choice([1, 2, 4])
    head_dim = rng.choice([32, 32, 64])
    index_head_dim = rng.choice([32, 32, 64])
    groups = rng.choice([g for g in (1, 2, 4) if n_heads % g == 0])
    if fp8:
        dim = rng.choice([32, 64, 96])
        q_rank = rng.choice([32, 64])
        o_rank = rng.choice([o for o in (8, 16, 32) if (groups * o) % 32 == 0] or [32])
    else:
        dim = rng.choice([32, 48, 64])
        q_rank = rng.choice([16, 24, 32])
        o_rank = rng.choice([8, 16])
    rope_dim = rng.choice([d for d in (2, 4, 8, 16) if d <= min(head_dim, index_head_dim)])
    window = rng.choice([2, 3, 4, 4, 5, 8, 8, 16, 16, 32]) if rng.random() < 0.9 else rng.choice([48, 64, 70])
    n_layers = rng.choice([1, 2, 3, 4, 5, 6, 6, 7])
    pool = rng.choice([[1, 2], [2, 4], [4], [1, 4], [2], [1], [3, 1], [2, 4, 8], [4, 1]])
    ratios, kv, ix, cand = rand_schedule(rng, n_layers, pool)
    max_seq = rng.choice([40, 48, 64, 72, 96, 128])
    max_tokens = rng.choice([16, 24, 32, 64, max_seq])
    max_tokens = min(max_tokens, max_seq)
    return dict(
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        head_dim=head_dim,
        rope_dim=rope_dim,
        q_rank=q_rank,
        o_rank=o_rank,
        groups=groups,
        window=window,
        index_heads=rng.choice([1, 2, 4]),
        index_head_dim=index_head_dim,
        index_topk=rng.choice([1, 2, 3, 4, 6, 8, 12]) if rng.random() < 0.85 else rng.choice([16, 33, 64]),
        cand_blocks=rng.choice([1, 2, 3, 4, 6]),
        cand_block=rng.choice([1, 2, 3, 4, 5]),
        compress_ratios=ratios,
        kv_source_layers=kv,
        index_source_layers=ix,
        candidate_source_layer=cand,
        max_seq=max_seq,
        max_tokens=max_tokens,
        original_seq_len=rng.choice([16, 32]),
    )


def make_cfg(kw):
    kw = dict(kw)
    for k in ("compress_ratios", "kv_source_layers", "index_source_layers"):
        kw[k] = tuple(kw[k])
    return small_cfg(**kw)


# ----------------------------------------------------------------------------- inputs
def rand_stream_spec(rng: random.Random, n: int) -> dict:
    spec = {"seed": rng.randrange(1 << 30), "style": rng.choice(["normal", "normal", "sign", "coarse"])}
    if rng.random() < 0.5:
        spec["zero"] = sorted(rng.sample(range(n), rng.randint(1, max(1, n // 4))))
    if rng.random() < 0.5:
        spec["dup"] = [[rng.randrange(n), rng.randrange(n)] for _ in range(rng.randint(1, 8))]
    if rng.random() < 0.15:
        spec["const_from"] = rng.randrange(n)  # every row from here equals this one
    return spec


def make_stream(cfg, n: int, spec: dict) -> list[torch.Tensor]:
    xs = random_inputs(cfg, n, spec["seed"])
    out = []
    for x in xs:
        x = x.clone()
        if spec["style"] == "sign":
            x = torch.where(x >= 0, 1.0, -1.0).to(torch.bfloat16)
        elif spec["style"] == "coarse":
            x = (x.float() * 2).round().div(2).to(torch.bfloat16)
        for j in spec.get("zero", []):
            x[j] = 0
        for a, b in spec.get("dup", []):
            x[b] = x[a]
        if "const_from" in spec:
            x[spec["const_from"] :] = x[spec["const_from"]]
        out.append(x)
    return out


# ----------------------------------------------------------------------------- compare
def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _cmp_tensor(where, name, a, b):
    """a: the reference's, b: the runtime's; equal bits (after a cast to b's dtype) or Mismatch."""
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.shape != b.shape:
        raise Mismatch(f"{where} {name}: shape runtime {tuple(b.shape)} vs reference {tuple(a.shape)}")
    a2 = a.to(b.dtype)
    if a.is_floating_point() and b.is_floating_point():
        if torch.equal(_bits(a2), _bits(b)):
            return
        bad = (_bits(a2) != _bits(b)).nonzero()
        d = torch.nan_to_num((a.double() - b.double()).abs(), nan=float("inf"))
        first = tuple(bad[0].tolist())
        raise Mismatch(
            f"{where} {name}: differs; {bad.shape[0]} elements, max abs {d.max().item():.6g}, first at "
            f"{list(first)}: ref {a[first].item()} rt {b[first].item()}"
        )
    if torch.equal(a2, b):
        return
    bad = (a2 != b).nonzero()
    first = bad[0].tolist()
    raise Mismatch(
        f"{where} {name}: differs at {bad.shape[0]} entries, first {first}: "
        f"ref row {a[first[0]].tolist()} rt row {b[first[0]].tolist()}"
    )


def cmp_trace(where, ref, run, names=TRACE):
    """ref: a RefTrace or a dict of cloned tensors; run: an AttnV41Run or a dict. The runtime
    may omit index_score and candidates."""

    def get(o, n):
        return o.get(n) if isinstance(o, dict) else getattr(o, n, None)

    for n in names:
        a, b = get(ref, n), get(run, n)
        if a is None:
            if b is not None and n != "index_score":
                raise Mismatch(f"{where} {n}: runtime produced it, reference not")
            continue
        if b is None:
            if n in ("index_score", "candidates"):
                continue
            raise Mismatch(f"{where} {n}: missing from the runtime")
        _cmp_tensor(where, n, a, b)
    a, b = get(ref, "index_k_owner"), get(run, "index_k_owner")
    if a is not None and b is not None and int(a) != int(b):
        raise Mismatch(f"{where} index_k_owner: ref {a} rt {b}")


def clone_trace(t) -> dict:
    d = {n: getattr(t, n).detach().clone() for n in TRACE if getattr(t, n, None) is not None}
    d["index_k_owner"] = getattr(t, "index_k_owner", None)
    return d


def _ref_snapshot(ref):
    return copy.deepcopy((ref.states, ref.shared))


def _ref_restore(ref, snap):
    ref.states, ref.shared = copy.deepcopy(snap)


def _rt_snapshot(*objs) -> dict:
    """Every attribute of the runtime's objs: tensors by their bytes, lists, tuples and dicts
    entry by entry, anything else by its repr (for calls that must change nothing)."""
    out = {}

    def walk(path, v):
        if isinstance(v, torch.Tensor):
            out[path] = (
                v.dtype,
                tuple(v.shape),
                v.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes(),
            )
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(f"{path}[{k!r}]", x)
        elif isinstance(v, (list, tuple)):
            for k, x in enumerate(v):
                walk(f"{path}[{k}]", x)
        else:
            out[path] = repr(v)

    for j, o in enumerate(objs):
        for k, v in vars(o).items():
            walk(f"{type(o).__name__}#{j}.{k}", v)
    return out


def _unchanged(where: str, snap: dict, *objs) -> None:
    now = _rt_snapshot(*objs)
    diff = sorted(k for k in snap.keys() | now.keys() if snap.get(k) != now.get(k))
    if diff:
        raise Mismatch(f"{where}: changed the runtime's {diff[:5]}{' ...' if len(diff) > 5 else ''}")


# ----------------------------------------------------------------------------- call sequences
def gen_ops(rng: random.Random, cfg, index_keys: str, decode_drivers: bool = True, rb_rng=None) -> list[dict]:
    """One sequence's calls: prompt chunks, decodes (drv: fwd, graphs or split), verifies
    of k draft tokens accepting j (j2: a first rollback to j2), restarts; with rb_rng, before
    a call now and then a rollback to pos: the end (a no-op) or inside the last call."""
    W, S, M = cfg.window, cfg.max_seq, cfg.max_tokens
    rs = [r for r in cfg.compress_ratios if r > 0] or [1]
    interesting = {1, 2, W - 1, W, W + 1, 2 * W, rng.randint(1, M)}
    for r in rs:
        interesting |= {r, r - 1, r + 1, 2 * r, 3 * r - 1}
    interesting = sorted(v for v in interesting if 1 <= v <= M)
    ops, n = [], 0
    for _ in range(rng.randint(3, 24)):
        if rb_rng is not None and n > 0 and rb_rng.random() < P_KEYS_RB:
            last = next(o for o in reversed(ops) if o["op"] != "rollback")  # a call or a restart
            ops.append({"op": "rollback", "pos": n - (0 if rb_rng.random() < 0.5 else rb_rng.randint(1, last["m"]))})
        left = S - n
        if n == 0:
            m = min(rng.choice(interesting), left)
            ops.append({"op": "call", "m": m})
            n += m
            continue
        if left <= 0:
            break
        u = rng.random()
        if u < 0.07:
            m = min(rng.choice(interesting), S)
            ops.append({"op": "restart", "m": m})
            n = m
        elif u < 0.55:
            op = {"op": "call", "m": 1}
            if decode_drivers:
                op["drv"] = rng.choice(["fwd", "graphs", "split"])
            ops.append(op)
            n += 1
        elif u < 0.75 or index_keys != "own" or W < 2:
            m = min(rng.choice(interesting + [rng.randint(2, M)]), left, M)
            ops.append({"op": "call", "m": m})
            n += m
        else:
            k = min(rng.randint(2, W), left, M)
            if k < 2:
                continue
            j = rng.randint(0, k)
            op = {"op": "verify", "k": k, "j": j}
            if rng.random() < 0.3:
                op["j2"] = rng.randint(j, k)
            ops.append(op)
            n += j
    return ops


# ----------------------------------------------------------------------------- single-sequence trials
def gen_single(seed: int) -> dict:
    rng = random.Random(seed)
    fp8 = rng.random() < 0.35
    kw = rand_cfg_kw(rng, fp8)
    cfg = make_cfg(kw)
    index_keys = rng.choice(["own", "own", "released"])
    spec = dict(
        mode="single",
        cfg=kw,
        weights="fp8" if fp8 else "bf16",
        wseed=rng.randrange(1 << 30),
        kv_format=rng.choice(["bf16", "packed"]),
        index_keys=index_keys,
        bucket_min=rng.choice([1, 2, 4, 8, 16, 1024]),
        index_tile_entries=rng.choice([None, None, None, 1, 7, 64]),
        x=rand_stream_spec(rng, cfg.max_seq),
        drafts=rand_stream_spec(rng, cfg.max_seq),
    )
    rb_rng = random.Random(f"single-rollbacks-{seed}") if index_keys == "released" else None
    spec["ops"] = gen_ops(rng, cfg, index_keys, rb_rng=rb_rng)
    return spec


def run_single(spec: dict) -> dict:
    cfg = make_cfg(spec["cfg"])
    w = random_weights(cfg, spec["wseed"], weights=spec["weights"])
    S, nl = cfg.max_seq, cfg.n_layers
    xs = make_stream(cfg, S, spec["x"])
    ds = make_stream(cfg, S, spec["drafts"])
    ref = RefStack(cfg, w, index_keys=spec["index_keys"])
    rt = RuntimeStack(
        cfg,
        w,
        index_keys=spec["index_keys"],
        bucket_min=spec["bucket_min"],
        kv_format=spec["kv_format"],
        ops=_ops(spec),
    )
    if spec.get("index_tile_entries"):
        rt.attn.index_tile_entries = spec["index_tile_entries"]
    g = DecodeGraphs(rt)
    n = 0
    stats = {"calls": 0, "verify": 0, "keys_rb_noop": 0, "keys_rb_refused": 0}

    def layers(where, rows, s):
        for i in range(nl):
            a, b = both(
                f"{where} L{i}", functools.partial(ref.layer, i, rows[i], s), functools.partial(rt.layer, i, rows[i], s)
            )
            cmp_trace(f"{where} L{i}", a, b)

    def ref_all(rows, s):
        return [clone_trace(ref.layer(i, rows[i], s)) for i in range(nl)]

    def split(i, x, s):
        wi = rt.weights[i]
        return rt.attn.decode_body(wi, rt.states[i], x, rt.attn.decode_prep(wi, rt.shared, s))

    for oi, op in enumerate(spec["ops"]):
        kind = op["op"]
        if kind in ("call", "restart"):
            s = 0 if kind == "restart" else n
            m = op["m"]
            drv = op.get("drv", "fwd") if (m == 1 and s > 0) else "fwd"
            rows = [x[s : s + m] for x in xs]
            where = f"op{oi} {kind} [{s},{s + m}) drv={drv}"
            if drv == "fwd":
                layers(where, rows, s)
            elif drv == "graphs":
                refs, y = both(where, functools.partial(ref_all, rows, s), functools.partial(g.step, rows, s))
                for i in range(nl):
                    _cmp_tensor(f"{where} L{i}", "out", refs[i]["out"], y[i])
            else:  # decode_prep + decode_body
                for i in range(nl):
                    a, out = both(
                        f"{where} L{i}",
                        functools.partial(ref.layer, i, rows[i], s),
                        functools.partial(split, i, rows[i], s),
                    )
                    _cmp_tensor(f"{where} L{i}", "out", a.out, out)
            n = s + m
            stats["calls"] += 1
        elif kind == "verify":
            s, k, j = n, op["k"], op["j"]
            rows = [torch.cat([x[s : s + j], d[s + j : s + k]]) for x, d in zip(xs, ds)]
            snap = _ref_snapshot(ref)
            layers(f"op{oi} verify [{s},{s + k}) accept {j}", rows, s)
            if "j2" in op:
                rt.rollback(s + op["j2"])
            rt.rollback(s + j)
            _ref_restore(ref, snap)
            for i in range(nl if j > 0 else 0):
                ref.layer(i, xs[i][s : s + j], s)
            n = s + j
            stats["verify"] += 1
        elif kind == "rollback":  # released keys: to the end a no-op, anywhere else refused
            pos, where = op["pos"], f"op{oi} rollback to {op['pos']} (end {n})"
            snap = _rt_snapshot(*rt.states, rt.shared, rt.attn)
            if pos == n:
                _allowed(where, rt.rollback, pos)
                stats["keys_rb_noop"] += 1
            else:
                fn = functools.partial(rt.rollback, pos)
                _expect_refusal(where, f"rollback({pos})", fn, RB_REFUSAL["keys"], f"pos = {n} (no change)")
                stats["keys_rb_refused"] += 1
            _unchanged(where, snap, *rt.states, rt.shared, rt.attn)
    return stats


# ----------------------------------------------------------------------------- many sequences on one AttnV41
def gen_multi(seed: int) -> dict:
    rng = random.Random(seed)
    spec = gen_single(rng.randrange(1 << 30))
    del spec["ops"], spec["x"], spec["drafts"]
    cfg = make_cfg(spec["cfg"])
    S = cfg.max_seq
    seqs = []
    for _ in range(rng.randint(2, 3)):
        seqs.append({"x": rand_stream_spec(rng, S), "drafts": rand_stream_spec(rng, S), "ops": []})
    for sq in seqs:
        sq["ops"] = gen_ops(rng, cfg, spec["index_keys"], decode_drivers=False)
    spec.update(
        mode="multi", seqs=seqs, sched_seed=rng.randrange(1 << 30), interleave=rng.choice(["step", "layer", "layer"])
    )
    return spec


def run_multi(spec: dict) -> dict:
    cfg = make_cfg(spec["cfg"])
    w = random_weights(cfg, spec["wseed"], weights=spec["weights"])
    S = cfg.max_seq
    attn = AttnV41(
        cfg, index_keys=spec["index_keys"], kv_format=spec["kv_format"], bucket_min=spec["bucket_min"], ops=_ops(spec)
    )
    if spec.get("index_tile_entries"):
        attn.index_tile_entries = spec["index_tile_entries"]
    wts = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg) for i in range(cfg.n_layers)]
    seqs = []
    for sq in spec["seqs"]:
        seqs.append(
            dict(
                states=[attn.new_layer_state(i) for i in range(cfg.n_layers)],
                shared=attn.new_shared(),
                ref=RefStack(cfg, w, index_keys=spec["index_keys"]),
                xs=make_stream(cfg, S, sq["x"]),
                ds=make_stream(cfg, S, sq["drafts"]),
                ops=sq["ops"],
                opi=0,
                n=0,
                pend=None,
            )
        )
    rng = random.Random(spec["sched_seed"])
    stats = {"calls": 0, "verify": 0, "refused_interleave": 0}
    blocked = set()
    while True:
        active = [k for k, q in enumerate(seqs) if q["pend"] is not None or q["opi"] < len(q["ops"])]
        if not active:
            break
        if set(active) <= blocked:
            raise Refused("every sequence's next layer would overwrite another's selection in progress")
        k = rng.choice([k for k in active if k not in blocked])
        q = seqs[k]
        if q["pend"] is None:
            op = q["ops"][q["opi"]]
            q["opi"] += 1
            if op["op"] == "verify":
                s, kk, j = q["n"], op["k"], op["j"]
                rows = [torch.cat([x[s : s + j], d[s + j : s + kk]]) for x, d in zip(q["xs"], q["ds"])]
                snap = _ref_snapshot(q["ref"])
            else:
                s = 0 if op["op"] == "restart" else q["n"]
                rows = [x[s : s + op["m"]] for x in q["xs"]]
                snap = None
            q["pend"] = dict(op=op, s=s, rows=rows, layer=0, snap=snap, oi=q["opi"] - 1)
        p = q["pend"]
        n_run = cfg.n_layers - p["layer"] if spec["interleave"] == "step" else 1
        for _ in range(n_run):
            i, s = p["layer"], p["s"]
            where = f"seq{k} op{p['oi']} {p['op']} s={s} L{i}"
            # The runtime first: an interleave it refuses leaves both sides untouched.
            try:
                b = attn.forward(wts[i], q["states"][i], q["shared"], p["rows"][i], s)
            except (ValueError, RuntimeError) as e:
                if isinstance(e, ValueError) and "would overwrite" in str(e):
                    blocked.add(k)
                    stats["refused_interleave"] += 1
                    break
                a, b = both(where, functools.partial(q["ref"].layer, i, p["rows"][i], s), functools.partial(_raise, e))
            else:
                a, _ = both(where, functools.partial(q["ref"].layer, i, p["rows"][i], s), functools.partial(_same, b))
            blocked.clear()
            cmp_trace(where, a, b)
            p["layer"] += 1
        if p["layer"] == cfg.n_layers:
            op = p["op"]
            if op["op"] == "verify":
                s, j = p["s"], op["j"]
                if "j2" in op:
                    attn.rollback(q["states"], q["shared"], s + op["j2"])
                attn.rollback(q["states"], q["shared"], s + j)
                _ref_restore(q["ref"], p["snap"])
                for i in range(cfg.n_layers if j > 0 else 0):
                    q["ref"].layer(i, q["xs"][i][s : s + j], s)
                q["n"] = s + j
                stats["verify"] += 1
            else:
                q["n"] = p["s"] + op["m"]
            stats["calls"] += 1
            q["pend"] = None
    return stats


def _raise(e: Exception):
    raise e


def _same(v):
    return v


# ----------------------------------------------------------------------------- batch trials
# Lifecycle actions between and inside the batch mode's steps, drawn from a random stream of
# their own (a seed's steps stay those the generator drew before wherever none fires), with
# these probabilities per step:
P_RELEASE = 0.06  # pool.release a slot (left idle 1..3 steps when another slot can run), then reuse it
P_STALE_RB = 0.3  # per released, not yet reused slot: a rollback into its old sequence (refused)
P_CANCEL_OTHER = 0.05  # begin a random step, then cancel it (its new sequences stay empty)
P_CANCEL_SAME = 0.06  # begin the step itself first, then cancel (or leave it for the step's begin to drop)
P_MID_CANCEL = 0.12  # a begin/forward step: cancel after layer k (refused unless the step is complete)
P_POST_CANCEL = 0.05  # a step/graphs step: cancel after it (nothing to do; its undo logs stay)
P_RB_PRE = 0.2  # a step with verifies: release a verified slot, or begin + cancel, before the rollbacks
# Forks (`BatchV41.fork`), drawn from a stream of their own too:
P_FORK = 0.08  # between steps: fork a slot holding a sequence into 1-2 other slots (busy or free)
P_FORK_BAD = 0.04  # between steps: a refused fork (src among the dsts, a slot twice, an empty src, out of range)
P_FORK_RB = 0.4  # after a fork: a dst's rollback into src's last call (refused) or to its end (a no-op)
P_FORK_PRE = 0.15  # a step with verifies: fork a slot (mostly a verified one) before the rollbacks
P_FORK_BEGUN = 0.5  # a step begun and left (or stopped after a layer): a fork of other slots, or of its own (refused)
# What BatchV41.rollback says when it refuses (`run_batch`'s `expect_rb` predicts which).
RB_REFUSAL = {
    "keys": "with index_keys = 'released'; allowed: 'own', or pos = ",
    "released": "the slot was released, assumed or forked into after its last step",
    "no_log": "its last step kept no undo log",
    "span": "inside its last continuation",
}
# What BatchV41.fork says when it refuses (`run_batch`'s `expect_fork` predicts which).
FORK_REFUSAL = {
    "range": "slot = {sl}; allowed: 0..{top}",
    "twice": "appear twice; allowed: each slot at most once",
    "self": "hold src = {sl}; allowed: slots other than src",
    "step": "fork(slot {sl}) while a step of slots",
    "empty": "fork of slot {sl}, which holds no sequence; allowed: a slot holding one",
}


def gen_batch(seed: int) -> dict:
    rng = random.Random(seed)
    ra = random.Random(f"batch-actions-{seed}")  # the lifecycle actions' own stream
    rk = random.Random(f"batch-keys-rb-{seed}")  # and the released keys' rollbacks' (P_KEYS_RB)
    rf = random.Random(f"batch-forks-{seed}")  # and the forks' (P_FORK*)
    fp8 = rng.random() < 0.3
    kw = rand_cfg_kw(rng, fp8)
    cfg = make_cfg(kw)
    W, S, M, nl = cfg.window, cfg.max_seq, cfg.max_tokens, cfg.n_layers
    n_slots = rng.randint(1, 4)
    index_keys = rng.choice(["own", "own", "released"])
    use_graphs = rng.random() < 0.5
    spec = dict(
        mode="batch",
        cfg=kw,
        weights="fp8" if fp8 else "bf16",
        wseed=rng.randrange(1 << 30),
        kv_format=rng.choice(["bf16", "packed"]),
        index_keys=index_keys,
        n_slots=n_slots,
        block_rows=rng.choice([1, 2, 3, 4, 8, 64]),
        graphs=use_graphs,
        sizes=sorted({rng.randint(1, M), M}) if rng.random() < 0.5 else [M],
        bucket_min=rng.choice([1, 4, 8, 1024]),
        streams=[[rand_stream_spec(rng, S), rand_stream_spec(rng, S)] for _ in range(n_slots)],
        steps=[],
    )
    rs = [r for r in cfg.compress_ratios if r > 0] or [1]
    interesting = {1, 2, W - 1, W, W + 1, rng.randint(1, M)}
    for r in rs:
        interesting |= {r, r - 1, r + 1, 2 * r}
    interesting = sorted(v for v in interesting if 1 <= v <= M)
    length = [0] * n_slots
    idle = [0] * n_slots  # steps a released slot sits out before it is reused
    last: list[tuple[int, int] | None] = [None] * n_slots  # the slot's last begun call (start, tokens)
    stale: dict[int, int] = {}  # released slots not reused yet: a rollback position of the old sequence

    def release(sl, acts, may_idle):
        s_m = last[sl]
        stale[sl] = ra.randint(s_m[0], sum(s_m)) if s_m and s_m[0] > 0 else ra.randint(1, max(1, length[sl]))
        acts.append({"act": "release", "slot": sl})
        length[sl] = 0
        idle[sl] = ra.randint(1, 3) if may_idle else 0

    def rand_cancel(cur, must=()):
        """A begin of random calls from the lengths `cur`, cancelled: its new sequences stay empty."""
        usable = [sl for sl in range(n_slots) if idle[sl] == 0]
        slots = list(dict.fromkeys([*must, *ra.sample(usable, ra.randint(1, len(usable)))]))
        act = {"act": "cancel", "slots": [], "starts": [], "lens": [], "how": ra.choice(["cancel", "cancel", "twice"])}
        for sl in slots:
            if sum(act["lens"]) >= M:
                break
            s = 0 if cur[sl] == 0 or cur[sl] >= S or ra.random() < 0.3 else cur[sl]
            m = min(ra.choice([1, 1, ra.randint(2, max(2, W)), ra.randint(1, M)]), M - sum(act["lens"]), S - s)
            act["slots"].append(sl), act["starts"].append(s), act["lens"].append(m)
        if ra.random() < 0.3:
            act["probe"] = ra.choice(act["slots"])
        return act

    def cancelled(act):
        for sl, s, m in zip(act["slots"], act["starts"], act["lens"]):
            last[sl] = (s, m)
            stale.pop(sl, None)
            if s == 0:
                length[sl] = 0

    def fork(src, acts, cur, among=None, rb=True):
        """A fork of src (holding cur[src] tokens) into 1-2 other slots of `among` (default
        all), busy or free; with rb, now and then a dst's rollback into src's last call."""
        others = [sl for sl in (range(n_slots) if among is None else among) if sl != src]
        dsts = rf.sample(others, rf.randint(1, min(2, len(others))))
        act = {"act": "fork", "src": src, "dsts": dsts}
        if len(dsts) == 1 and rf.random() < 0.3:
            act["int"] = True  # fork(src, dst)
        s_m = last[src]
        if rb and rf.random() < P_FORK_RB:  # refused but for pos = its length (the run predicts which)
            lo, hi = (s_m[0], sum(s_m)) if s_m and s_m[0] > 0 else (max(0, cur[src] - 3), cur[src])
            act["rb"] = [rf.choice(dsts), rf.randint(lo, hi)]
        acts.append(act)
        for d in dsts:
            length[d] = cur[src]
            last[d] = last[src]
            stale.pop(d, None)  # a rollback there now is the fork's probe

    def bad_fork(acts):
        """A fork refused before anything changes (the run predicts the message)."""
        kind = rf.choice(["self", "twice", "empty", "range"])
        src = rf.randrange(n_slots)
        others = [sl for sl in range(n_slots) if sl != src]
        empty = [sl for sl in range(n_slots) if length[sl] == 0]
        if kind == "empty" and empty:
            src = rf.choice(empty)
            dsts = [rf.choice([sl for sl in range(n_slots) if sl != src] or [src])]
        elif kind == "twice":
            d = rf.choice(others or [src])
            dsts = [d, d] if rf.random() < 0.7 else [d, *others[:1], d]
        elif kind == "range":
            bad = rf.choice([n_slots, n_slots + 2, -1])
            if rf.random() < 0.4:
                src, dsts = bad, others[:1] or [0]
            else:
                dsts = [*others[:1], bad]
        else:  # src among the dsts
            dsts = [*rf.sample(others, min(1, len(others))), src]
            rf.shuffle(dsts)
        acts.append({"act": "fork", "src": src, "dsts": dsts, "bad": True})

    def begun_fork(step_slots, acts, inside=None):
        """While a step of step_slots is begun: a fork of the other slots (allowed: a fork
        refuses only the step's own slots) or, with inside (default: at random), one that
        names a slot of the step (refused)."""
        out = [sl for sl in range(n_slots) if sl not in step_slots]
        held = [sl for sl in out if length[sl] > 0]
        if inside is None:
            inside = not (len(out) > 1 and held) or rf.random() < 0.5
        if not inside:
            if len(out) > 1 and held:
                fork(rf.choice(held), acts, length, among=out, rb=False)
            return
        sl = rf.choice(step_slots)
        other = rf.choice([q for q in range(n_slots) if q != sl])
        src, dst = (sl, other) if rf.random() < 0.5 else (other, sl)
        acts.append({"act": "fork", "src": src, "dsts": [dst], "bad": True})

    pre: list[dict] = []  # actions before the next step (carried over a step that drew no slot)
    for _ in range(rng.randint(3, 14)):
        if ra.random() < P_RELEASE:
            usable = [sl for sl in range(n_slots) if idle[sl] == 0]
            if usable:
                release(ra.choice(usable), pre, len(usable) > 1)
        for sl in sorted(stale):
            if ra.random() < P_STALE_RB:
                pre.append({"act": "stale_rb", "slot": sl, "pos": stale[sl]})
        live = [sl for sl in range(n_slots) if length[sl] > 0]
        if index_keys == "released" and live and rk.random() < P_KEYS_RB:  # back 0: to the end
            slots = rk.sample(live, rk.randint(1, len(live)))
            back = [0 if rk.random() < 0.5 else rk.randint(1, last[sl][1] if last[sl] else 1) for sl in slots]
            pre.append({"act": "keys_rb", "slots": slots, "back": back, "many": rk.random() < 0.5})
        if ra.random() < P_CANCEL_OTHER:
            pre.append(rand_cancel(length))
            cancelled(pre[-1])
            if ra.random() < 0.4:  # then release one of its slots (allowed once cancelled)
                usable = [sl for sl in range(n_slots) if idle[sl] == 0]
                release(ra.choice(pre[-1]["slots"]), pre, len(usable) > 1)
        held = [sl for sl in range(n_slots) if length[sl] > 0]
        if n_slots > 1 and held and rf.random() < P_FORK:
            fork(rf.choice(held), pre, length)
        if rf.random() < P_FORK_BAD:
            bad_fork(pre)
        slots = [sl for sl in rng.sample(range(n_slots), rng.randint(1, n_slots)) if idle[sl] == 0]
        items, T, starts = [], 0, []
        for sl in slots:
            left_tok = M - T
            if left_tok < 1:
                break
            s = length[sl]
            u = rng.random()
            if s == 0 or s >= S or u < 0.08:
                m = min(rng.choice(interesting), left_tok, S)
                items.append({"slot": sl, "kind": "new", "m": m})
                length[sl] = m
                s = 0
            elif u < 0.6:
                items.append({"slot": sl, "kind": "cont", "m": 1})
                length[sl] = s + 1
            elif u < 0.8 or index_keys != "own":
                m = min(rng.choice(interesting + [rng.randint(2, M)]), left_tok, S - s)
                items.append({"slot": sl, "kind": "cont", "m": m})
                length[sl] = s + m
            else:
                k = min(rng.randint(2, W), left_tok, S - s)
                if k < 2:
                    items.append({"slot": sl, "kind": "cont", "m": 1})
                    length[sl] = s + 1
                else:
                    j = rng.randint(0, k)
                    items.append({"slot": sl, "kind": "verify", "m": k, "j": j})
                    length[sl] = s + j
            starts.append(s)
            T += items[-1]["m"]
        if not items:
            continue
        drv = rng.choice(["step", "begin", "graphs"]) if use_graphs else rng.choice(["step", "begin"])
        st = {"items": items, "drv": drv}
        if drv == "begin":
            if rng.random() < 0.5:
                st["bucket_extra"] = rng.randint(0, 40)
            if rng.random() < 0.6:
                st["trace"] = rng.choice(items)["slot"]
        st["rb_many"] = rng.random() < 0.5
        step_slots = [it["slot"] for it in items]
        if ra.random() < P_CANCEL_SAME:  # the step itself, begun and dropped first
            how = ra.choice(["cancel", "cancel", "drop"])
            act = {
                "act": "cancel",
                "slots": step_slots,
                "starts": starts,
                "lens": [it["m"] for it in items],
                "how": how,
            }
            if ra.random() < 0.3:
                act["probe"] = ra.choice(step_slots)
            pre.append(act)
            if how == "drop" and n_slots > 1 and rf.random() < P_FORK_BEGUN:  # the step begun and left
                begun_fork(step_slots, pre)
        if drv == "begin" and ra.random() < P_MID_CANCEL:
            st["mid"] = {"after": ra.randrange(nl)}
            if ra.random() < 0.5:
                st["mid"]["probe"] = ra.choice(step_slots)
            if n_slots > 1 and rf.random() < P_FORK_BEGUN:  # after layer `after`: other slots' fork
                forks: list[dict] = []
                begun_fork(step_slots, forks, inside=False)
                if forks:
                    st["mid"]["fork"] = forks[0]
        elif drv != "begin" and ra.random() < P_POST_CANCEL:
            st["mid"] = {"after": nl - 1}
        for sl, s, it in zip(step_slots, starts, items):
            last[sl] = (s, it["m"])
            stale.pop(sl, None)
        verified = {it["slot"]: s + it["m"] for s, it in zip(starts, items) if it["kind"] == "verify"}
        pending = set(verified)  # verified slots whose rollbacks run (they hold all k tokens until then)
        if verified and ra.random() < P_RB_PRE:  # before the rollbacks: the runtime holds all k tokens
            cur = [verified.get(sl, length[sl]) for sl in range(n_slots)]
            if ra.random() < 0.4:
                sl = ra.choice(sorted(verified))
                length[sl] = cur[sl]
                pending.discard(sl)
                usable = [q for q in range(n_slots) if idle[q] == 0]
                release(sl, st.setdefault("rb_pre", []), len(usable) > 1)
            else:
                act = rand_cancel(cur, must=[ra.choice(sorted(verified))] if ra.random() < 0.7 else [])
                st["rb_pre"] = [act]
                for sl in act["slots"]:
                    if sl in verified:  # its rollback is refused (its undo log went with the begin)
                        length[sl] = cur[sl]
                        pending.discard(sl)
                cancelled(act)
        if verified and n_slots > 1 and rf.random() < P_FORK_PRE:  # src keeps its undo log, a dst has none
            cur = [verified[sl] if sl in pending else length[sl] for sl in range(n_slots)]
            held = [sl for sl in range(n_slots) if cur[sl] > 0]
            src = rf.choice(sorted(pending)) if pending and rf.random() < 0.8 else rf.choice(held or [0])
            if cur[src] > 0:
                fork(src, st.setdefault("rb_pre", []), cur)  # src's length stays (its rollback runs)
                pending -= set(st["rb_pre"][-1]["dsts"])
        if pre:
            st["pre"], pre = pre, []
        for sl in range(n_slots):
            if idle[sl] > 0 and sl not in step_slots:
                idle[sl] -= 1
        spec["steps"].append(st)
    return spec


def _batch_ref_step(refs, slots, starts, item_rows) -> dict:
    return {
        sl: [clone_trace(refs[sl].layer(i, rows[i], s)) for i in range(len(rows))]
        for sl, s, rows in zip(slots, starts, item_rows)
    }


def _expect_refusal(where: str, what: str, fn, *fragments: str) -> str:
    """fn() must raise a ValueError whose message holds every fragment (else Mismatch)."""
    try:
        fn()
    except ValueError as e:
        if all(f in str(e) for f in fragments):
            return str(e)
        raise Mismatch(f"{where}: {what} refused, but not as expected ({fragments}): {e}") from None
    raise Mismatch(f"{where}: {what} ran; expected a refusal ({fragments})")


def _allowed(where: str, fn, *args) -> None:
    """A call the documented rules allow: a refusal is a Mismatch."""
    try:
        fn(*args)
    except ValueError as e:
        raise Mismatch(f"{where}: {fn.__name__}{args} refused where it is allowed: {e}") from None


def _mid_cancel(bt, mid: dict, i: int, stats: dict, where: str, fork=None) -> None:
    """After layer i of a step: cancel() is a no-op once the step is complete, refused before
    that (and so are release, rollback and fork of a slot of the step; the step then goes
    on). fork(act, where): `run_batch`'s fork, for the fork of other slots the generator drew
    (`mid["fork"]`) and the probe's (refused)."""
    nl = bt.cfg.n_layers
    if fork is not None and "fork" in mid:
        fork(mid["fork"], f"{where} fork")
    if i == nl - 1:
        bt.cancel()  # a complete step: nothing to do (a refusal here is a one-sided refusal)
        stats["cancel_noop"] += 1
        return
    _expect_refusal(where, f"cancel after layer {i}", bt.cancel, f"cancel after layer {i} of the step ran", "allowed")
    stats["cancel_refused"] += 1
    sl = mid.get("probe")
    if sl is not None:
        _expect_refusal(where, f"release({sl}) mid-step", functools.partial(bt.pool.release, sl), "while a step")
        pos = bt.pool.length[sl]
        _expect_refusal(where, f"rollback({sl}) mid-step", functools.partial(bt.rollback, sl, pos), "during a step")
        _expect_refusal(where, "begin mid-step", functools.partial(bt.begin, [sl], [0], [1]), "begin during a step")
        stats["probe_refused"] += 3
        if fork is not None:  # a slot of the step as src or (with one slot: refused as src) as dst
            other = (sl + 1) % bt.pool.n_slots
            fork({"act": "fork", "src": sl, "dsts": [other], "bad": True}, f"{where} fork probe")


def _batch_rt_step(bt, g, wts, step, bx, slots, starts, lens, stats, where, fork=None):
    """One step through the runtime: (outputs per layer, traces per layer or None). fork:
    for `_mid_cancel`."""
    nl = len(bx)
    mid = step.get("mid")
    if step["drv"] == "step":
        outs = bt.step(wts, bx, slots, starts, lens)
        if mid:
            _mid_cancel(bt, mid, nl - 1, stats, where, fork)
        return outs, None
    if step["drv"] == "graphs":
        y = g.step(torch.stack(bx), slots, lens, starts)
        if mid:
            _mid_cancel(bt, mid, nl - 1, stats, where, fork)
        return [y[i].clone() for i in range(nl)], None
    bucket = None
    if "bucket_extra" in step:
        top = max(s + m for s, m in zip(starts, lens))
        bucket = min(bt.cfg.max_seq, top + step["bucket_extra"])
    tr = step.get("trace")
    bt.trace_slot = tr
    try:
        st = bt.begin(slots, starts, lens, bucket=bucket)
        outs, traces = [], []
        for i in range(nl):
            outs.append(bt.forward(wts[i], bx[i], st).clone())
            if tr is not None:
                traces.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in bt.trace.items()})
            if mid and mid["after"] == i:
                _mid_cancel(bt, mid, i, stats, f"{where} L{i}", fork)
    finally:
        bt.trace_slot = None
    return outs, traces


def run_batch(spec: dict) -> dict:
    cfg = make_cfg(spec["cfg"])
    w = random_weights(cfg, spec["wseed"], weights=spec["weights"])
    S, nl, W = cfg.max_seq, cfg.n_layers, cfg.window
    wts = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg) for i in range(nl)]
    streams = [(make_stream(cfg, S, a), make_stream(cfg, S, b)) for a, b in spec["streams"]]
    n_slots = spec["n_slots"]
    bt = BatchV41(
        cfg,
        n_slots=n_slots,
        block_rows=spec["block_rows"],
        kv_format=spec["kv_format"],
        index_keys=spec["index_keys"],
        ops=_ops(spec),
    )
    pool = bt.pool
    g = BatchGraphs(bt, wts, sizes=spec["sizes"], bucket_min=spec["bucket_min"]) if spec["graphs"] else None
    refs: dict[int, RefStack] = {}
    stats = dict.fromkeys(
        (
            "steps",
            "verify",
            "cancel",
            "cancel_drop",
            "cancel_begin_refused",
            "cancel_refused",
            "cancel_noop",
            "probe_refused",
            "release",
            "reuse",
            "stale_rb_refused",
            "rb_refused",
            "keys_rb_noop",
            "keys_rb_refused",
            "fork",
            "fork_dsts",
            "fork_busy",
            "fork_begun",
            "fork_refused",
            "fork_refused_step",
            "fork_rb_refused",
            "fork_rb_noop",
            "fork_skipped",
            "cache_checks",
        ),
        0,
    )
    # The documented lifecycle, kept beside the runtime: each slot's length, its sequence (new
    # at every release and every begin from 0) and its undo log (a begun continuation of
    # 2..window tokens: the sequence, span and whether the step completed; None: no log).
    exp_len = [0] * n_slots
    seq = [0] * n_slots
    undo: list[dict | None] = [None] * n_slots
    released: set[int] = set()  # released since their last call (a new sequence there counts as a reuse)
    stepping: set[int] = set()  # the slots of a step begun and not finished (a fork naming one is refused)
    n_seq = [0]

    def new_seq(sl):
        n_seq[0] += 1
        seq[sl] = n_seq[0]

    def begun(slots, starts, lens):
        for sl, s, m in zip(slots, starts, lens):
            if s == 0:  # a begin from 0 releases the slot first
                new_seq(sl)
                exp_len[sl] = 0
            undo[sl] = {"seq": seq[sl], "span": (s, s + m), "done": False} if s > 0 and 2 <= m <= W else None

    def expect_rb(sl, pos):
        """None (rollback(sl, pos) runs) or the RB_REFUSAL key of its refusal."""
        if pos == exp_len[sl]:  # the no-op, in every mode
            return None
        if spec["index_keys"] != "own":
            return "keys"
        u = undo[sl]
        if u is not None and u["seq"] != seq[sl]:
            return "released"
        if u is None or not u["done"]:
            return "no_log"
        return None if u["span"][0] <= pos <= exp_len[sl] else "span"

    def check_blocks(where):
        """Per ratio: each block's count (`pool.refs`) is the number of slots holding it, the
        free list holds exactly the blocks nobody holds, once each, and every slot's table is
        its block list (then −1); the pad slot's points at the spare block."""
        for r in pool.ratios:
            held = [0] * pool.n_blocks[r]
            for sl in range(n_slots):
                mine = pool.blocks_of[r][sl]
                for b in mine:
                    held[b] += 1
                row = pool.tables[r][sl].tolist()
                if row[: len(mine)] != mine or any(v != -1 for v in row[len(mine) :]):
                    raise Mismatch(f"{where}: ratio {r} slot {sl}: table {row}, blocks {mine}")
            if pool.refs[r] != held:
                raise Mismatch(f"{where}: ratio {r}: block counts {pool.refs[r]}, slots holding them {held}")
            free = pool.free_blocks[r]
            if sorted(free) != [b for b, n in enumerate(held) if n == 0]:
                raise Mismatch(f"{where}: ratio {r}: free blocks {free}, held {held} (counts)")
            if (pool.tables[r][pool.pad_slot] != pool.n_blocks[r]).any():
                raise Mismatch(f"{where}: ratio {r}: the pad slot's table {pool.tables[r][pool.pad_slot].tolist()}")

    def check_state(where):
        if list(pool.length) != exp_len:
            raise Mismatch(f"{where}: slot lengths {pool.length}, expected {exp_len}")
        check_blocks(where)

    def check_caches(where, slots):
        """The slots' complete cache rows (compressed KV, index keys) against their references."""
        for sl in slots:
            ref, n = refs.get(sl), exp_len[sl]
            if ref is None:
                continue
            for i in cfg.kv_source_layers:
                L = n // cfg.roles[i].ratio
                wh = f"{where} slot{sl} L{i}"
                _cmp_tensor(wh, "cache compress_kv", ref.states[i].compress_kv[:L], pool.cache_rows(i, sl, L))
                _cmp_tensor(wh, "cache index_k", ref.states[i].index_k[:L], pool.cache_rows(i, sl, L, keys=True))
        stats["cache_checks"] += 1

    def expect_fork(src, dsts):
        """None (fork(src, dsts) runs) or the message of its refusal, in the runtime's order of checks."""
        for sl in (src, *dsts):
            if not 0 <= sl < n_slots:
                return FORK_REFUSAL["range"].format(sl=sl, top=n_slots - 1)
        if len(set(dsts)) != len(dsts):
            return FORK_REFUSAL["twice"]
        if src in dsts:
            return FORK_REFUSAL["self"].format(sl=src)
        for sl in (src, *dsts):
            if sl in stepping:
                return FORK_REFUSAL["step"].format(sl=sl)
        if exp_len[src] == 0:
            return FORK_REFUSAL["empty"].format(sl=src)
        return None

    def fork(act, where):
        """A fork act: refused as `expect_fork` says (changing nothing), or run: each dst's
        reference a copy of src's, its own sequence (with no undo log: a rollback other than
        to its end is refused), the blocks shared (no free block taken), the caches checked;
        then act["rb"]: a dst's rollback (refused, or to its end: a no-op)."""
        src, dsts = act["src"], act["dsts"]
        arg = dsts[0] if act.get("int") else list(dsts)
        want = expect_fork(src, dsts)
        if want is not None:
            snap = _rt_snapshot(bt, pool)
            _expect_refusal(where, f"fork({src}, {arg})", functools.partial(bt.fork, src, arg), want, "allowed")
            _unchanged(where, snap, bt, pool)
            stats["fork_refused"] += 1
            stats["fork_refused_step"] += "while a step" in want
            return
        if act.get("bad"):  # the generator's lengths went apart from the run's (a begin refused by a rule)
            stats["fork_skipped"] += 1
            return
        if src not in refs:
            raise RuntimeError(f"fuzzer: {where}: slot {src} holds {exp_len[src]} tokens and no reference")
        free0 = {r: set(pool.free_blocks[r]) for r in pool.ratios}
        _allowed(where, bt.fork, src, arg)
        for d in dsts:
            stats["fork_busy"] += exp_len[d] > 0
            refs[d] = RefStack(cfg, w, index_keys=spec["index_keys"])
            _ref_restore(refs[d], _ref_snapshot(refs[src]))
            exp_len[d] = exp_len[src]
            new_seq(d)
            undo[d] = {"seq": 0}  # its old sequence's log (if any) is dead; src's stays src's
            released.discard(d)
        for r in pool.ratios:
            if not free0[r] <= set(pool.free_blocks[r]):
                raise Mismatch(
                    f"{where}: ratio {r}: the fork took free blocks {sorted(free0[r] - set(pool.free_blocks[r]))}"
                )
            for d in dsts:
                if pool.blocks_of[r][d] != pool.blocks_of[r][src]:
                    raise Mismatch(
                        f"{where}: ratio {r}: dst {d} holds {pool.blocks_of[r][d]}, src {pool.blocks_of[r][src]}"
                    )
        if pool.length[src] != exp_len[src] or any(pool.length[d] != exp_len[src] for d in dsts):
            raise Mismatch(f"{where}: lengths {pool.length} after the fork; src {src} held {exp_len[src]}")
        check_blocks(where)
        check_caches(where, [src, *dsts])
        stats["fork"] += 1
        stats["fork_dsts"] += len(dsts)
        stats["fork_begun"] += bool(stepping)
        if "rb" in act:
            sl, pos = act["rb"]
            want = expect_rb(sl, pos)
            snap = _rt_snapshot(bt, pool)
            if want is None:
                _allowed(where, bt.rollback, sl, pos)
                stats["fork_rb_noop"] += 1
            else:
                fn = functools.partial(bt.rollback, sl, pos)
                _expect_refusal(where, f"rollback({sl}, {pos})", fn, RB_REFUSAL[want], f"pos = {exp_len[sl]}")
                stats["fork_rb_refused"] += 1
            _unchanged(f"{where} rollback({sl}, {pos})", snap, bt, pool)

    def action(act, where):
        kind = act["act"]
        where = f"{where} {kind}"
        if kind == "release":
            sl = act["slot"]
            _allowed(where, pool.release, sl)  # between steps
            if any(pool.blocks_of[r][sl] for r in pool.ratios) or any(
                (pool.tables[r][sl] != -1).any() for r in pool.ratios
            ):
                raise Mismatch(f"{where} slot{sl}: blocks kept after release")
            new_seq(sl)
            exp_len[sl] = 0
            refs.pop(sl, None)
            released.add(sl)
            stats["release"] += 1
        elif kind == "stale_rb":
            sl, pos = act["slot"], act["pos"]
            want = expect_rb(sl, pos)
            if want is None:
                raise RuntimeError(f"fuzzer: {where} slot{sl} pos {pos}: the generator meant a refused rollback")
            fn = functools.partial(bt.rollback, sl, pos)
            _expect_refusal(where, f"rollback({sl}, {pos})", fn, RB_REFUSAL[want], "allowed")
            stats["stale_rb_refused"] += 1
        elif kind == "keys_rb":  # each slot to its end (a no-op) or back into its last call (refused)
            slots, many = act["slots"], act["many"]
            pos = [max(0, exp_len[sl] - b) for sl, b in zip(slots, act["back"])]
            snap = _rt_snapshot(bt, pool)
            for ss, ps in [(slots, pos)] if many else [([sl], [p]) for sl, p in zip(slots, pos)]:
                args = (ss, ps) if many else (ss[0], ps[0])
                fn = functools.partial(bt.rollback_many if many else bt.rollback, *args)
                bad = next(((sl, p) for sl, p in zip(ss, ps) if expect_rb(sl, p) is not None), None)
                if bad is None:
                    _allowed(where, fn.func, *args)
                    stats["keys_rb_noop"] += 1
                else:
                    sl, p = bad
                    frags = (f"slot {sl}: rollback to {p} ", RB_REFUSAL[expect_rb(sl, p)], f"{exp_len[sl]} (no change)")
                    _expect_refusal(where, f"{fn.func.__name__}{args}", fn, *frags)
                    stats["keys_rb_refused"] += 1
            _unchanged(where, snap, bt, pool)
        elif kind == "cancel":
            slots, starts, lens = act["slots"], act["starts"], act["lens"]
            try:
                st = bt.begin(slots, starts, lens)
            except ValueError as e:
                if runtime_rule(e):  # the released-keys rule (nothing changed): nothing to cancel
                    stats["cancel_begin_refused"] += 1
                    return
                raise Mismatch(f"{where}: begin({slots}, {starts}, {lens}) refused: {e}") from None
            begun(slots, starts, lens)
            stepping.clear()
            stepping.update(slots)  # (a step begun before and not run is dropped)
            for sl, s in zip(slots, starts):
                if s == 0:  # the slot holds an empty sequence now
                    refs.pop(sl, None)
            if "probe" in act:
                sl = act["probe"]
                fn = functools.partial(pool.release, sl)
                _expect_refusal(where, f"release({sl}) of a begun step", fn, "while a step", "cancel() first")
                stats["probe_refused"] += 1
                fork({"act": "fork", "src": (sl + 1) % n_slots, "dsts": [sl], "bad": True}, f"{where} fork probe")
            if act["how"] == "drop":  # the step's own begin drops it
                stats["cancel_drop"] += 1
                return
            _allowed(where, bt.cancel)
            stepping.clear()
            if act["how"] == "twice":
                _allowed(where, bt.cancel)  # no step: nothing to do
            x0 = torch.zeros(sum(lens), cfg.dim, dtype=torch.bfloat16)
            _expect_refusal(
                where, "forward of a cancelled step", functools.partial(bt.forward, wts[0], x0, st), "call begin"
            )
            stats["cancel"] += 1
        elif kind == "fork":
            fork(act, where)
        else:
            raise ValueError(f"fuzzer: unknown action {kind!r}")
        check_state(where)

    for si, step in enumerate(spec["steps"]):
        for ai, act in enumerate(step.get("pre", ())):
            action(act, f"step{si} pre{ai}")
        check_state(f"step{si} before")
        slots, starts, lens, item_rows, snaps = [], [], [], [], {}
        for it in step["items"]:
            sl, m = it["slot"], it["m"]
            xs, ds = streams[sl]
            s = 0 if it["kind"] == "new" else pool.length[sl]
            if it["kind"] == "new":
                refs[sl] = RefStack(cfg, w, index_keys=spec["index_keys"])
                if sl in released:
                    stats["reuse"] += 1
            released.discard(sl)
            if it["kind"] == "verify":
                j = it["j"]
                rows = [torch.cat([x[s : s + j], d[s + j : s + m]]) for x, d in zip(xs, ds)]
                snaps[sl] = _ref_snapshot(refs[sl])
            else:
                rows = [x[s : s + m] for x in xs]
            slots.append(sl)
            starts.append(s)
            lens.append(m)
            item_rows.append(rows)
        bx = [torch.cat([rows[i] for rows in item_rows]) for i in range(nl)]
        where = f"step{si} {step['drv']} slots={slots} starts={starts} lens={lens}"
        tr = step.get("trace")
        stepping.clear()
        stepping.update(slots)
        ref_outs, (outs, traces) = both(
            where,
            functools.partial(_batch_ref_step, refs, slots, starts, item_rows),
            functools.partial(_batch_rt_step, bt, g, wts, step, bx, slots, starts, lens, stats, where, fork),
        )
        stepping.clear()
        begun(slots, starts, lens)
        step_seq = {sl: seq[sl] for sl in slots}  # a fork in rb_pre may replace a verified sequence
        for sl, s, m in zip(slots, starts, lens):
            exp_len[sl] = s + m
            if undo[sl] is not None:
                undo[sl]["done"] = True
        check_state(where)
        o = 0
        for sl, m in zip(slots, lens):
            for i in range(nl):
                _cmp_tensor(f"{where} slot{sl} L{i}", "out", ref_outs[sl][i]["out"], outs[i][o : o + m])
            o += m
        if traces:
            b = slots.index(tr)
            s_t, m_t = starts[b], lens[b]
            for i in range(nl):
                ra, rb_ = dict(ref_outs[tr][i]), dict(traces[i])
                if m_t == 1 and s_t > 0 and "kv_win" in ra and "kv_win" in rb_:
                    # a decode token's kv_win is the whole ring: slots of positions < 0 were never
                    # written in this sequence (reference: zeros; the pool: an earlier sequence's
                    # rows, read by no selection). Compare only the written slots.
                    live = sorted({q % W for q in range(max(0, s_t - W + 1), s_t + 1)})
                    ra["kv_win"], rb_["kv_win"] = ra["kv_win"][live], rb_["kv_win"][live]
                cmp_trace(f"{where} trace slot{tr} L{i}", ra, rb_)
        for ai, act in enumerate(step.get("rb_pre", ())):  # a release or a cancelled begin first
            action(act, f"step{si} rb_pre{ai}")
        rb = [(it["slot"], starts[slots.index(it["slot"])] + it["j"]) for it in step["items"] if it["kind"] == "verify"]
        want = {sl: expect_rb(sl, pos) for sl, pos in rb}
        runs = [(sl, pos) for sl, pos in rb if want[sl] is None]
        where_rb = f"step{si} rollback {rb}"
        if rb:
            if step.get("rb_many"):
                if len(runs) < len(rb):  # all or nothing: refused as its first refused slot is
                    sl, pos = next((sl, pos) for sl, pos in rb if want[sl] is not None)
                    fn = functools.partial(bt.rollback_many, [a for a, _ in rb], [b for _, b in rb])
                    _expect_refusal(where_rb, "rollback_many", fn, f"slot {sl}: ", RB_REFUSAL[want[sl]])
                    check_state(f"{where_rb} (refused)")
                _allowed(where_rb, bt.rollback_many, [a for a, _ in runs], [b for _, b in runs])
            else:
                for sl, pos in rb:
                    if want[sl] is None:
                        _allowed(where_rb, bt.rollback, sl, pos)
                    else:
                        fn = functools.partial(bt.rollback, sl, pos)
                        _expect_refusal(where_rb, f"rollback({sl}, {pos})", fn, RB_REFUSAL[want[sl]], "allowed")
            stats["rb_refused"] += len(rb) - len(runs)
            for sl, pos in runs:
                if seq[sl] != step_seq[sl]:  # forked into since: pos is its new sequence's length (a no-op)
                    continue
                exp_len[sl] = pos
                s = starts[slots.index(sl)]
                _ref_restore(refs[sl], snaps[sl])
                for i in range(nl if pos > s else 0):
                    refs[sl].layer(i, streams[sl][0][i][s:pos], s)
                stats["verify"] += 1
            check_state(where_rb)
        check_caches(f"step{si} after", range(n_slots))  # every slot's: a step writes only its own blocks
        stats["steps"] += 1
    # final cache rows per slot (own and released alike)
    for sl, ref in refs.items():
        n = pool.length[sl]
        for i in cfg.kv_source_layers:
            L = n // cfg.roles[i].ratio
            where = f"end slot{sl} L{i}"
            _cmp_tensor(where, "cache compress_kv", ref.states[i].compress_kv[:L], pool.cache_rows(i, sl, L))
            _cmp_tensor(where, "cache index_k", ref.states[i].index_k[:L], pool.cache_rows(i, sl, L, keys=True))
    return stats


# ----------------------------------------------------------------------------- driver
GEN = {"single": gen_single, "batch": gen_batch, "multi": gen_multi}
RUN = {"single": run_single, "batch": run_batch, "multi": run_multi}
MODES = ("single", "batch", "multi")


def gen_spec(seed: int, mode: str = "mix") -> dict:
    return GEN[MODES[seed % 3] if mode == "mix" else mode](seed)


def run_spec(spec: dict) -> dict:
    return RUN[spec["mode"]](spec)


def _ops(spec: dict):
    """The runtime's op table: the CPU default, or with `spec["compact"]` TORCH_OPS with the
    compact reindex form (`runtime.ops.compacts`) that the CUDA tables take."""
    if not spec.get("compact"):
        return None
    import dataclasses  # noqa: PLC0415

    from attnv41.runtime.ops import TORCH_OPS  # noqa: PLC0415

    return dataclasses.replace(TORCH_OPS, name="torch-compact", compact_reindex=True)


def run_trial(spec: dict) -> tuple[str, str]:
    """(result, message): ok, REFUSED, MISMATCH or EXC."""
    try:
        return "ok", json.dumps(run_spec(spec))
    except Mismatch as e:
        return "MISMATCH", str(e)
    except Refused as e:
        return "REFUSED", str(e)
    except Exception as e:
        return "EXC", f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"


def refusal_kind(msg: str) -> str:
    """A REFUSED trial's reason, numbers left out (the summary's `refused_why`)."""
    if "runtime rule: " in msg:
        rule = next((r for r in RUNTIME_RULES if all(p in msg for p in r)), None)
        return "runtime rule: " + (" ... ".join(rule) if rule else msg.split("runtime rule: ", 1)[1])
    if "refused by both: reference " in msg:
        ref = msg.split("refused by both: reference ", 1)[1].split("; runtime ", 1)[0]
        return "refused by both: " + re.sub(r"\d+", "N", ref)
    return re.sub(r"\d+", "N", msg)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="first seed (trial i uses seed + i)")
    ap.add_argument("--trials", type=int, help="number of trials")
    ap.add_argument("--time", type=float, help="stop starting trials after this many seconds")
    ap.add_argument("--mode", choices=("mix", *MODES), default="mix")
    ap.add_argument("--out", type=Path, default=Path.cwd() / "fuzz_out", help="output directory (default ./fuzz_out)")
    ap.add_argument("--replay", type=Path, help="run one saved spec and print its result")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument(
        "--compact",
        action="store_true",
        help="the runtime's reindex layers over their candidates only (the CUDA tables' form, by the torch twins)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.replay:
        res, msg = run_trial(json.loads(args.replay.read_text()))
        print(res, msg)
        return 0 if res in ("ok", "REFUSED") else 1
    if args.trials is None and args.time is None:
        ap.error("give --trials, --time or --replay")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    counts: dict[str, int] = {}
    actions: dict[str, dict[str, int]] = {}  # per mode, the ok trials' stats summed
    refused_why: dict[str, int] = {}
    seed, failed = args.seed, 0
    with open(args.out / f"log_{args.seed}.txt", "a") as logf:
        while True:
            if args.time is not None and time.time() - t0 > args.time:
                break
            if args.trials is not None and seed - args.seed >= args.trials:
                break
            spec = gen_spec(seed, args.mode)
            if args.compact:
                spec["compact"] = True
            t1 = time.time()
            res, msg = run_trial(spec)
            key = "|".join((spec["mode"], spec["kv_format"], spec["weights"], spec["index_keys"], res))
            counts[key] = counts.get(key, 0) + 1
            if res == "ok":
                tot = actions.setdefault(spec["mode"], {})
                for k, v in json.loads(msg).items():
                    tot[k] = tot.get(k, 0) + v
            elif res == "REFUSED":
                why = refusal_kind(msg)
                refused_why[why] = refused_why.get(why, 0) + 1
            if res in ("MISMATCH", "EXC"):
                failed += 1
                path = args.out / f"{res.lower()}_{spec['mode']}_{seed}.json"
                path.write_text(json.dumps(spec, indent=1))
                logf.write(f"seed {seed} {spec['mode']} {res} ({time.time() - t1:.1f}s) {path.name}: {msg}\n")
                logf.flush()
            seed += 1
    summary = {
        "seed0": args.seed,
        "trials": seed - args.seed,
        "failed": failed,
        "elapsed": round(time.time() - t0, 1),
        "counts": dict(sorted(counts.items())),
        "actions": dict(sorted(actions.items())),
        "refused_why": dict(sorted(refused_why.items(), key=lambda kv: -kv[1])),
    }
    (args.out / f"summary_{args.seed}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
