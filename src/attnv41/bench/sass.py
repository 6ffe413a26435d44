"""The decode kernels compiled for sm_90 without a GPU: registers, shared and local memory,
SASS opcode counts and the Triton GPU IR of each launch, from Triton's bundled `ptxas` and
`cuobjdump`. For checks that cost no device time (`tests/kernels/test_gemv_sass.py`,
`tests/kernels/test_sparse_attn_sass.py`) and for refactors of kernel code: dump the SASS
of two trees and diff it (identical SASS, identical behaviour on the GPU).

    python -m attnv41.bench.sass gemv --K 1280 --N 32768 --dtype fp8
    python -m attnv41.bench.sass attn --m 1 --combine auto --dump /tmp/sass-new
    python -m attnv41.bench.sass attn --packed    # over packed rows; `index [--packed]`: index scores
    python -m attnv41.bench.sass attn --pdl       # as launched under programmatic dependent launch
    python -m attnv41.bench.sass tc --dtype fp8 --rope   # the batched projections over q's latent
    python -m attnv41.bench.sass topk --neg-inf-past      # the radix top-k and candidate mask
    python -m attnv41.bench.sass tcfp8 --N 5120 --K 8192 --tune '{"stages": 3}'  # the Gluon FP8 linear
    # the same from another revision's tree, then diff the two folders:
    git worktree add /tmp/rev REV && PYTHONPATH=/tmp/rev/src python -m attnv41.bench.sass attn --dump /tmp/sass-old

Triton compiles for the active driver's target: inside `compile_only()` a stand-in driver
names the H200's (CUDA, sm_90, warp 32), every Triton launch compiles instead of running
(`warmup`) and is recorded, and the kernels' host-side device checks and arrival-counter
buffers accept CPU tensors. Needs a process where Triton is not interpreting
(`TRITON_INTERPRET` unset): the tests run it in a subprocess.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

import torch

__all__ = [
    "compile_only",
    "report",
    "gemv_launches",
    "attn_launches",
    "index_launches",
    "tc_launches",
    "tcfp8_launches",
    "topk_launches",
]


def _bin(name: str) -> str:
    import triton  # noqa: PLC0415

    found = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name))
    if not found:
        raise RuntimeError(f"{name} not found in Triton's nvidia backend (a Triton wheel without it?)")
    return found[0]


@contextlib.contextmanager
def compile_only(pdl: bool = False):
    """Within: Triton launches compile for sm_90 and are appended to the yielded list as
    (kernel name, CompiledKernel) instead of running; attnv41's kernel wrappers take CPU
    tensors (their `require_triton` device check and arrival counters are stood in for).
    `pdl`: the kernels compile as launched with programmatic dependent launch (their
    `pdl_launch` answers on, as on an H200 with `ATTNV41_PDL` unset), else without."""
    import triton.runtime.jit as jit  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.runtime import driver  # noqa: PLC0415

    from .. import kernels  # noqa: PLC0415
    from ..kernels import _triton  # noqa: PLC0415

    if _triton.interpreting():
        raise RuntimeError("compile_only: TRITON_INTERPRET is set; compile in a process without it")

    class _Sm90:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self):
            return torch.device("cpu")

        def is_active(self):
            return True

    launches: list = []
    run = jit.JITFunction.run

    def compile_run(self, *args, grid, warmup, **kwargs):
        k = run(self, *args, grid=grid, warmup=True, **kwargs)
        launches.append((self.fn.__name__, k))
        return k

    import importlib  # noqa: PLC0415
    import pkgutil  # noqa: PLC0415

    mods = [importlib.import_module(f"{kernels.__name__}.{m.name}") for m in pkgutil.iter_modules(kernels.__path__)]
    patched = [(m, m.require_triton) for m in mods if hasattr(m, "require_triton")]
    pdl_mods = [(m, m.pdl_launch) for m in mods if pdl and hasattr(m, "pdl_launch")]
    sm90_mods = [(m, m._on_sm90) for m in mods if hasattr(m, "_on_sm90")]  # device predicates of Gluon options
    buffer = _triton.ArrivalCounters.buffer
    saved = driver._active  # None until first use; reset_active() would build the CUDA driver
    driver.set_active(_Sm90())
    jit.JITFunction.run = compile_run
    for m, _ in patched:
        m.require_triton = lambda *a: None
    for m, _ in pdl_mods:
        m.pdl_launch = lambda t: {"PDL": True, "launch_pdl": True}
    for m, _ in sm90_mods:
        m._on_sm90 = lambda t: True
    _triton.ArrivalCounters.buffer = lambda self, device: torch.zeros(self.size, dtype=torch.int32)
    try:
        yield launches
    finally:
        driver._active = saved
        jit.JITFunction.run = run
        for m, f in patched:
            m.require_triton = f
        for m, f in pdl_mods:
            m.pdl_launch = f
        for m, f in sm90_mods:
            m._on_sm90 = f
        _triton.ArrivalCounters.buffer = buffer


def report(kernel, sass_lines: bool = False) -> dict:
    """A compiled kernel's `{"regs", "smem", "local", "ops", "dyn_smem"}` (SASS opcode
    counts; smem the static shared memory, dyn_smem all the launch asks for), with
    `sass` (instructions without addresses, for diffs) when asked; `ttgir` always."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run([_bin("cuobjdump"), "--dump-resource-usage", path], capture_output=True, text=True)
        sass = subprocess.run([_bin("cuobjdump"), "--dump-sass", path], capture_output=True, text=True)
    if usage.returncode or sass.returncode:
        raise RuntimeError(f"cuobjdump failed: {usage.stderr}{sass.stderr}")
    res = re.search(r"REG:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", usage.stdout)
    ops: Counter = Counter()
    lines = []
    for line in sass.stdout.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+((?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)[^;]*);", line)
        if m:
            ops[m.group(2)] += 1
            lines.append(m.group(1).strip())
    out = dict(regs=int(res.group(1)), smem=int(res.group(2)), local=int(res.group(3)), ops=dict(ops))
    out["dyn_smem"] = int(kernel.metadata.shared)  # bytes of shared memory the launch asks for
    out["ttgir"] = kernel.asm["ttgir"]
    if sass_lines:
        out["sass"] = lines
    return out


