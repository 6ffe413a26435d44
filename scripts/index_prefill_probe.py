# ruff: noqa: B023  (the timed call runs inside the loop iteration that made it)
"""Timing of the index scores at a prompt chunk's shapes (GPU only; a development tool, not
part of `attnv41 bench`).

A chunk's index scores at the Flash shapes (32 heads × 128, a paged pool of 64-row blocks,
bf16 or packed keys), as `BatchV41._select` launches them: (a) the 64-token tile of a chunk in
the 1M context bucket (2²⁶ / 1M tokens per launch) with visible counts at 90 % and 55 % of the
width; (b) a 2,048-token chunk in the 32K bucket at 90 %. Per launch shape: µs, the score
bytes equal to production's, and the token × key bytes over the time.

Timed now: one token per program against the `tokens` launch option (2-16 consecutive
tokens per program sharing each block of keys), and the top-k (k = 512) over each bf16
shape's scores under other tiles and warps and with `neg_inf_past` (the same selection in
every case; on 2026-12-06 a 64-token tile's top-k over 1M positions took 826 µs on an H100,
0.46 TB/s of its three passes' reads; tile 2048 at 4 warps 784), and batched steps that mix
a prompt chunk with decode tokens: one launch with tokens 16 (the runtime's rule) and one
token per program. On 2026-12-06 (thirty-eighth entry) a third form, a launch per prompt run
with the option and one for the other rows, lost to its extra launch's host cost (4K: 180
against 79 µs) and was removed with its column.

History: on 2026-12-03 (sixth entry) this script timed a prefill form (8 tokens per program
sharing each key tile, 255 registers), which lost (6.8 against 4.3 ms on the 1M tile) and
was removed; and `skip=True` (blocks wholly past a token's visible rows: −∞ without the
dot), which won (2.55 against 4.24 ms at 55 % visible) and became the production shape
(seventh entry). On 2026-12-06 (thirty-seventh entry) the `tokens` option (its keys loaded
once into shared memory, its tokens' query loads pipelined; 77-128 registers) won: 1.5-1.6x
at 16 (H100). Prints two Markdown tables; writes JSON to
$OUT/index_prefill_probe.json when OUT is set.

    python scripts/index_prefill_probe.py
"""

from __future__ import annotations

import json
import os

import torch

from attnv41.bench.common import Timer
from attnv41.kernels import indexer as I
from attnv41.kernels.topk import topk_fixed
from attnv41.packed import pack
from attnv41.reference.qdq import fp4_e8m0_qdq

SHAPES = (
    ("1M tile, 90 % visible", 64, 1048576, 943000),
    ("1M tile, 55 % visible", 64, 1048576, 577000),
    ("32K chunk, 90 % visible", 2048, 32768, 29490),
)
TUNES = [
    ("one token per program", {}),
    ("tokens=4", dict(tokens=4)),
    ("tokens=16", dict(tokens=16)),
    ("tokens=16, sub 2", dict(tokens=16, sub_tokens=2)),
    ("tokens=16, sub 4", dict(tokens=16, sub_tokens=4)),
    ("tokens=8", dict(tokens=8)),
    ("tokens=16, block_l=128", dict(tokens=16, block_l=128)),
    ("tokens=16, 8 warps", dict(tokens=16, num_warps=8)),
    ("tokens=16, 3 stages", dict(tokens=16, num_stages=3)),
]
# a batched step mixing a prompt chunk with decode tokens (one each of many sequences): the
# rows as one launch with tokens 16 (the runtime's rule) and with one token per program
MIXED = (
    ("64 decode at 4K + 256-token chunk", 4096, 64, 256),
    ("64 decode at 32K + 512-token chunk", 32768, 64, 512),
    ("8 decode at 32K + 2,048-token chunk", 32768, 8, 2048),
)


# the top-k's tile (positions per program) and warps: the same selection for any (exact)
TOPK_TUNES = [
    ("production", {}),
    ("neg_inf_past", dict(neg_inf_past=True)),
    ("tile 2048, 4 warps", dict(tile=2048, num_warps=4)),
    ("tile 8192, 8 warps", dict(tile=8192, num_warps=8)),
    ("tile 2048, 2 warps", dict(tile=2048, num_warps=2)),
    ("tile 1024, 2 warps", dict(tile=1024, num_warps=2)),
    ("tile 1024, 4 warps", dict(tile=1024, num_warps=4)),
    ("tile 4096, 4 warps", dict(tile=4096, num_warps=4)),
    ("tile 2048, 4 warps, neg_inf_past", dict(tile=2048, num_warps=4, neg_inf_past=True)),
]


