"""Kernels per layer of one decode step (V4.1-Flash geometry, random weights, a filled
context), counted with torch.profiler on CUDA: each layer's eager `forward` of one token
is profiled alone and its GPU kernels (memcpy/memset excluded) are counted, per role.

    python3 scripts/kernel_count.py [--context 4096] [--weights bf16|fp8] [--label now]

Run it against another tree with PYTHONPATH pointing at that tree's src (the script uses
only APIs present since issue 11). Prints a Markdown table; writes
`$OUT/kernel_count_<label>_<weights>.json` when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from attnv41.bench.stack import fill_context
from attnv41.runtime.stack import RuntimeStack
from attnv41.synthetic import PRESETS, random_weights


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--weights", default="bf16")
    ap.add_argument("--label", default="now")
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg = PRESETS["flash"](max_tokens=256, max_seq=args.context + 64)
    stack = RuntimeStack(cfg, random_weights(cfg, 0, dev, weights=args.weights), device=dev)
    fill_context(stack, args.context, 0)
    p = args.context
    x = torch.randn(cfg.n_layers, 1, cfg.dim, device=dev).to(torch.bfloat16)
    for i in range(cfg.n_layers):  # warm-up step: compiles every kernel
        stack.layer(i, x[i], p)
    torch.cuda.synchronize()
    p += 1
    per_layer, names = [], {}
    for i in range(cfg.n_layers):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            stack.layer(i, x[i], p)
            torch.cuda.synchronize()
        ks = Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA and not any(
                s in e.name.lower() for s in ("memcpy", "memset")
            ):
                ks[e.name[:60]] += 1
        role = cfg.role(i).name
        per_layer.append((i, role, sum(ks.values())))
        names.setdefault(role, dict(ks))
    by_role: dict[str, list[int]] = {}
    for _, role, n in per_layer:
        by_role.setdefault(role, []).append(n)
    total = sum(n for _, _, n in per_layer)
    print(f"\n### kernels per layer, decode step ({args.label}, {args.weights}, context {args.context})\n")
    print("| role | layers | kernels per layer |")
    print("|---|---|---|")
    for role, ns in by_role.items():
        print(f"| {role} | {len(ns)} | {min(ns)}{'' if min(ns) == max(ns) else f'-{max(ns)}'} |")
    print(f"| all | {cfg.n_layers} | {total / cfg.n_layers:.1f} on average, {total} per step |")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"kernel_count_{args.label}_{args.weights}.json"), "w") as f:
            json.dump(dict(per_layer=per_layer, kernels_by_role=names, total=total), f, indent=1)


if __name__ == "__main__":
    main()
