"""Where a graph-replayed decode step spends its time (V4.1-Flash geometry, random weights,
a filled context; CUDA only; a development tool, not part of `attnv41 bench`).

Replays whole-step CUDA graphs (`DecodeGraphs`) under torch.profiler, which records each
kernel inside a replay, and reports per step: the span from the first kernel's start to
the last kernel's end, the sum of kernel durations, the idle gaps between consecutive
kernels (the launch ramp and drain a graph cannot hide), and per kernel name the count,
total and mean GPU time. That is the step's real breakdown, with the weights cold as
they are in a step (every kernel alone in `bench` (b) is timed with its own L2 flush).

    python3 scripts/step_profile.py [--context 32768] [--weights bf16|fp8] [--steps 5] [--batch B]
                                    [--kv-format bf16|packed]

`--batch B`: a batched decode step of B sequences instead (`BatchV41` driven by
`BatchGraphs`, every slot's pools assumed filled to the context with random index keys).
`--chunk M`: a prompt chunk of M tokens of one sequence instead, at the context (the
"cont" graph kind, as `bench --parts long` runs a long prompt's chunks; each profiled
chunk follows the last, so the context grows by M per step): where a long prompt's chunk
goes, e.g. `--chunk 2048 --context 786432 --steps 3`.

Kernels launch without programmatic dependent launch here (`ATTNV41_PDL=0` unless set):
with it a kernel's programs start early and wait for the previous kernel, so the
profiler's durations would include the waits (the step's span stays right).

Prints Markdown tables; writes `$OUT/step_profile_<weights>.json` when OUT is set, and the
first profiled step's kernels in order (start µs, duration µs, name) to
`$OUT/step_sequence_<weights>_b<batch>_<kv>.txt`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from attnv41.bench.stack import fill_context
from attnv41.runtime.graphs import DecodeGraphs
from attnv41.runtime.stack import RuntimeStack
from attnv41.synthetic import PRESETS, random_weights, unit_rms_bf16

os.environ.setdefault("ATTNV41_PDL", "0")  # per-kernel durations without the PDL waits (module doc)


def _short(name: str) -> str:
    for key in ("gemm", "gemv", "Kernel2", "cutlass", "sm90_xmma"):
        if key in name and len(name) > 48:
            return name[:48]
    return name[:60]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--weights", default="bf16")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--preset", default="flash", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=0, help="B > 0: a BatchGraphs step of B sequences")
    ap.add_argument("--verify-len", type=int, default=1, help="with --batch: k tokens per sequence (a verify step)")
    ap.add_argument("--chunk", type=int, default=0, help="M > 0: a prompt chunk of M tokens of one sequence")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (CPU ops, no graphs)")
    ap.add_argument("--kv-format", default="bf16", choices=["bf16", "packed"], help="the caches' format")
    ap.add_argument(
        "--wo-a",
        default="auto",
        choices=["auto", "bf16", "fp8"],
        help="wo_a's storage; auto: fp8 with FP8 weights, as bench builds its FP8 stack",
    )
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    if args.chunk > 0 and args.batch > 0:
        ap.error("--chunk and --batch: one or the other")
    span = (args.steps + 4) * args.chunk if args.chunk > 0 else 256
    cfg = PRESETS[args.preset](max_tokens=256, max_seq=max(256, args.context + span))
    wo_a = args.wo_a if args.wo_a != "auto" else ("fp8" if args.weights == "fp8" else "bf16")
    w = random_weights(cfg, 0, dev, weights=args.weights)
    stack = RuntimeStack(cfg, w, device=dev, kv_format=args.kv_format, wo_a=wo_a)
    gen = torch.Generator(device=dev).manual_seed(7)
    if args.batch > 0:
        from attnv41.bench.batch import _random_keys
        from attnv41.runtime.batch import BatchV41
        from attnv41.runtime.batch_graphs import BatchGraphs

        B, k = args.batch, args.verify_len
        bt = BatchV41(cfg.replace(max_tokens=B * k), dev, n_slots=B, kv_format=args.kv_format)
        for sl in range(B):
            bt.pool.assume(sl, args.context)
        _random_keys(bt, gen)
        drv = BatchGraphs(bt, stack.weights, sizes=(B * k,))
        xs = drv.x_in[:, : B * k]
        xs.copy_(unit_rms_bf16(torch.randn(xs.shape, generator=gen, device=dev)))

        def one(p):
            drv.step(xs, list(range(B)), [k] * B)
    elif args.chunk > 0:
        from attnv41.bench.batch import _random_keys
        from attnv41.runtime.batch import BatchV41
        from attnv41.runtime.batch_graphs import BatchGraphs

        M = args.chunk
        bt = BatchV41(cfg.replace(max_tokens=M), dev, n_slots=1, kv_format=args.kv_format)
        bt.pool.assume(0, args.context)
        _random_keys(bt, gen)
        drv = BatchGraphs(bt, stack.weights, sizes=(M,))
        xs = drv.x_in[:, :M]
        xs.copy_(unit_rms_bf16(torch.randn(xs.shape, generator=gen, device=dev)))

        def one(p):
            drv.step(xs, [0], [M], [args.context + (p - args.context) * M])
    else:
        fill_context(stack, args.context, 0)
        xs = unit_rms_bf16(torch.randn(cfg.n_layers, 1, cfg.dim, generator=gen, device=dev))
        drv = DecodeGraphs(stack)

        def one(p):
            drv.step(xs, p)

    p = args.context
    for _ in range(4):  # capture and warm replays
        one(p)
        p += 1
    sync()
    gap_us = 1000.0 if args.chunk == 0 else 20_000.0  # a chunk's kernels may idle longer
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            one(p)
            p += 1
            sync()
            if cuda:
                torch.cuda._sleep(4_000_000 if args.chunk == 0 else 80_000_000)  # steps apart: gaps separate them below
    ks = sorted(
        (e.time_range.start, e.time_range.end, _short(e.name), e.name)
        for e in prof.events()
        # the sleep between steps is a kernel too (spin_kernel): left out, or no gap would separate the steps
        if e.device_type == kind and not any(s in e.name.lower() for s in ("memcpy", "memset", "spin_kernel"))
    )
    steps, cur = [], []
    for k in ks:
        if cur and k[0] - cur[-1][1] > gap_us:
            steps.append(cur)
            cur = []
        cur.append(k)
    if cur:
        steps.append(cur)
    rows, per_name = [], defaultdict(list)
    for st in steps:
        span = st[-1][1] - st[0][0]
        busy = sum(k[1] - k[0] for k in st)
        gaps = [b[0] - a[1] for a, b in zip(st, st[1:])]
        rows.append(
            dict(kernels=len(st), span_us=span, busy_us=busy, gap_us=span - busy, median_gap_us=statistics.median(gaps))
        )
        names = defaultdict(list)
        for s, e, n, _ in st:
            names[n].append(e - s)
        for n, d in names.items():
            per_name[n].append((len(d), sum(d)))
    what = (
        f"batch {args.batch}{f' x {args.verify_len} tokens' if args.verify_len > 1 else ''}, " if args.batch else ""
    ) + f"{args.kv_format} caches, "
    what = (f"a {args.chunk}-token prompt chunk, " if args.chunk else "") + what
    print(
        f"\n### {'prompt chunk' if args.chunk else 'decode step'} under the profiler ({what}{args.weights} weights, wo_a {wo_a}, context {args.context}, {len(steps)} steps)\n"
    )
    print("| step | kernels | span µs | kernel µs | gaps µs | median gap µs |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        print(
            f"| {i} | {r['kernels']} | {r['span_us']:.0f} | {r['busy_us']:.0f} | {r['gap_us']:.0f} | {r['median_gap_us']:.2f} |"
        )
    print("\n| kernel | per step | µs per step | µs each |")
    print("|---|---|---|---|")
    agg = []
    for n, v in per_name.items():
        cnt = statistics.median(c for c, _ in v)
        tot = statistics.median(t for _, t in v)
        agg.append((tot, cnt, n))
    for tot, cnt, n in sorted(agg, reverse=True):
        print(f"| {n} | {cnt:g} | {tot:.1f} | {tot / cnt:.2f} |")
    out = os.environ.get("OUT")
    if out and steps:  # the first profiled step's kernels in order (where each small kernel sits)
        with open(os.path.join(out, f"step_sequence_{args.weights}_b{args.batch}_{args.kv_format}.txt"), "w") as f:
            t0 = steps[0][0][0]
            for s, e, _, full in steps[0]:
                f.write(f"{s - t0:9.1f} {e - s:7.2f} {full[:160]}\n")
    if out:
        with open(
            os.path.join(
                out,
                f"step_profile_{args.weights}_woa{wo_a}_b{args.batch}k{args.verify_len}c{args.chunk}_{args.kv_format}.json",
            ),
            "w",
        ) as f:
            json.dump(
                dict(wo_a=wo_a, steps=rows, kernels=[dict(name=n, per_step=c, us=t) for t, c, n in agg]), f, indent=1
            )


if __name__ == "__main__":
    main()