def main() -> None:
    dev = torch.device("cuda")
    timer = Timer(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    H, d, B = 32, 128, 64
    rows, topk_rows = [], []
    for kvf in ("bf16", "packed"):
        for name, T, L, v0 in SHAPES:
            nb = L // B
            table = torch.randperm(nb, device=dev, generator=gen).to(torch.int32)[None]
            keys = torch.randn(nb * B, d, device=dev, generator=gen).to(torch.bfloat16)
            if kvf == "packed":
                keys = pack(fp4_e8m0_qdq(keys), "fp4_e8m0")
            iq = torch.randn(T, H, d, device=dev, generator=gen).to(torch.bfloat16)
            w = torch.randn(T, H, device=dev, generator=gen).to(torch.bfloat16)
            slots = torch.zeros(T, dtype=torch.int32, device=dev)
            vis = (v0 + torch.arange(T, device=dev)).clamp_max(L).to(torch.int32)
            out = torch.empty(T, L, dtype=torch.bfloat16, device=dev)
            base = None
            key_bytes = float(vis.sum()) * keys.shape[1] * keys.element_size()
            for label, kw in TUNES:
                r = dict(kv=kvf, shape=name, tokens=T, keys=L, config=label)
                try:

                    def call(kw=kw):
                        I.index_scores_paged(iq, w, keys, table, slots, B, vis, L, out=out, **kw)

                    call()
                    timer.sync()
                    if base is None:
                        base = out.clone()
                    r["same"] = bool(torch.equal(out.view(torch.int16), base.view(torch.int16)))
                    t = timer.time(call, warmup=2, reps=10)
                    r["us"] = t.median_ms * 1e3
                    r["key_tb_s"] = key_bytes / (t.median_ms * 1e-3) / 1e12
                except Exception as ex:  # one shape failing must not stop the probe
                    r["error"] = f"{type(ex).__name__}: {str(ex)[:160]}"
                rows.append(r)
                print(r, flush=True)
            if kvf == "bf16" and base is not None:  # the top-k over these scores (k = 512)
                sel = torch.empty(T, 512, dtype=torch.int32, device=dev)
                first = None
                for label, kw in TOPK_TUNES:
                    r = dict(shape=name, tokens=T, keys=L, config=label)
                    try:

                        def pick(kw=kw):
                            topk_fixed(base, vis, 512, 0, sel, **kw)

                        pick()
                        timer.sync()
                        if first is None:
                            first = sel.clone()
                        r["same"] = bool(torch.equal(sel, first))
                        r["us"] = timer.time(pick, warmup=2, reps=10).median_ms * 1e3
                    except Exception as ex:
                        r["error"] = f"{type(ex).__name__}: {str(ex)[:160]}"
                    topk_rows.append(r)
                    print(r, flush=True)
            keys = out = base = None
            torch.cuda.empty_cache()
    mixed_rows = mixed(timer, gen)
    print("\n| kv | shape | config | µs | same bits | token-key bytes / time (TB/s) |\n|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['kv']} | {r['shape']} | {r['config']} | error: {r['error']} | | |")
        else:
            print(f"| {r['kv']} | {r['shape']} | {r['config']} | {r['us']:.1f} | {r['same']} | {r['key_tb_s']:.2f} |")
    print("\n| top-k over | config | µs | same selection |\n|---|---|---|---|")
    for r in topk_rows:
        print(f"| {r['shape']} | {r['config']} | {r.get('us', float('nan')):.1f} | {r.get('same', r.get('error'))} |")
    print("\n| kv | mixed step | one launch, tokens 16 | one launch, tokens 1 | same bits |\n|---|---|---|---|---|")
    for r in mixed_rows:
        us = [r.get(k, float("nan")) for k in ("all16", "all1")]
        print(f"| {r['kv']} | {r['shape']} | {us[0]:.1f} | {us[1]:.1f} | {r.get('same', r.get('error'))} |")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "index_prefill_probe.json"), "w") as f:
            json.dump(dict(scores=rows, topk=topk_rows, mixed=mixed_rows), f, indent=1)


def mixed(timer, gen) -> list[dict]:
    """The MIXED steps' index scores (Flash index shapes, paged 64-row blocks): decode tokens
    first (one slot each, visible at 97 % of the context), then the chunk (slot 0)."""
    dev = timer.device
    H, d, B = 32, 128, 64
    out_rows = []
    for kvf in ("bf16", "packed"):
        for name, ctx, n_dec, n_chunk in MIXED:
            r = dict(kv=kvf, shape=name)
            try:
                S, nb = n_dec + 1, ctx // B
                table = torch.randperm(S * nb, device=dev, generator=gen).to(torch.int32).view(S, nb)
                keys = torch.randn(S * nb * B, d, device=dev, generator=gen).to(torch.bfloat16)
                if kvf == "packed":
                    keys = pack(fp4_e8m0_qdq(keys), "fp4_e8m0")
                T = n_dec + n_chunk
                iq = torch.randn(T, H, d, device=dev, generator=gen).to(torch.bfloat16)
                w = torch.randn(T, H, device=dev, generator=gen).to(torch.bfloat16)
                slots = torch.tensor(list(range(1, S)) + [0] * n_chunk, dtype=torch.int32, device=dev)
                v0 = int(ctx * 0.9)
                vis = torch.tensor([int(ctx * 0.97)] * n_dec + [v0 + i for i in range(n_chunk)], device=dev)
                vis = vis.clamp_max(ctx).to(torch.int32)
                out = torch.empty(T, ctx, dtype=torch.bfloat16, device=dev)

                def one(tokens):
                    I.index_scores_paged(iq, w, keys, table, slots, B, vis, ctx, out=out, tokens=tokens)

                same = True
                base = None
                for key, fn in (("all1", lambda: one(1)), ("all16", lambda: one(16))):
                    fn()
                    timer.sync()
                    if base is None:
                        base = out.clone()
                    same = same and bool(torch.equal(out.view(torch.int16), base.view(torch.int16)))
                    r[key] = timer.time(fn, warmup=2, reps=10).median_ms * 1e3
                r["same"] = same
            except Exception as ex:  # one shape failing must not stop the probe
                r["error"] = f"{type(ex).__name__}: {str(ex)[:160]}"
            out_rows.append(r)
            print(r, flush=True)
            keys = out = None
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return out_rows


if __name__ == "__main__":
    main()
