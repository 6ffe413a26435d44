"""The batched decode step's two context-bound kernels timed alone, on the very inputs one
eager step hands them, under alternative launch shapes (CUDA only; a development tool).

One eager `BatchV41.step` of B sequences at a filled context (random weights, random index
keys, as `bench` (f) and scripts/step_profile.py) runs with `ops.sparse_attn_decode` and
`ops.index_scores_paged` wrapped to keep each one's arguments at the first layer that
calls it (small tensors cloned, the pools by reference). Then each launch shape is timed
in a CUDA graph with the L2 flushed before each replay (`Timer.time_graph`), and its
output compared byte for byte with the production shape's (`same`) and, for the
attention, against the reference order (`sparse_attn_split_torch`, max relative error).

    python3 scripts/batch_kernel_probe.py [--context 32768] [--batch 64] [--kv bf16,packed]
                                          [--single-keys 1048000]   # also index_scores at m = 1
                                          [--index-call 3]          # the step's 4th index call
                                                                    # (--batch 0: only that)

Prints one Markdown table; writes `$OUT/batch_kernel_probe.json` when OUT is set.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from attnv41.bench.batch import _random_keys  # noqa: E402
from attnv41.bench.common import Timer  # noqa: E402
from attnv41.kernels import indexer  # noqa: E402
from attnv41.kernels import sparse_attn_split as ss  # noqa: E402
from attnv41.kernels.indexer_gluon import index_scores_paged_gluon  # noqa: E402
from attnv41.kernels.sparse_attn import sparse_attn  # noqa: E402
from attnv41.kernels.sparse_attn_gluon import sparse_attn_gluon  # noqa: E402
from attnv41.runtime.batch import BatchV41  # noqa: E402
from attnv41.synthetic import PRESETS, random_weights, unit_rms_bf16  # noqa: E402
from attnv41.weights import AttnV41LayerWeights  # noqa: E402

ATTN = [
    ("production", {}),
    ("no rot", {"_no_rot": True}),
    ("logits only", {"only_logits": True}),
    ("comb_d=64 (before 2026-12-02)", dict(comb_d=64)),
    ("stages_b=2 (before 2026-12-02)", dict(stages_b=2)),
    ("blocks combine (BATCH_TUNE tiles)", dict(combine="blocks")),
    ("comb_d=256 w8", dict(comb_d=256, warps_b=8)),
    ("warps_b=8", dict(warps_b=8)),
    ("logits bh=64 dk=256", dict(dk=256)),
    ("logits st4", dict(stages_a=4)),
]
# `--attn-set heads`: the combine's head and column tiles (comb_h / comb_d / warps) and the
# logits kernel's head tile and chunk, around BATCH_TUNE (2026-12-03)
ATTN_SETS = {
    "default": ATTN,
    "heads": [
        ("production", {}),
        ("logits only", {"only_logits": True}),
        ("comb_h=32", dict(comb_h=32)),
        ("comb_h=32 comb_d=256 w8", dict(comb_h=32, comb_d=256, warps_b=8)),
        ("comb_h=32 comb_d=64", dict(comb_h=32, comb_d=64)),
        ("comb_h=16 comb_d=256", dict(comb_h=16, comb_d=256)),
        ("comb_h=16 comb_d=512 w8", dict(comb_h=16, comb_d=512, warps_b=8)),
        ("comb_h=32 st2", dict(comb_h=32, stages_b=2)),
        ("comb_h=64 comb_d=512 w8", dict(comb_d=512, warps_b=8)),
        ("logits bh=32", dict(bh=32)),
        ("logits dk=64", dict(dk=64)),
        ("logits w8", dict(warps_a=8)),
        ("logits bh=32 comb_h=32", dict(bh=32, comb_h=32)),
    ],
}
# `--attn-set logits`: the logits kernel's warps and stages (2026-12-03: packed rows' logits
# compile to 254 registers at 4 warps, 166 at 8), whole attention and logits alone
ATTN_SETS["logits"] = (
    [("production", {}), ("logits only", {"only_logits": True})]
    + [
        (
            f"logits w={w} st={st}{' (only)' if only else ''}",
            dict(warps_a=w, stages_a=st, **({"only_logits": True} if only else {})),
        )
        for w, st in ((8, 3), (8, 1), (4, 1), (4, 2), (8, 2))
        for only in (False, True)
    ]
    + [
        ("_TUNE", dict(ss._TUNE)),
        ("_TUNE logits w=8", dict(ss._TUNE, warps_a=8)),
        ("_TUNE logits w=8 st=1", dict(ss._TUNE, warps_a=8, stages_a=1)),
    ]
)
# `--attn-set single`: the single-sequence shape (`_TUNE`, what a batch-1 call takes) with
# other logits tiles: head blocks of 16 / 32 (4 / 2 times the programs), warps, stages
# `--attn-set glogits` (fifty-first entry): the logits over packed rows by the Gluon kernel
# (`sparse_attn_split`'s `gluon_logits`: the rows straight into the MMA's A fragment), whole
# attention and logits alone
ATTN_SETS["glogits"] = [
    ("production", {}),
    ("logits only", {"only_logits": True}),
    ("gluon logits", {"gluon_logits": True}),
    ("gluon logits (only)", {"gluon_logits": True, "only_logits": True}),
] + [
    (f"gluon logits q_stages={qs} cap={cap}{' (only)' if only else ''}",
     {"gluon_logits": dict(q_stages=qs, maxnreg=cap), **({"only_logits": True} if only else {})})
    for qs, cap in ((2, None), (2, 128), (0, 128), (2, 96))
    for only in (False, True)
]  # fmt: skip
# `--attn-set gluon` (2026-12-04, fifteenth entry): the one-pass Gluon kernel
# (`kernels/sparse_attn_gluon.py`, the same bytes) against the Triton kernels on a step's inputs.
ATTN_SETS["gluon"] = [
    ("Triton BATCH_TUNE", {}),
    ("gluon", {"_gluon": True}),
    ("gluon nsplit 4", {"_gluon": True, "nsplit": 4}),
    ("gluon without pdl", {"_gluon": True, "pdl": False}),
]
ATTN_SETS["production"] = [("production", {})]  # the index scores' sets beside one attention row
ATTN_SETS["single"] = [("production", {}), ("_TUNE", dict(ss._TUNE))] + [
    (f"_TUNE logits bh={bh} w={w} st={st}", dict(ss._TUNE, bh=bh, warps_a=w, stages_a=st))
    for bh, w, st in ((32, 4, 3), (16, 4, 3), (16, 2, 3), (16, 4, 2), (16, 2, 2), (32, 2, 3))
]
# `--attn-set asm` (2026-12-03, ninth entry): the packed fp4 rows dequantized by PTX into
# bf16 (`packed_rows.fp4_rows_bf16`, production) against the fp32 form (`fp4_asm=False`),
# with the logits kernel's column chunk (dk) and per-format dots
ATTN_SETS["asm"] = [
    ("production", {}),
    ("fp32 dequant", dict(fp4_asm=False)),
    ("logits only", {"only_logits": True}),
    ("logits only, fp32 dequant", {"only_logits": True, "fp4_asm": False}),
    ("dk=64", dict(dk=64)),
    ("dk=64 fmt_dots", dict(dk=64, fmt_dots=True)),
    ("dk=32 fmt_dots", dict(dk=32, fmt_dots=True)),
    ("dk=32 fmt_dots, fp32 dequant", dict(dk=32, fmt_dots=True, fp4_asm=False)),
    ("dk=128 fmt_dots", dict(fmt_dots=True)),
]
# `--attn-set keysm` (2026-12-03, tenth entry): the logits as rows · qᵀ (`keys_m`: the rows
# the MMA's A operand, no transposed tile in shared memory) and the PTX dequantization with
# its scales loaded per 16-value block (no 16-bit shared stores in the offline compile),
# at the batched shape (B > 1) and at the batched runtime's m = 1 shape (`_TUNE`, bh = 16)
_SMALL = dict(ss._TUNE, **ss._BATCH_SMALL_TUNE)
ATTN_SETS["keysm"] = [
    ("production", {}),
    ("fp4_asm", dict(fp4_asm=True)),
    ("keys_m", dict(keys_m=True)),
    ("keys_m fp4_asm", dict(keys_m=True, fp4_asm=True)),
    ("keys_m fp4_asm dk_packed=64", dict(keys_m=True, fp4_asm=True, dk_packed=64)),
    ("m=1 shape", _SMALL),
    ("m=1 shape fp4_asm", dict(_SMALL, fp4_asm=True)),
    ("m=1 shape keys_m", dict(_SMALL, keys_m=True)),
    ("m=1 shape keys_m fp4_asm", dict(_SMALL, keys_m=True, fp4_asm=True)),
]
# `--attn-set lut` (thirty-fourth entry): the packed fp4 rows by the table-lookup PTX
# (`lut`, the same bytes), the whole attention and the logits kernel alone
ATTN_SETS["lut"] = [
    ("production", {}),
    ("lut", dict(lut=True)),
    ("logits only", {"only_logits": True}),
    ("logits only, lut", {"only_logits": True, "lut": True}),
]


# `--attn-set loops` (thirty-fourth entry): the logits kernel's chunk loop per row format
# (`fmt_loops`: packed rows' loads pipelined), the whole attention and the logits alone
ATTN_SETS["loops"] = [
    ("production", {}),
    ("fmt_loops", dict(fmt_loops=True)),
    ("fmt_loops cap 128", dict(fmt_loops=True, maxnreg_a_packed=128)),
    ("fmt_loops 3 stages", dict(fmt_loops=True, stages_a=3)),
    ("logits only", {"only_logits": True}),
    ("logits only, fmt_loops", {"only_logits": True, "fmt_loops": True}),
    ("logits only, fmt_loops cap 128", {"only_logits": True, "fmt_loops": True, "maxnreg_a_packed": 128}),
]


class _Skip(Exception):
    """A row that does not apply to this cache format."""


# The index scores' launch shapes (2026-12-03): production against the keys-major
# orientation (`keys_m`: keys as the MMA's 64 rows, a warpgroup MMA at 4 warps, the heads'
# sum within a thread and its quad) at several tiles. The earlier heads-major sweeps
# (BENCHMARKS.md, 2026-12-02 eighth entry) chose production's 4 blocks, 2 warps, 2 stages.
INDEX = [("production", {})] + [
    (
        f"{'keys_m ' if km else ''}bl={bl} sub={sub} w={w} st={st}",
        dict(keys_m=km, block_l=bl, sub=sub, num_warps=w, num_stages=st),
    )
    for km, bl, sub, w, st in (
        (False, 64, 1, 4, 3),
        (True, 64, 4, 2, 2),
        (True, 64, 4, 4, 2),
        (True, 64, 4, 4, 3),
        (True, 64, 1, 4, 3),
        (True, 64, 2, 4, 2),
        (True, 64, 8, 4, 2),
        (True, 128, 2, 4, 2),
        (True, 128, 2, 8, 2),
        (True, 128, 1, 4, 3),
    )
]

# `--index-set asm`: packed keys dequantized by PTX (production) against the fp32 form
INDEX_SETS = {"default": INDEX, "asm": [("production", {}), ("fp32 dequant", dict(fp4_asm=False))]}
# `--index-set inner` (twelfth entry): the epilogue's inner roundings with the NaN select
# (before), and register caps over packed keys
INDEX_SETS["inner"] = [
    ("production", {}),
    ("nan-select", dict(inner_cvt=False)),
    ("cap 80", dict(maxnreg_packed=80)),
    ("cap 64", dict(maxnreg_packed=64)),
    ("sub 4 cap 80", dict(sub=4, maxnreg_packed=80)),
    ("scale tile", dict(scale_word=False)),
    ("uncapped", dict(maxnreg_packed=None)),
]


# `--index-set lut` (thirty-third entry): packed keys by the table-lookup PTX, the epilogue
# in bf16 pairs, both, and both with other register caps
INDEX_SETS["lut"] = [
    ("production", {}),
    ("lut", dict(lut=True)),
    ("epi2", dict(epi2=True)),
    ("lut epi2", dict(lut=True, epi2=True)),
    ("lut epi2 cap 88", dict(lut=True, epi2=True, maxnreg_packed=88)),
    ("lut epi2 uncapped", dict(lut=True, epi2=True, maxnreg_packed=None)),
]
# `--index-set pipe` (thirty-fourth entry): the key loads pipelined (no per-block branch:
# skip=False; `skip_program`, measured slower in the thirty-fifth entry, removed)
INDEX_SETS["pipe"] = [
    ("production", {}),
    ("noskip", dict(skip=False)),
    ("noskip 3 stages", dict(skip=False, num_stages=3)),
]
# `--index-set gluon` (forty-eighth entry): packed keys through `indexer_gluon` (cp.async stages),
# blocks per program × stages (bf16 keys: an error row, the kernel takes packed keys only)
INDEX_SETS["gluon"] = [("production", {})] + [
    (f"gluon sub={sb} st={st} cap={cap}{' mid' if mid else ''}", dict(_gluon=True, sub=sb, stages=st, maxnreg=cap, mid=mid))
    for sb, st, cap, mid in (
        (8, 4, None, False), (8, 4, None, True), (4, 3, None, False), (8, 3, None, False), (8, 4, 80, False),
        (16, 4, None, False), (16, 6, None, False), (16, 6, None, True), (32, 6, None, False), (8, 2, None, False),
    )
]  # fmt: skip
# `--index-set oneword` (forty-ninth entry): the Gluon kernel converting one code word per
# thread in the copies' layout (`one_word`: no bank conflicts on the words' loads and the
# tile's stores), against production and the four-words form at the same shapes
INDEX_SETS["oneword"] = [("production", {})] + [
    (f"gluon{' one_word' if ow else ''} sub={sb} st={st} cap={cap}{' mid' if mid else ''}",
     dict(_gluon=True, sub=sb, stages=st, maxnreg=cap, mid=mid, one_word=ow))
    for sb, st, cap, mid, ow in (
        (8, 4, None, False, False), (16, 4, None, False, False),
        (8, 4, None, False, True), (8, 4, None, True, True), (16, 4, None, False, True), (16, 6, None, True, True),
        (8, 2, None, False, True), (4, 2, None, False, True), (8, 3, 80, False, True), (32, 6, None, False, True),
    )
]  # fmt: skip
# `--index-set direct` (forty-ninth entry): the Gluon kernel's `stages = 0` form (the code
# words loaded straight into registers one per thread, no cp.async, 24.7 KiB of shared memory)
INDEX_SETS["direct"] = [("production", {})] + [
    (f"gluon direct sub={sb} cap={cap}", dict(_gluon=True, sub=sb, stages=0, maxnreg=cap))
    for sb, cap in ((8, None), (8, 80), (8, 72), (4, 80), (16, 80), (2, 80), (1, 80), (4, 72))
]
# `--index-set afrag` (fifty-first entry): the Gluon kernel's keys straight into the MMA's A
# fragment (`afrag`: the code words loaded in the fragment's layout, a byte transpose within
# each quad, no shared-memory tile), with the scores stored from the head sum's layout
# (`slice_out`), against production and the direct one-word form
INDEX_SETS["afrag"] = [("production", {}), ("gluon direct sub=8 cap=80", dict(_gluon=True, sub=8, stages=0, maxnreg=80))] + [
    (f"gluon afrag sub={sb} cap={cap}{' slice_out' if so else ''}{' row0' if r0 else ''}",
     dict(_gluon=True, sub=sb, stages=0, maxnreg=cap, afrag=True, slice_out=so, row0=r0))
    for sb, cap, so, r0 in (
        (8, None, False, False), (8, None, True, False), (8, None, True, True), (1, None, True, False),
        (2, None, True, False), (4, None, True, False), (16, None, True, False), (32, None, True, False),
        (8, 80, True, False), (4, 64, True, True),
    )
] + [
    (f"gluon afrag sub={sb} slice_out ahead{' row0' if r0 else ''}",
     dict(_gluon=True, sub=sb, stages=0, afrag=True, slice_out=True, row0=r0, ahead=True))
    for sb, r0 in ((8, False), (8, True), (4, True), (16, True))
]  # fmt: skip
# `--index-set oneword1`: production and the default one_word shape alone (for Nsight Compute)
INDEX_SETS["oneword1"] = [INDEX_SETS["oneword"][0], INDEX_SETS["oneword"][3]]
# `--index-set l1` (forty-eighth entry): the keys as the MMA's B operand (keys_m=False: read from
# shared memory by the MMA, no shared-to-register load of the tile) at several tiles, against
# production (keys_m=True, whose tile makes a shared-memory round trip); another fp32 order
# of the head sums, so `same` compares with the first row of the same orientation only
INDEX_SETS["l1"] = [
    ("production", {}),
    ("keys_m=False sub=1 w=4 st=3", dict(keys_m=False, sub=1, sub_packed=1, num_warps=4, num_stages=3)),
    ("keys_m=False sub=4 w=4 st=2", dict(keys_m=False, sub=4, sub_packed=4, num_warps=4, num_stages=2)),
    ("keys_m=False sub=4 w=2 st=2", dict(keys_m=False, sub=4, sub_packed=4, num_warps=2, num_stages=2)),
    ("keys_m=False sub=2 w=4 st=2 uncapped", dict(keys_m=False, sub=2, sub_packed=2, maxnreg_packed=None)),
    ("production st=1", dict(num_stages=1)),
]
# `--index-set rows` (fiftieth entry): the Triton kernel's code words one per thread
# (`one_word`: the load over the transposed tensor; `row0`: a block's rows as the first
# one's pointer plus offsets, the table entry read once, which gives the same layout) against
# production's four words per thread, and row0 at other blocks per program and caps
INDEX_SETS["rows"] = [
    ("production", {}),
    ("one_word", dict(one_word=True)),
    ("row0", dict(row0=True)),
    ("row0 one_word", dict(row0=True, one_word=True)),
    ("row0 sub 2", dict(row0=True, sub_packed=2)),
    ("row0 sub 8", dict(row0=True, sub_packed=8)),
    ("row0 cap 72", dict(row0=True, maxnreg_packed=72)),
    ("row0 uncapped", dict(row0=True, maxnreg_packed=None)),
]
# `--index-set row0`: row0 alone (for Nsight Compute)
INDEX_SETS["row0"] = [("row0", dict(row0=True))]
# `--index-set production`: production alone (e.g. under Nsight Compute, after the step's own calls)
INDEX_SETS["production"] = [("production", {})]


def _clone(v):
    return v.clone() if isinstance(v, torch.Tensor) and v.numel() < (1 << 24) else v


def _single_index(L: int, kvs, dev, timed, shapes=INDEX) -> list[dict]:
    """`index_scores` of one token over L keys (the single-sequence decode's call, Flash
    index geometry: 32 heads × 128), bf16 and packed keys on the fp4 grid, per INDEX shape."""
    from attnv41.packed import pack  # noqa: PLC0415
    from attnv41.reference.qdq import fp4_e8m0_qdq  # noqa: PLC0415

    gen = torch.Generator(device=dev).manual_seed(11)
    H, d = 32, 128
    iq = torch.randn(1, H, d, generator=gen, device=dev).to(torch.bfloat16)
    w = torch.randn(1, H, generator=gen, device=dev).to(torch.bfloat16)
    vis = torch.full((1,), L, dtype=torch.int32, device=dev)
    keys = torch.empty(L, d, dtype=torch.bfloat16, device=dev)
    for a in range(0, L, 1 << 16):  # in slices: the fp32 temporaries stay small
        b = min(L, a + (1 << 16))
        keys[a:b] = fp4_e8m0_qdq(torch.randn(b - a, d, generator=gen, device=dev).to(torch.bfloat16))
    rows = []
    for kvf in kvs:
        kk = keys if kvf == "bf16" else pack(keys, "fp4_e8m0", check=False)
        base = None
        for name, tune in shapes:
            out = torch.empty(1, L, dtype=torch.bfloat16, device=dev)
            try:
                call = partial(
                    indexer.index_scores, iq, w, kk, vis, out=out, **({**indexer._TUNE, **tune} if tune else {})
                )
                call()
                t = timed(call)
                base = out.clone() if base is None else base
                r = dict(
                    kv=kvf,
                    kernel=f"index_scores m=1 L={L}",
                    config=name,
                    us=t.median_ms * 1e3,
                    same=bool(torch.equal(out, base)),
                    ndiff=int((out.view(torch.int16) != base.view(torch.int16)).sum()),
                )
            except Exception as ex:  # one shape failing must not stop the probe
                r = dict(
                    kv=kvf, kernel=f"index_scores m=1 L={L}", config=name, error=f"{type(ex).__name__}: {str(ex)[:160]}"
                )
            rows.append(r)
            print(r, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--kv", default="bf16,packed")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument(
        "--index-call",
        type=int,
        default=0,
        help="time the step's N-th index_scores_paged call (0: the first index source's; the Flash preset's "
        "sources have compress ratios 2 (layers 2-14: calls 0-2) and 1 (layers 20-36: calls 3-7), so other widths)",
    )
    ap.add_argument("--preset", default="flash")
    ap.add_argument(
        "--single-keys",
        type=int,
        default=0,
        help="L > 0: also the single-sequence index_scores (m = 1) over L random keys, per launch shape",
    )
    ap.add_argument("--no-index", action="store_true", help="time the attention only")
    ap.add_argument("--index-set", default="default", choices=sorted(INDEX_SETS), help="the index scores' shapes")
    ap.add_argument("--attn-set", default="default", choices=sorted(ATTN_SETS), help="the attention's launch shapes")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1 (no timing meaning)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    timer = Timer(dev, flush_l2=True)

    def timed(fn):
        return timer.time_graph([fn], reps=args.reps) if cuda else timer.time(fn, warmup=0, reps=1)

    rows = []
    B, ctx = args.batch, args.context
    if args.single_keys > 0:
        rows += _single_index(args.single_keys, args.kv.split(","), dev, timed, INDEX_SETS[args.index_set])
    for kvf in args.kv.split(",") if B > 0 else []:
        cfg = PRESETS[args.preset](max_tokens=B, max_seq=ctx + 64)
        weights = [
            AttnV41LayerWeights.from_state_dict(cfg.roles[i], w, cfg=cfg, device=dev)
            for i, w in enumerate(random_weights(cfg, 0, dev))
        ]
        gen = torch.Generator(device=dev).manual_seed(7)
        bt = BatchV41(cfg, dev, n_slots=B, kv_format=kvf)
        for sl in range(B):
            bt.pool.assume(sl, ctx)
        _random_keys(bt, gen)
        rec = {}

        seen = {"attn": 0, "index": 0}
        want = {"attn": 0, "index": args.index_call}

        def keep(name, fn, rec=rec, seen=seen, want=want):
            def wrapped(*pa, **pk):
                if name not in rec and (name != "attn" or pa[2].shape[0] > 0):
                    seen[name] += 1
                    if seen[name] == want[name] + 1:
                        rec[name] = (
                            [_clone(v) for v in pa],
                            {
                                k2: (tuple(map(_clone, v)) if isinstance(v, tuple) else _clone(v))
                                for k2, v in pk.items()
                            },
                        )
                return fn(*pa, **pk)

            return wrapped

        bt.ops = dataclasses.replace(
            bt.ops,
            sparse_attn_decode=keep("attn", bt.ops.sparse_attn_decode),
            index_scores_paged=keep("index", bt.ops.index_scores_paged),
        )
        xs = unit_rms_bf16(torch.randn(cfg.n_layers, B, cfg.dim, generator=gen, device=dev))
        bt.step(weights, list(xs), list(range(B)), [ctx] * B, [1] * B, keep=False)  # one input per layer
        timer.sync()
        print(f"{kvf}: recorded {sorted(rec)}", flush=True)

        a, k = rec["attn"]
        q, win, comp, sel, offset, sink, scale = a
        ref = ss.sparse_attn_split_torch(q, win, comp, sel, offset, sink, scale)
        base = None
        for name, tune in ATTN_SETS[args.attn_set]:
            tune = dict(tune)
            no_rot = tune.pop("_no_rot", False)
            kw = {} if no_rot else {"rot": k["rot"]}
            out = torch.empty_like(q)
            gluon = tune.pop("_gluon", False)
            try:
                if gluon:
                    call = partial(sparse_attn_gluon, q, win, comp, sel, offset, sink, scale, out=out, **kw, **tune)
                    tune = {}
                else:
                    call = partial(
                        ss.sparse_attn_split, q, win, comp, sel, offset, sink, scale, out=out, **kw,
                        **{**ss.BATCH_TUNE, **tune},
                    )  # fmt: skip

                call()
                timer.sync()
                t = timed(call)
                r = dict(kv=kvf, kernel="sparse_attn_batch", config=name, us=t.median_ms * 1e3)
                if not tune.get("only_logits"):
                    r["err"] = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
                    r["finite"] = bool(torch.isfinite(out.float()).all())
                    if base is None:
                        base = out.clone()
                    r["same"] = bool(torch.equal(out, base))
            except Exception as ex:  # one shape failing must not stop the probe
                r = dict(kv=kvf, kernel="sparse_attn_batch", config=name, error=f"{type(ex).__name__}: {str(ex)[:160]}")
            rows.append(r)
            print(r, flush=True)
        try:  # the prefill regime's fused kernel on the same inputs (bf16 rows: it reads no packed ones)
            if kvf == "packed":
                raise _Skip
            out = torch.empty_like(q)

            fused = partial(sparse_attn, q, win, comp, sel, offset, sink, scale, out=out)

            fused()
            t = timed(fused)
            rows.append(dict(kv=kvf, kernel="sparse_attn (fused)", config="prefill regime", us=t.median_ms * 1e3))
        except _Skip:
            pass
        except Exception as ex:
            rows.append(dict(kv=kvf, kernel="sparse_attn (fused)", config="prefill regime", error=str(ex)[:160]))
        print(rows[-1], flush=True)

        a, k = rec["index"]
        base = None
        for name, tune in [] if args.no_index else INDEX_SETS[args.index_set]:
            try:
                out = torch.empty(a[0].shape[0], a[7], dtype=torch.bfloat16, device=dev)

                tune = dict(tune)
                if tune.pop("_gluon", False):
                    icall = partial(index_scores_paged_gluon, *a[:8], out=out, **tune)
                else:
                    icall = partial(indexer.index_scores_paged, *a, out=out, **tune)

                icall()
                timer.sync()
                t = timed(icall)
                if base is None:
                    base = out.clone()
                r = dict(
                    kv=kvf,
                    kernel="index_scores_paged",
                    config=name,
                    us=t.median_ms * 1e3,
                    same=bool(torch.equal(out, base)),
                    ndiff=int((out.view(torch.int16) != base.view(torch.int16)).sum()),
                )
            except Exception as ex:
                r = dict(
                    kv=kvf, kernel="index_scores_paged", config=name, error=f"{type(ex).__name__}: {str(ex)[:160]}"
                )
            rows.append(r)
            print(r, flush=True)
        m, width = a[0].shape[0], a[7]
        print(f"{kvf}: index m={m} width={width} keys {tuple(a[2].shape)} {a[2].dtype}", flush=True)
        del bt, weights, a, k
        if cuda:
            torch.cuda.empty_cache()
    what = (f"batched step at context {ctx}, batch {B}" if B > 0 else "") + (
        f"{'; ' if B > 0 else ''}single-sequence index scores over {args.single_keys} keys"
        if args.single_keys > 0
        else ""
    )
    print(f"\n### kernels alone ({what}; CUDA graph, L2 flushed)\n")
    print("| kv | kernel | config | µs | same bits | max rel err |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['kv']} | {r['kernel']} | {r['config']} | error: {r['error']} | | |")
        else:
            err = f"{r['err']:.2g}" if "err" in r else "-"
            same = r.get("same", "-") if r.get("same", True) else f"False ({r['ndiff']} entries)"
            print(f"| {r['kv']} | {r['kernel']} | {r['config']} | {r['us']:.1f} | {same} | {err} |")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "batch_kernel_probe.json"), "w") as f:
            json.dump(dict(context=ctx, batch=B, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
