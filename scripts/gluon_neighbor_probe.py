"""Whether the Gluon attention pays a fixed cost next to other kernels (a development tool;
CUDA): one CUDA graph per row, L2 flushed before each replay, µs per replay. Rows: the
attention alone, a small elementwise kernel alone, the two in one graph (both orders), for
the Gluon kernel and the Triton kernels, at B tokens of the Flash shapes.

    python3 scripts/gluon_neighbor_probe.py [--batch 64]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

from gluon_attn_probe import inputs  # noqa: E402

from attnv41.bench.common import Timer  # noqa: E402
from attnv41.kernels.sparse_attn_gluon import sparse_attn_gluon  # noqa: E402
from attnv41.kernels.sparse_attn_split import BATCH_TUNE, sparse_attn_split  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    timer = Timer("cuda", flush_l2=True)
    q, win, comp, sel, offset, sink, _ = inputs(a.batch)
    D = q.shape[2]
    out = torch.empty_like(q)
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    u = torch.empty(64, 4096, device="cuda", dtype=torch.bfloat16)
    small = {"add": lambda: torch.add(x, 1.0, out=y), "mm": lambda: torch.mm(v, w, out=u)}
    attn = {
        "gluon": lambda: sparse_attn_gluon(q, win, comp, sel, offset, sink, D**-0.5, out=out),
        "gluon no pdl": lambda: sparse_attn_gluon(q, win, comp, sel, offset, sink, D**-0.5, out=out, pdl=False),
        "triton": lambda: sparse_attn_split(q, win, comp, sel, offset, sink, D**-0.5, out=out, **BATCH_TUNE),
    }
    for f in (*small.values(), *attn.values()):
        f()
    torch.cuda.synchronize()

    def t(fns):
        return timer.time_graph([lambda: [f() for f in fns]], reps=30).median_ms * 1e3

    print(f"| B = {a.batch} | alone | + add (before) | + add (after) | + mm (before) | + mm (after) |")
    print("|---|---|---|---|---|---|")
    base = {k: t([f]) for k, f in small.items()}
    print(f"| (add {base['add']:.1f}, mm {base['mm']:.1f} alone) | | | | | |")
    for name, f in attn.items():
        row = [t([f])]
        for k, g in small.items():
            row += [t([g, f]) - base[k], t([f, g]) - base[k]]
        print(f"| {name} | " + " | ".join(f"{r:.1f}" for r in row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
