"""Batch-1 decode attention, where its time goes (a development probe; CUDA only): the whole
`sparse_attn_split` at `_TUNE` against its logits kernel alone (`only_logits`), and proxies
of a logits stage spread over more programs:

- `bh16`: the logits in head blocks of 16 (4 programs per 64-row block, each gathering the
  block's rows again);
- `dsplit N`: N tokens of D / N columns each (N programs per block, each reading 1/N of q and
  of the rows: the work of a logits kernel split over D, without the sum of its N partials);
- `rsplit N`: the logits kernel's own option, N programs per block of 64 rows, each over
  64 / N of them (same bytes).

Synthetic Flash shapes at a 32K context (64 heads × 512, 128 window rows + 512 compressed
rows of 8,192), CUDA graphs, L2 flushed before each replay and not; µs, median of rounds.

    python3 scripts/logits_split_probe.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from attnv41.bench.common import Timer  # noqa: E402
from attnv41.kernels.sparse_attn_split import sparse_attn_split  # noqa: E402
from attnv41.packed import pack  # noqa: E402
from attnv41.reference.qdq import fp4_e4m3_qdq, fp8_qdq  # noqa: E402


def inputs(n_tok, D, H=64, W=128, K=512, C=8192, seed=0):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    bf = torch.bfloat16
    q = torch.randn(n_tok, H, D, generator=g, device=dev).to(bf)
    win = fp8_qdq(torch.randn(n_tok * W, D, generator=g, device=dev).to(bf))
    comp = fp4_e4m3_qdq(torch.randn(n_tok * C, D, generator=g, device=dev).to(bf))
    offset = n_tok * W
    t = torch.arange(n_tok, device=dev)
    w_sel = t[:, None] * W + torch.arange(W, device=dev)[None, :]
    c_sel = torch.rand(n_tok, C, generator=g, device=dev).topk(K, dim=1).indices.sort(dim=1).values
    sel = torch.cat([w_sel, offset + t[:, None] * C + c_sel], dim=1).to(torch.int32)
    sink = torch.randn(H, generator=g, device=dev)
    return q, win, comp, sel, offset, sink


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only-new", action="store_true", help="production and the rsplit rows only")
    a = ap.parse_args()
    D = 512
    cases = []  # (name, n_tok, d, tune)
    cases.append(("whole attention", 1, D, {}))
    cases.append(("logits alone", 1, D, {"only_logits": True}))
    cases.append(("logits alone, dk 64", 1, D, {"only_logits": True, "dk": 64}))
    cases.append(("logits alone, bh16", 1, D, {"only_logits": True, "bh": 16}))
    for n in (2, 4, 8):
        cases.append((f"logits alone, dsplit {n} (proxy)", n, D // n, {"only_logits": True, "dk": min(128, D // n)}))
    cases.append(("whole attention, bh16", 1, D, {"bh": 16}))
    for r in (2, 4):
        cases.append((f"logits alone, rsplit {r}", 1, D, {"only_logits": True, "rsplit": r}))
        cases.append((f"whole attention, rsplit {r}", 1, D, {"rsplit": r}))
    cases.append(("logits alone, rsplit 4, keys_m", 1, D, {"only_logits": True, "rsplit": 4, "keys_m": True}))
    cases.append(("whole attention, rsplit 4, bh16", 1, D, {"rsplit": 4, "bh": 16}))
    if a.only_new:
        cases = [c for c in cases if "rsplit" in c[0] or c[0] in ("whole attention", "logits alone")]
    data = {}
    for _, n, d, _t in cases:
        if (n, d) not in data:
            q, win, comp, sel, offset, sink = inputs(n, d)
            data[(n, d)] = {
                "bf16": (q, win, comp, sel, offset, sink),
                "packed": (q, pack(win, "fp8_e8m0"), pack(comp, "fp4_e4m3"), sel, offset, sink),
            }
    print("| case | rows | µs, L2 flushed | µs, L2 warm |")
    print("|---|---|---|---|")
    for flush in (True, False):
        timer = Timer(torch.device("cuda"), flush_l2=flush)
        res = {}
        for _ in range(a.rounds):
            for name, n, d, tune in cases:
                for kvf in ("bf16", "packed"):
                    q, w_, c_, sel, offset, sink = data[(n, d)][kvf]
                    out = torch.empty_like(q)

                    def fn(q=q, w_=w_, c_=c_, sel=sel, offset=offset, sink=sink, out=out, tune=tune, d=d):
                        sparse_attn_split(q, w_, c_, sel, offset, sink, 512**-0.5, out=out, **tune)

                    fn()
                    torch.cuda.synchronize()
                    res.setdefault((name, kvf), []).append(timer.time_graph([fn], reps=30).median_ms * 1e3)
        for key, ts in res.items():
            ts.sort()
            data.setdefault("res", {}).setdefault(key, []).append(ts[len(ts) // 2])
    for (name, kvf), (fl, warm) in data["res"].items():
        print(f"| {name} | {kvf} | {fl:.1f} | {warm:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
