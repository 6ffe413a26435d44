# ruff: noqa: B023  (the timed lambdas run inside the loop iteration that made them)
"""Timing of the decode selections (GPU only; a development tool, not part of `attnv41 bench`).

For Lb in 4K … 1M and m in {1, 64}: random bf16 scores, −∞ past visible = 0.75·Lb, k = 512,
the Flash candidate geometry (2048 blocks of 8). Every variant is first checked exactly
(torch.equal) against its torch twin in `kernels.select`; a variant that differs is
reported and not timed. Timed: the Triton top-k (`kernels.topk.topk_fixed`, per tile and
warp count asked for), the same with the candidate mask fused (`mask=`), torch.topk on
the scores as fp32 alone, `select.topk_fixed`, the Triton candidate mask (per tile asked
for) and `select.candidate_mask_fixed`. Times: one CUDA graph of 20 calls over distinct
inputs (up to 20 copies, at most ~1 GiB of scores), L2 flushed before each replay, the
median replay over 20 divided by 20. One failing row is printed and skipped; the others
still run. Prints one Markdown table; writes JSON to $OUT/topk_tune.json when OUT is set.

    python scripts/topk_tune.py [--tiles 2048,4096] [--warps 4,8] [--mask-tiles 256,512]
                                [--mask-warps 4,8] [--lbs 4096,1048576] [--ms 1,64]
                                [--row-warps 8,16] [--lean] [--budget 110]

"rule" in the cfg column is the production launch shape for (m, Lb) (one program per row
up to `topk._ROW_WIDTH`, else `topk._topk_shape`'s tiles), timed next to the tiled rule, the
asked tiles and warps and one program per row at the asked warps ("row warps=…"). --lean skips timing the torch twins and the
candidate mask (the twins still give the references every variant is checked against).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

from attnv41.bench.common import Timer
from attnv41.kernels import select
from attnv41.kernels import topk as K

K_SEL = 512
CAND_BLOCKS, CAND_BLOCK = 2048, 8
CALLS = 20  # calls per captured graph
COPY_BYTES = 1 << 30  # the most bytes of score copies per shape
BUDGET_S = 110.0  # default --budget: rows not started by then are skipped


def _ints(text: str | None, default: list[int]) -> list[int]:
    return default if not text else [int(x) for x in text.split(",") if x]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiles", help="top-k tiles (positions), comma-separated; default the production tile")
    ap.add_argument("--warps", help="top-k warps per program; default the production count")
    ap.add_argument("--mask-tiles", help="candidate-mask tiles (blocks); default the production tile")
    ap.add_argument("--mask-warps", help="candidate-mask warps per program; default the production count")
    ap.add_argument("--lbs", help="bucket widths; default 4096,32768,131072,1048576")
    ap.add_argument("--ms", help="rows (tokens); default 1,64")
    ap.add_argument(
        "--row-warps", help="warps of the one-program-per-row top-k (rows up to its limit); default production"
    )
    ap.add_argument("--lean", action="store_true", help="time only the Triton top-k variants")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds after which shapes are skipped")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("topk_tune: needs CUDA", file=sys.stderr)
        return 2
    tiles, warps = _ints(a.tiles, [K._BLOCK]), _ints(a.warps, [K._WARPS])
    row_warps = _ints(a.row_warps, [K._ROW_WARPS])
    mask_tiles, mask_warps = _ints(a.mask_tiles, [K._MASK_BLOCKS]), _ints(a.mask_warps, [K._WARPS])
    lbs, ms = _ints(a.lbs, [4096, 32768, 131072, 1 << 20]), _ints(a.ms, [1, 64])
    dev = torch.device("cuda")
    timer = Timer(dev, flush_l2=True)
    t_start = time.monotonic()
    rows: list[dict] = []
    for Lb in lbs:
        for m in ms:
            if time.monotonic() - t_start > a.budget:
                rows.append(dict(Lb=Lb, m=m, variant="*", error=f"skipped: past the {a.budget:.0f} s budget"))
                continue
            try:
                rows += _shape(timer, dev, Lb, m, tiles, warps, mask_tiles, mask_warps, a.lean, row_warps)
            except Exception as e:  # the shape's set-up failed (memory, the twins): the next shape still runs
                traceback.print_exc()
                rows.append(dict(Lb=Lb, m=m, variant="*", error=f"{type(e).__name__}: {e}"[:300]))
            torch.cuda.empty_cache()
    _print(rows)
    out_dir = os.environ.get("OUT")
    if out_dir:
        meta = dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__, k=K_SEL, calls=CALLS)
        with open(os.path.join(out_dir, "topk_tune.json"), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return 0


def _shape(timer, dev, Lb, m, tiles, warps, mask_tiles, mask_warps, lean=False, row_warps=()) -> list[dict]:
    gen = torch.Generator(device=dev).manual_seed(Lb + m)
    L = (3 * Lb) // 4
    copies = max(1, min(CALLS, COPY_BYTES // (m * Lb * 2)))
    cols = torch.arange(Lb, device=dev)[None, :]
    scores = [
        torch.randn(m, Lb, generator=gen, device=dev).bfloat16().masked_fill(cols >= L, float("-inf"))
        for _ in range(copies)
    ]
    vis = torch.full((m,), L, dtype=torch.int32, device=dev)
    tops = [torch.empty(m, K_SEL, dtype=torch.int32, device=dev) for _ in range(copies)]
    masks = [torch.empty(m, Lb, dtype=torch.bool, device=dev) for _ in range(copies)]
    # the twins' results on copy 0, the references every variant must equal
    want_top = select.topk_fixed(scores[0], vis, K_SEL, 0, torch.empty_like(tops[0]))
    want_mask = select.candidate_mask_fixed(scores[0], vis, CAND_BLOCKS, CAND_BLOCK, torch.empty_like(masks[0]))
    masks[0].copy_(want_mask)
    want_fused = select.topk_fixed(scores[0].masked_fill(~want_mask, float("-inf")), vis, K_SEL, 0, tops[0].clone())
    for i in range(1, copies):
        masks[i].copy_(want_mask)
    nbytes = m * Lb * 2  # the scores, read once: the floor every variant shares

    variants = []  # (name, cfg, call(i), check() -> bool or None)
    rule = K._topk_shape(m, Lb)
    row_rule = K._topk_per_row(Lb)
    # (label, knobs): production, then the tiled passes at the tiled rule and the asked
    # tiles / warps, then one program per row at the asked warps
    shapes = [(f"rule: {'per row' if row_rule else f'tile={rule[0]} warps={rule[1]}'}", {})]
    if row_rule:
        shapes.append((f"tiled rule: tile={rule[0]} warps={rule[1]}", dict(per_row=False)))
    shapes += [
        (f"tile={t} warps={w}", dict(tile=t, num_warps=w, per_row=False))
        for t in tiles
        for w in warps
        if (t, w) != rule
    ]
    shapes += [(f"row warps={w}", dict(per_row=True, num_warps=w)) for w in row_warps if Lb <= K._ROW_LIMIT]
    for label, kw in shapes:
        variants.append(
            (
                "triton topk",
                label,
                lambda i, kw=kw: K.topk_fixed(scores[i % copies], vis, K_SEL, 0, tops[i % copies], **kw),
                lambda: torch.equal(tops[0], want_top),
            )
        )
        variants.append(
            (
                "triton topk+mask",
                label,
                lambda i, kw=kw: K.topk_fixed(
                    scores[i % copies], vis, K_SEL, 0, tops[i % copies], masks[i % copies], **kw
                ),
                lambda: torch.equal(tops[0], want_fused),
            )
        )
    variants.append(("torch.topk fp32", "", lambda i: torch.topk(scores[i % copies].float(), K_SEL, dim=-1), None))
    if not lean:
        variants += _twin_and_mask_variants(
            scores, vis, tops, masks, copies, want_top, want_mask, mask_tiles, mask_warps
        )

    rows = []
    for name, cfg, call, check in variants:
        row = dict(Lb=Lb, m=m, variant=name, cfg=cfg, copies=copies)
        try:
            tops[0].fill_(-7)
            if name.startswith("triton cand") or name.startswith("select.cand"):
                masks[0].fill_(True)  # poison: the mask variants must write every entry
            call(0)
            torch.cuda.synchronize()
            if check is not None and not check():
                row["error"] = "WRONG: differs from the torch twin"
            else:
                t = timer.time_graph([lambda j=j: call(j) for j in range(CALLS)])
                row.update(us=t.median_ms * 1e3, min_us=t.min_ms * 1e3, gbps=nbytes / (t.median_ms * 1e-3) / 1e9)
            masks[0].copy_(want_mask)  # the fused top-k reads copy 0: keep it the true mask
        except Exception as e:
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        status = row.get("error") or f"{row['us']:9.1f} us"
        print(f"Lb={Lb:8d} m={m:3d} {name:18s} {cfg:20s} {status}", flush=True)
    base = next((r["us"] for r in rows if r["variant"] == "torch.topk fp32" and "us" in r), None)
    for r in rows:
        if base and "us" in r:
            r["x_torch_topk"] = r["us"] / base
    return rows


def _twin_and_mask_variants(scores, vis, tops, masks, copies, want_top, want_mask, mask_tiles, mask_warps):
    """The torch twin of the top-k, then the candidate masks (Triton per tile and warps, torch)."""
    out = [
        (
            "select.topk_fixed",
            "",
            lambda i: select.topk_fixed(scores[i % copies], vis, K_SEL, 0, tops[i % copies]),
            lambda: torch.equal(tops[0], want_top),
        )
    ]
    for tb in mask_tiles:
        for w in mask_warps:
            kw = dict(tile_blocks=tb, tile_cols=max(tb, K._MASK_COLS), num_warps=w)
            out.append(
                (
                    "triton cand_mask",
                    f"blocks={tb} warps={w}",
                    lambda i, kw=kw: K.candidate_mask_fixed(
                        scores[i % copies], vis, CAND_BLOCKS, CAND_BLOCK, masks[i % copies], **kw
                    ),
                    lambda: torch.equal(masks[0], want_mask),
                )
            )
    out.append(
        (
            "select.cand_mask",
            "",
            lambda i: select.candidate_mask_fixed(scores[i % copies], vis, CAND_BLOCKS, CAND_BLOCK, masks[i % copies]),
            lambda: torch.equal(masks[0], want_mask),
        )
    )
    return out


def _print(rows: list[dict]) -> None:
    print("\n| Lb | m | variant | cfg | µs | min µs | × torch.topk | GB/s (scores once) |")
    print("|---:|---:|---|---|---:|---:|---:|---:|")
    for r in rows:
        if "us" in r:
            x = f"{r['x_torch_topk']:.2f}" if "x_torch_topk" in r else ""
            print(
                f"| {r['Lb']} | {r['m']} | {r['variant']} | {r.get('cfg', '')} | {r['us']:.1f} | "
                f"{r['min_us']:.1f} | {x} | {r['gbps']:.0f} |"
            )
        else:
            print(f"| {r['Lb']} | {r['m']} | {r['variant']} | {r.get('cfg', '')} | {r.get('error', '')} | | | |")


if __name__ == "__main__":
    sys.exit(main())