def gemv_launches(K: int, Ns: list[int], dtype: str, m: int = 1, xq: bool = False) -> list:
    """The `gemv` launch of x `[m, K]` against weights `[N, K]` for each N in Ns (dtype
    "bf16", "fp32" or "fp8": e4m3 with e8m0 scales; `xq`: fp8 weights read the input's
    round trip made outside), compiled: [(name, kernel)]."""
    from ..kernels import gemv as G  # noqa: PLC0415

    dt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}[dtype]
    x = torch.zeros(m, K, dtype=torch.bfloat16)
    ws, outs, scales = [], [], []
    for N in Ns:
        if dt == torch.float8_e4m3fn:
            ws.append(torch.zeros(N, K, dtype=torch.uint8).view(dt))
            scales.append(torch.zeros(-(-N // 32), K // 32, dtype=torch.uint8))
            outs.append(torch.zeros(m, N, dtype=torch.bfloat16))
        else:
            ws.append(torch.zeros(N, K, dtype=dt))
            scales.append(None)
            outs.append(torch.zeros(m, N, dtype=dt))
    with compile_only() as launches:
        G.gemv(x, tuple(ws), tuple(outs), tuple(scales), xq=torch.zeros_like(x) if xq else None)
    return launches


def attn_launches(
    m: int = 1,
    combine: str = "auto",
    rot: bool = True,
    packed: bool = False,
    tune=None,
    pdl: bool = False,
    gluon: bool = False,
    heads: int = 64,
    dim: int = 512,
    width: int = 640,
) -> list:
    """The decode attention (`sparse_attn_split`, or with `gluon` the one-pass Gluon kernel
    `sparse_attn_gluon`) at the Flash shapes (64 heads × 512, 640 entries: window 128 +
    top-k 512; `heads`, `dim`, `width` change them), m tokens, over bf16 or packed rows,
    with `tune`'s launch shape (the function's tuning keywords), compiled: [(name, kernel)]."""
    from ..kernels.sparse_attn_gluon import sparse_attn_gluon  # noqa: PLC0415
    from ..kernels.sparse_attn_split import sparse_attn_split  # noqa: PLC0415
    from ..packed import row_bytes  # noqa: PLC0415

    H, D, K, W, half = heads, dim, width, 128, min(32, dim // 8)
    bf = torch.bfloat16
    q, win, comp = torch.zeros(m, H, D, dtype=bf), torch.zeros(W, D, dtype=bf), torch.zeros(4096, D, dtype=bf)
    if packed:
        win = torch.zeros(W, row_bytes("fp8_e8m0", D), dtype=torch.uint8)
        comp = torch.zeros(4096, row_bytes("fp4_e4m3", D), dtype=torch.uint8)
    sel, sink = torch.zeros(m, K, dtype=torch.int32), torch.zeros(H, dtype=torch.float32)
    tables = (torch.zeros(64, half), torch.zeros(64, half), torch.zeros(m, dtype=torch.int32), torch.zeros_like(q))
    with compile_only(pdl=pdl) as launches:
        if gluon:
            sparse_attn_gluon(q, win, comp, sel, W, sink, D**-0.5, rot=tables if rot else None, **(tune or {}))
        else:
            sparse_attn_split(
                q, win, comp, sel, W, sink, D**-0.5, rot=tables if rot else None, **{"combine": combine, **(tune or {})}
            )
    return launches


def index_launches(
    m: int = 1,
    L: int = 1 << 20,
    packed: bool = False,
    tune: dict | None = None,
    paged: int = 0,
    gluon: bool = False,
    heads: int = 32,
    gather: int = 0,
) -> list:
    """Index scores (`indexer.index_scores`) at the Flash shapes (32 heads × 128) over L
    keys, bf16 or packed (fp4_e8m0 rows), m tokens, with the launch shape's overrides
    `tune` (keys of `indexer._TUNE`), compiled: [(name, kernel)]. paged = B > 0: the
    batched runtime's `index_scores_paged` over a pool of blocks of B rows instead; with
    gluon, `indexer_gluon.index_scores_paged_gluon` (packed keys; `tune`: its keys); gather
    = cb > 0: the gathered form over candidate blocks of cb rows."""
    from ..kernels.indexer import index_scores, index_scores_paged  # noqa: PLC0415
    from ..kernels.indexer_gluon import index_scores_paged_gluon  # noqa: PLC0415
    from ..packed import row_bytes  # noqa: PLC0415

    H, d = heads, 128
    bf = torch.bfloat16
    keys = torch.zeros(L, row_bytes("fp4_e8m0", d), dtype=torch.uint8) if packed else torch.zeros(L, d, dtype=bf)
    iq, w, vis = torch.zeros(m, H, d, dtype=bf), torch.zeros(m, H, dtype=bf), torch.zeros(m, dtype=torch.int32)
    with compile_only() as launches:
        if paged:
            table = torch.zeros(m, -(-L // paged), dtype=torch.int32)
            slot = torch.arange(m, dtype=torch.int32)
            fn = index_scores_paged_gluon if gluon else index_scores_paged
            g = dict(ids=torch.zeros(m, L // gather, dtype=torch.int32), cand_block=gather) if gather else {}
            fn(iq, w, keys, table, slot, paged, vis, L, **g, **(tune or {}))
        else:
            index_scores(iq, w, keys, vis, **(tune or {}))
    return launches


def topk_launches(
    m: int = 64, Lb: int = 1 << 20, k: int = 512, neg_inf_past: bool = False, tile=None, warps=None
) -> list:
    """The radix top-k (`topk.topk_fixed`, with and without a candidate mask) and the
    candidate mask (`topk.candidate_mask_fixed`, blocks of 64) over m rows of Lb scores,
    compiled: [(name, kernel)] (a kernel compiled twice appears twice). tile, warps: the
    top-k's tuning knobs (None: production)."""
    from ..kernels.topk import candidate_mask_fixed, topk_fixed  # noqa: PLC0415

    scores, vis = torch.zeros(m, Lb, dtype=torch.bfloat16), torch.zeros(m, dtype=torch.int32)
    out, keep = torch.zeros(m, k, dtype=torch.int32), torch.zeros(m, Lb, dtype=torch.bool)
    opt = dict(neg_inf_past=True) if neg_inf_past else {}  # (a tree from before the option compiles too)
    if tile is not None or warps is not None:
        opt.update(tile=tile, num_warps=warps)
    with compile_only() as launches:
        topk_fixed(scores, vis, k, 0, out, **opt)
        topk_fixed(scores, vis, k, 0, out, keep, **opt)
        candidate_mask_fixed(scores, vis, 512, 64, keep)
    return launches


def tc_launches(m: int = 64, dtype: str = "bf16", rope: bool = False) -> list:
    """The batched runtime's pass over q's latent (`tc_mm.mm_many_batch`: wq_b [32768, 1280]
    and indexer.wq_b [4096, 1280] in one launch, bf16 or FP8 weights), m tokens, with q's
    RoPE in the store when asked (heads of 512, a 64-value tail), compiled: [(name, kernel)]."""
    from ..kernels import tc_mm as TC  # noqa: PLC0415

    K, bf = 1280, torch.bfloat16
    x = torch.zeros(m, K, dtype=bf)
    shapes = ((32768, K), (4096, K))
    if dtype == "fp8":
        ws = tuple(torch.zeros(n, k, dtype=torch.uint8).view(torch.float8_e4m3fn) for n, k in shapes)
        scales = tuple(torch.zeros(-(-n // 32), k // 32, dtype=torch.uint8) for n, k in shapes)
    else:
        ws, scales = tuple(torch.zeros(n, k, dtype=bf) for n, k in shapes), (None, None)
    outs = tuple(torch.zeros(m, n, dtype=bf) for n, _ in shapes)
    r = (0, 512, torch.zeros(64, 32), torch.zeros(64, 32), torch.zeros(m, dtype=torch.int32)) if rope else None
    with compile_only() as launches:
        TC.mm_many_batch(x, ws, outs, scales, xq=torch.zeros_like(x) if dtype == "fp8" else None, rope=r)
    return launches


def tcfp8_launches(Ns=(5120,), K: int = 8192, m: int = 64, tune=None, rope: bool = False) -> list:
    """`tc_fp8.tc_fp8_many` (the Gluon FP8 linear, not wired into the runtime) of x `[m, K]`
    against FP8 weights `[N, K]` for each N in Ns, in one launch, with `tune`'s launch shape
    (and with `rope`, q's RoPE in weight 0's store: heads of 512, a 64-value tail),
    compiled: [(name, kernel)]."""
    from ..kernels import tc_fp8 as F  # noqa: PLC0415

    ws = tuple(torch.zeros(N, K, dtype=torch.uint8).view(torch.float8_e4m3fn) for N in Ns)
    scs = tuple(torch.zeros(-(-N // 32), K // 32, dtype=torch.uint8) for N in Ns)
    x = torch.zeros(m, K, dtype=torch.bfloat16)
    outs = tuple(torch.zeros(m, N, dtype=torch.bfloat16) for N in Ns)
    with compile_only(pdl=True) as launches:
        r = (0, 512, torch.zeros(64, 32), torch.zeros(64, 32), torch.zeros(m, dtype=torch.int32)) if rope else None
        F.tc_fp8_many(x, ws, outs, scs, rope=r, **(tune or {}))
    return launches


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    g = sub.add_parser("gemv")
    g.add_argument("--K", type=int, default=1280)
    g.add_argument("--N", type=int, nargs="+", default=[32768])
    g.add_argument("--dtype", default="fp8", choices=["bf16", "fp32", "fp8"])
    g.add_argument("--m", type=int, default=1)
    g.add_argument("--xq", action="store_true", help="fp8 weights read the input's round trip (gemv's xq=)")
    a = sub.add_parser("attn")
    a.add_argument("--m", type=int, default=1)
    a.add_argument("--combine", default="auto", choices=["auto", "blocks", "loop"])
    a.add_argument(
        "--tune", type=json.loads, default=None, help='launch shape as JSON, e.g. \'{"bh": 16, "warps_a": 2}\''
    )
    a.add_argument("--packed", action="store_true", help="packed rows (fp8_e8m0 window, fp4_e4m3 compressed)")
    a.add_argument("--pdl", action="store_true", help="compiled as launched with programmatic dependent launch")
    a.add_argument("--gluon", action="store_true", help="the one-pass Gluon kernel (sparse_attn_gluon)")
    a.add_argument("--no-rot", action="store_true", help="without the inverse-RoPE epilogue")
    a.add_argument("--heads", type=int, default=64)
    a.add_argument("--dim", type=int, default=512)
    a.add_argument("--width", type=int, default=640, help="the selection's entries per token")
    i = sub.add_parser("index")
    i.add_argument("--m", type=int, default=1)
    i.add_argument("--L", type=int, default=1 << 20)
    i.add_argument("--packed", action="store_true", help="packed fp4_e8m0 keys")
    i.add_argument("--tune", type=json.loads, default=None, help="launch shape as JSON, e.g. '{\"keys_m\": true}'")
    i.add_argument("--paged", type=int, default=0, help="B > 0: index_scores_paged over blocks of B rows")
    i.add_argument("--gluon", action="store_true", help="with --paged --packed: the Gluon kernel (indexer_gluon)")
    i.add_argument("--heads", type=int, default=32)
    i.add_argument("--gather", type=int, default=0, help="cb > 0 (with --paged): the gathered form, blocks of cb rows")
    t = sub.add_parser("tc")
    t.add_argument("--m", type=int, default=64)
    t.add_argument("--dtype", default="bf16", choices=["bf16", "fp8"])
    t.add_argument("--rope", action="store_true", help="q's RoPE in the store (mm_many_batch's rope=)")
    f8 = sub.add_parser("tcfp8")
    f8.add_argument("--N", type=int, nargs="+", default=[5120], help="several: one launch (tc_fp8_many)")
    f8.add_argument("--K", type=int, default=8192)
    f8.add_argument("--m", type=int, default=64)
    f8.add_argument("--tune", type=json.loads, default=None, help="launch shape as JSON, e.g. '{\"stages\": 3}'")
    f8.add_argument("--rope", action="store_true", help="q's RoPE in the store (heads of 512)")
    k = sub.add_parser("topk")
    k.add_argument("--m", type=int, default=64)
    k.add_argument("--Lb", type=int, default=1 << 20)
    k.add_argument("--neg-inf-past", action="store_true", help="topk_fixed's neg_inf_past=True")
    k.add_argument("--tile", type=int, default=None, help="topk_fixed's positions per tile (default: production)")
    k.add_argument("--warps", type=int, default=None, help="topk_fixed's warps per program (default: production)")
    for p in (g, a, i, t, f8, k):
        p.add_argument("--dump", help="write each kernel's SASS (no addresses) and TTGIR into this folder")
        p.add_argument("--ttgir", action="store_true", help="include the TTGIR in the printed JSON")
        p.add_argument("--dump-sass-lines", action="store_true", help="include the SASS lines in the printed JSON")
    args = ap.parse_args(argv)
    if args.what == "gemv":
        launches = gemv_launches(args.K, args.N, args.dtype, args.m, args.xq)
    elif args.what == "index":
        launches = index_launches(
            args.m, args.L, args.packed, args.tune, args.paged, args.gluon, args.heads, args.gather
        )
    elif args.what == "tc":
        launches = tc_launches(args.m, args.dtype, args.rope)
    elif args.what == "tcfp8":
        launches = tcfp8_launches(args.N, args.K, args.m, args.tune, args.rope)
    elif args.what == "topk":
        launches = topk_launches(args.m, args.Lb, neg_inf_past=args.neg_inf_past, tile=args.tile, warps=args.warps)
    else:
        launches = attn_launches(
            args.m, args.combine, rot=not args.no_rot, packed=args.packed, tune=args.tune, pdl=args.pdl,
            gluon=args.gluon, heads=args.heads, dim=args.dim, width=args.width,
        )  # fmt: skip
    out, seen = [], Counter()
    for name, k in launches:
        rep = report(k, sass_lines=bool(args.dump) or args.dump_sass_lines)
        seen[name] += 1
        if args.dump:  # a kernel's second compilation: name_2 (e.g. the top-k with a mask)
            os.makedirs(args.dump, exist_ok=True)
            stem = name if seen[name] == 1 else f"{name}_{seen[name]}"
            with open(os.path.join(args.dump, f"{stem}.sass"), "w") as f:
                f.write("\n".join(rep["sass"] if args.dump_sass_lines else rep.pop("sass")) + "\n")
            with open(os.path.join(args.dump, f"{stem}.ttgir"), "w") as f:
                f.write(rep["ttgir"])
        if not args.ttgir:
            rep.pop("ttgir")
        out.append(dict(name=name, **rep))
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
