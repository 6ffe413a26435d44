"""`attnv41` command line: argument parsing and printing only.

Subcommands:
  demo    the main job: a 40-layer stack, prefill, graph vs eager decode, a report.
  bench   time the runtime against measured floors and the FlashMLA peer.
  check   replay a golden file (default: the tiny one bundled in the package)
          through an implementation and compare every tensor it holds.
  env     what this machine offers the runtime: versions, variables, GPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import sys
import time
from pathlib import Path

from safetensors import SafetensorError

from .compare import KINDS, LayerReport, ReplayReport
from .golden import IMPLS, VARIANTS, GoldenFile, GoldenFormatError, bundled_golden_path, replay, replay_batched

COLS = tuple(k for k in KINDS)
SHORT = {
    "q": "q",
    "kv_win": "kv_win",
    "compress_kv": "ckv",
    "index_k": "idx_k",
    "index_score": "score",
    "index_k_owner": "owner",
    "candidates": "cand",
    "sel": "sel",
    "o": "o",
    "out": "out",
}


def _fmt_ratio(r: float) -> str:
    return "inf" if math.isinf(r) else f"{r:.3f}"


def _row(lr: LayerReport) -> str:
    by = {c.name: c for c in lr.cmps}
    cells = []
    for k in COLS:
        c = by.get(k)
        if c is None:
            cells.append(f"{'-':>7}")
        else:
            mark = "" if c.ok else "!"
            mark += "~" if c.excused else ""
            cells.append(f"{_fmt_ratio(c.ratio) + mark:>7}")
    status = "ok" if lr.ok else "FAIL"
    return f"{lr.regime:<11} L{lr.layer:<3} {lr.role:<22}" + "".join(cells) + f"  {status}"


def _header() -> str:
    return f"{'regime':<11} {'layer':<4} {'role':<22}" + "".join(f"{SHORT[k]:>7}" for k in COLS) + "  status"


def _print_report(rep: ReplayReport, out) -> None:
    print(
        f"\n== {rep.golden} / {rep.variant} / impl {rep.impl}: worst |err|/tol per tensor "
        "(<= 1 passes; ~ = some rows or elements excused by the golden README's rules; ! = fails)",
        file=out,
    )
    print(_header(), file=out)
    for lr in rep.layers:
        print(_row(lr), file=out)
    for f in rep.failures():
        print(f"  FAIL {f}", file=out)
    excused = [f"{lr.regime} L{lr.layer} {c}" for lr in rep.layers for c in lr.cmps if c.excused and c.ok]
    for e in excused:
        print(f"  note {e}", file=out)


def _finite(r: float) -> float | None:
    """A ratio for JSON: None where it is not finite (a NaN, a shape mismatch, an
    infinite error), which strict JSON cannot hold."""
    return r if math.isfinite(r) else None


def _report_json(rep: ReplayReport) -> dict:
    """One variant's replay as `check --json` writes it: every layer's comparisons
    (ratio = worst |error| / tolerance, None where not finite), what was skipped, and the
    run's verdict and problems."""
    return {
        "variant": rep.variant,
        "impl": rep.impl,
        "ok": rep.ok,
        "compared": rep.n_compared,
        "failed": rep.n_failed,
        "skipped": rep.n_skipped,
        "nonfinite": rep.nonfinite,
        "worst": {k: _finite(v) for k, v in rep.worst().items()},
        "problems": rep.problems(),
        "failures": rep.failures(),
        "layers": [
            {
                "regime": lr.regime,
                "layer": lr.layer,
                "role": lr.role,
                "ok": lr.ok,
                "tensors": {
                    c.name: {"ok": c.ok, "ratio": _finite(c.ratio), "excused": c.excused, "detail": c.detail}
                    for c in lr.cmps
                },
                "skipped": list(lr.skipped),
            }
            for lr in rep.layers
        ],
    }


def _write_json(path: str | None, doc: dict) -> None:
    """`check --json PATH`: the run as strict JSON (written whatever the verdict)."""
    if path is None:
        return
    from . import __version__  # noqa: PLC0415

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"attnv41": __version__, **doc}, indent=1, allow_nan=False) + "\n")
    print(f"wrote {out}")


def _check_json_path(args: argparse.Namespace) -> str | None:
    """--json's path, refused (a user mistake, before any compute) when it names a folder."""
    if args.json is not None and Path(args.json).is_dir():
        raise ValueError(f"--json {args.json}: a folder; allowed: a file path (created or overwritten)")
    return args.json


def _variants(args: argparse.Namespace, chunk: int | None) -> tuple[str, ...]:
    """The golden variants a check compares. In released mode a chunk that completes no
    group of a Full layer scores against the keys another layer published last
    (attention-v41.md §9): chunked and one-shot prefill differ there by design, so with
    --prefill-chunk "both" means the intended variant; asked for explicitly, released runs."""
    if args.variant != "both":
        return (args.variant,)
    if chunk is not None:
        print("attnv41 check: --prefill-chunk compares the intended variant (--variant released to run that too)")
        return ("intended",)
    return VARIANTS


def cmd_check(args: argparse.Namespace) -> int:
    path = args.golden or bundled_golden_path()
    golden = GoldenFile(path)
    chunk = args.prefill_chunk
    if chunk is not None and chunk < 1:
        print(f"attnv41 check: --prefill-chunk {chunk}; allowed: >= 1", file=sys.stderr)
        return 2
    if args.tp < 1:
        print(f"attnv41 check: --tp {args.tp}; allowed: >= 1", file=sys.stderr)
        return 2
    if args.tp > 1 and (args.batch is not None or args.decode == "split"):
        what = "--batch" if args.batch is not None else "--decode split"
        print(f"attnv41 check: --tp {args.tp} with {what}; allowed: --tp with forward decode steps", file=sys.stderr)
        return 2
    if args.batch is not None:
        return _check_batched(args, golden, chunk)
    if args.kv_format != "bf16" and args.impl == "reference":
        print(f"attnv41 check: --kv-format {args.kv_format} needs --impl runtime (or --batch)", file=sys.stderr)
        return 2
    variants = _variants(args, chunk)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("attnv41 check: --device cuda requested but torch.cuda.is_available() is False", file=sys.stderr)
            return 2
    impl = args.impl
    if args.decode == "split":
        if impl != "runtime":
            print("attnv41 check: --decode split needs --impl runtime", file=sys.stderr)
            return 2
        impl = "runtime-split"
    make_impl = IMPLS[impl]
    if args.kv_format != "bf16":  # the runtime with packed caches: the same rules, the same golden values
        make_impl = functools.partial(IMPLS[impl], kv_format=args.kv_format)
        make_impl.weights_dtypes = IMPLS[impl].weights_dtypes
    if args.tp > 1:  # tensor-parallel ranks, one after the other, their partial outputs reduced
        from .tp import check_tp, tp_impl

        try:
            check_tp(golden.cfg, args.tp, fp8=golden.weights_dtype == "fp8")
        except ValueError as e:
            print(f"attnv41 check: --tp: {golden.path.name}: {e}", file=sys.stderr)
            return 2
        kw = {"kv_format": args.kv_format} if args.kv_format != "bf16" else {}
        make_impl = tp_impl(args.tp, impl, **kw)
        impl = f"{impl} (tp {args.tp})"
    json_path = _check_json_path(args)
    failed = 0
    total_cmp = total_skip = 0
    reports = []
    t0 = time.perf_counter()
    for v in variants:
        with _internal(user_errors=(GoldenFormatError, SafetensorError, OSError)):  # a bug in replay: traceback
            rep = replay(golden, v, make_impl, device=args.device, impl_name=impl, prefill_chunk=chunk)
        _print_report(rep, sys.stdout)
        reports.append(_report_json(rep))
        problems = rep.problems()  # a run that compared nothing of a kind proves nothing about it
        failed += rep.n_failed + len(problems)
        total_cmp += rep.n_compared
        total_skip += rep.n_skipped
        worst = rep.worst()
        print(
            f"-- {golden.name}/{v}: {rep.n_compared} tensors compared, {rep.n_failed} failed, "
            f"{rep.n_skipped} skipped (absent from the file, or not observable in a captured step); worst ratio "
            + ", ".join(f"{SHORT[k]} {_fmt_ratio(worst[k])}" for k in COLS if k in worst)
        )
        if rep.nonfinite is not None:
            print(f"-- {golden.name}/{v}: {rep.nonfinite} non-finite values entered a cache write")
        for p in problems:
            print(f"-- {golden.name}/{v}: FAIL: {p}")
    dt = time.perf_counter() - t0
    verdict = "PASS" if failed == 0 else "FAIL"
    chunked = "" if chunk is None else f", prefill in chunks of {chunk}"
    chunked += ", packed caches" if args.kv_format == "packed" else ""
    print(
        f"\n{verdict}: {golden.path.name} ({golden.name}), variants {', '.join(variants)}, impl {impl}{chunked}, "
        f"device {args.device}: {total_cmp} tensors compared, {failed} failed, {total_skip} skipped, {dt:.1f} s"
    )
    _write_json(
        json_path,
        {
            "verdict": verdict,
            **_run_fields(args, golden, variants, chunk),
            "impl": impl,
            "compared": total_cmp,
            "failed": failed,
            "skipped": total_skip,
            "seconds": round(dt, 3),
            "reports": reports,
        },
    )
    return 0 if failed == 0 else 1


def _run_fields(args: argparse.Namespace, golden: GoldenFile, variants, chunk: int | None) -> dict:
    """The fields every `check --json` file starts with: what was checked, and how."""
    return {
        "golden_file": str(golden.path),
        "golden": golden.name,
        "variants": list(variants),
        "device": args.device,
        "kv_format": args.kv_format,
        "prefill_chunk": chunk,
        "tp": getattr(args, "tp", 1),
    }


def _check_batched(args: argparse.Namespace, golden: GoldenFile, chunk: int | None) -> int:
    """`check --batch N`: the golden sequence in one slot of batched steps (BatchV41) beside
    N − 1 random sequences, then alone (batch 1): the golden rules, and the golden slot's
    bytes identical between the two runs."""
    n = args.batch
    hi = golden.cfg.max_tokens  # a step holds at most max_tokens tokens: more sequences would never run
    if not 1 <= n <= hi:
        print(f"attnv41 check: --batch {n}; allowed: 1..{hi} (the golden config's max_tokens)", file=sys.stderr)
        return 2
    if args.decode != "forward":
        print(
            f"attnv41 check: --decode {args.decode} with --batch; allowed: --decode forward (batched steps run "
            "BatchV41; their graphs are tested by `pytest -m gpu`)",
            file=sys.stderr,
        )
        return 2
    variants = _variants(args, chunk)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("attnv41 check: --device cuda requested but torch.cuda.is_available() is False", file=sys.stderr)
            return 2
    json_path = _check_json_path(args)
    reports, differ = [], []
    t0 = time.perf_counter()
    failed = total_cmp = total_fail = total_skip = n_cmp = n_bad = 0
    for v in variants:
        with _internal(user_errors=(GoldenFormatError, SafetensorError, OSError)):
            rep, nc, bad = replay_batched(
                golden, device=args.device, batch=n, chunk=chunk, seed=args.seed, kv_format=args.kv_format, variant=v
            )
        _print_report(rep, sys.stdout)
        reports.append(_report_json(rep))
        differ += [{"variant": v, "tensor": str(b)} for b in bad]
        problems = rep.problems()
        for p in problems:
            print(f"-- {golden.name}/{v}: FAIL: {p}")
        for b in bad[:20]:
            print(f"-- {golden.name}/{v}: batch invariance: FAIL: {b} differs from the batch-1 run")
        failed += rep.n_failed + len(problems) + len(bad)
        total_cmp, total_fail, total_skip = (
            total_cmp + rep.n_compared,
            total_fail + rep.n_failed,
            total_skip + rep.n_skipped,
        )
        n_cmp, n_bad = n_cmp + nc, n_bad + len(bad)
    verdict = "PASS" if failed == 0 else "FAIL"
    chunked = "" if chunk is None else f", prefill in chunks of {chunk}"
    chunked += ", packed caches" if args.kv_format == "packed" else ""
    print(
        f"\n{verdict}: {golden.path.name} ({golden.name}), variants {', '.join(variants)}, batched runtime, batch {n}"
        f"{chunked}, device {args.device}: {total_cmp} tensors compared, {total_fail} failed, {total_skip} skipped; "
        f"batch invariance: {n_cmp} traced tensors against the batch-1 run (bf16 caches), {n_bad} differ; "
        f"{time.perf_counter() - t0:.1f} s"
    )
    _write_json(
        json_path,
        {
            "verdict": verdict,
            **_run_fields(args, golden, variants, chunk),
            "impl": "batched runtime",
            "batch": n,
            "seed": args.seed,
            "compared": total_cmp,
            "failed": failed,
            "skipped": total_skip,
            "seconds": round(time.perf_counter() - t0, 3),
            "reports": reports,
            "batch_invariance": {"traced": n_cmp, "differ": differ},
        },
    )
    return 0 if failed == 0 else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import prepare_demo, run_prepared

    setup = prepare_demo(  # every user mistake raises here, before any compute
        preset=args.preset,
        prompt=args.prompt,
        steps=args.steps,
        seed=args.seed,
        index_keys=args.index_keys,
        device=args.device,
        checkpoint=args.checkpoint,
        progress=not args.no_progress,
        weights=args.weights,
    )
    with _internal():
        res = run_prepared(setup)
    for line in res.lines():
        print(line)
    if res.ok:
        print("PASS")
    else:
        why = [f"{res.mismatched_steps} graph and eager decode steps differ"] if res.mismatched_steps else []
        why += [f"{res.nonfinite} non-finite values entered a cache write"] if res.nonfinite else []
        print("FAIL: " + "; ".join(why))
    return 0 if res.ok else 1


def cmd_env(args: argparse.Namespace) -> int:
    from .env import collect, lines

    info = collect()
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print("\n".join(lines(info)))
    return 0


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: comma-separated integers, e.g. 4096,32768") from None
    if not vals:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: at least one integer")
    return vals


def _kv_formats(text: str) -> tuple[str, ...]:
    vals = tuple(v.strip() for v in text.split(",") if v.strip())
    if not vals or any(v not in ("bf16", "packed") for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a comma-separated subset of bf16,packed")
    return vals


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.run import PARTS, BenchOptions, run_bench, write_outputs

    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        print(
            f"attnv41 bench: --parts {args.parts!r}; allowed: a comma-separated subset of {','.join(PARTS)}",
            file=sys.stderr,
        )
        return 2
    opts = BenchOptions(
        parts=parts,
        contexts=args.contexts,
        prefill=args.prefill,
        index_lengths=args.index_lengths,
        batches=args.batches,
        batch_sizes=args.batch_sizes,
        batch_contexts=args.batch_contexts,
        batch_kv_formats=args.batch_kv_formats,
        verify_lens=args.verify_lens,
        kv_formats=args.kv_formats,
        long_context=args.long_context,
        long_kv_formats=args.long_kv_formats,
        long_budget_s=args.long_budget_s,
        preset=args.preset,
        device=args.device,
        checkpoint=args.checkpoint,
        seed=args.seed,
        quick=args.quick,
        progress=not args.no_progress,
        weights=args.weights,
        tp=args.tp,
    )
    partial = Path(args.out) / "bench.partial.json"

    def save(res: dict) -> None:  # what is measured survives a run cut short
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(res, indent=1, default=str))

    res = run_bench(opts, log=lambda s: print(s, flush=True), on_part=save)
    partial.unlink(missing_ok=True)
    paths = write_outputs(res, args.out, log=lambda s: print(s, flush=True))
    print("\nwrote " + ", ".join(str(p) for p in paths))
    if res.get("errors"):
        for part, tb in res["errors"].items():
            print(f"\nFAILED part {part}:\n{tb}", file=sys.stderr)
        return 1
    return 0


class UsageError(Exception):
    """A bad command line: argparse's message as one line `attnv41 <cmd>: <message>`."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line raises UsageError (one line, exit 2 from `main`)
    instead of printing the usage and exiting; the subcommand parsers inherit it."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")


# What a user mistake raises while a command reads its arguments and input files: the
# package's validation (ValueError, its CheckpointError subclass, TypeError, KeyError
# for a missing config key or tensor), a missing or unreadable file (OSError), a file
# that is not safetensors (SafetensorError), JSON that does not parse (a ValueError).
USER_ERRORS = (ValueError, TypeError, KeyError, OSError, SafetensorError)
_INTERNAL = "_attnv41_internal"


@contextlib.contextmanager
def _internal(user_errors: tuple[type[BaseException], ...] = ()):
    """Marks exceptions raised inside as bugs, whatever their type: `main` lets them
    propagate with their traceback (exit 1) instead of printing them as a user mistake.
    For the compute phase of a command whose inputs were validated before it; the
    exceptions in `user_errors` (an input file's content read during that phase) stay
    user mistakes."""
    try:
        yield
    except BaseException as e:
        if not isinstance(e, user_errors):
            setattr(e, _INTERNAL, True)
        raise


def _message(e: BaseException, args: argparse.Namespace) -> str:
    """The exception's own message (KeyError's str() would quote it); safetensors' own
    message names no file, so the command's input file is named beside it."""
    if isinstance(e, KeyError) and len(e.args) == 1:
        return str(e.args[0])
    if isinstance(e, SafetensorError):
        path = getattr(args, "golden", None) or getattr(args, "checkpoint", None) or "input file"
        return f"{path}: not a readable safetensors file ({e})"
    return str(e) or type(e).__name__


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="attnv41", description="DeepSeek-V4.1 attention runtime tools")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="replay a golden file and compare every tensor it holds")
    c.add_argument("--golden", help="golden .safetensors file (default: the tiny one bundled in the package)")
    c.add_argument(
        "--variant",
        choices=(*VARIANTS, "both"),
        default="both",
        help="released: the index-key flaw of the released code; intended: the fix (default both)",
    )
    c.add_argument(
        "--impl",
        choices=tuple(IMPLS),
        default="reference",
        help="reference: the plain-PyTorch oracle; runtime: AttnV41 (Triton on CUDA, torch on CPU)",
    )
    c.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    c.add_argument(
        "--decode",
        choices=("forward", "split"),
        default="forward",
        help="runtime decode steps through forward (default) or through DecodeGraphs (one CUDA graph "
        "per step on cuda, the same device-driven step eagerly on cpu); every layer is compared by what "
        "the step leaves observable (out, ring, selection, scores, caches, candidate mask)",
    )
    c.add_argument(
        "--prefill-chunk",
        type=int,
        metavar="C",
        help="run the prefill in chunks of C tokens (continuations after the first) and compare it, "
        "reassembled, with the one-shot prefill's tensors",
    )
    c.add_argument(
        "--batch",
        type=int,
        metavar="N",
        help="run the golden sequence in one slot of batched steps (BatchV41, paged caches) beside N-1 "
        "random sequences at other positions and lengths, then alone: the golden rules, and its bytes "
        "identical to the batch-1 run (the variants --variant asks, the intended one only with --prefill-chunk; "
        "--impl is not used)",
    )
    c.add_argument("--seed", type=int, default=0, help="with --batch: draws the other sequences and the order")
    c.add_argument(
        "--kv-format",
        choices=("bf16", "packed"),
        default="bf16",
        help="the runtime's caches in bf16 or in V4.1's packed formats (the same golden rules; with --batch "
        "the batch-1 run compared against keeps bf16 caches, so packed must give its bytes)",
    )
    c.add_argument(
        "--tp",
        type=int,
        default=1,
        metavar="N",
        help="run N tensor-parallel ranks (attnv41.tp: each its share of the heads and output groups), one "
        "after the other on the device, and compare their reduced output; q and o gathered over the ranks",
    )
    c.add_argument(
        "--json",
        metavar="PATH",
        help="also write the run as JSON to PATH: the verdict, every layer's comparisons (worst |error| / "
        "tolerance, null where not finite), what was skipped, and with --batch the tensors that differ",
    )
    c.set_defaults(func=cmd_check)
    e = sub.add_parser(
        "env",
        help="versions, the variables read, each GPU and whether the kernels run on it (for bug reports)",
    )
    e.add_argument("--json", action="store_true", help="print JSON instead of lines")
    e.set_defaults(func=cmd_env)
    d = sub.add_parser("demo", help="a 40-layer stack: prefill, graph decode beside eager decode, a short report")
    d.add_argument(
        "--preset",
        choices=("auto", "flash", "small"),
        default="auto",
        help="auto: V4.1-Flash geometry on a GPU, a small one with the same schedule on the CPU",
    )
    d.add_argument("--prompt", type=int, help="prompt tokens (default 4096 on a GPU, 128 on the CPU)")
    d.add_argument("--steps", type=int, help="decode steps (default 256 on a GPU, 48 on the CPU)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--index-keys", choices=("own", "released"), default="own")
    d.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    d.add_argument("--checkpoint", help="a V4.1 checkpoint directory (config.json + safetensors shards)")
    d.add_argument(
        "--weights",
        choices=("auto", "bf16", "fp8"),
        default="auto",
        help="weight format: fp8 runs wq_a, wq_b, wkv, wo_b, indexer.wq_b as the released checkpoint does (e4m3 "
        "weights, e8m0 block scales, activations quantized per 32 columns); bf16 dequantizes them; auto (default): "
        "the checkpoint's own format, bf16 for random weights (fp8 with random weights quantizes them the released way)",
    )
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    d.set_defaults(func=cmd_demo)
    b = sub.add_parser(
        "bench",
        help="decode step and prefill against the floor, each kernel alone, the FlashMLA peer, index top-k",
        description="Times the runtime after a correctness gate, against floors from the copy bandwidth and "
        "matmul rate measured in the same run; writes bench.json, bench.md and decode_step.png to --out. "
        "Meant for a GPU; on the CPU it is a quick smoke run at a small geometry.",
    )
    b.add_argument(
        "--parts",
        default="kernels,decode,prefill,peer,index,batch",
        help="comma-separated subset of kernels,decode,prefill,peer,index,batch,long (default: all but long, "
        "which prefills one 1M-token prompt on a GPU: minutes)",
    )
    b.add_argument("--contexts", type=_ints, help="decode contexts (default 4096,32768,131072 on a GPU)")
    b.add_argument("--prefill", type=_ints, help="prefill lengths (default 2048,8192 on a GPU)")
    b.add_argument("--index-lengths", type=_ints, help="index top-k positions (default 4096 ... 1048576 on a GPU)")
    b.add_argument("--batches", type=_ints, help="batches for the peer comparison (default 1,64 on a GPU)")
    b.add_argument(
        "--batch-sizes", type=_ints, help="part batch: sequences per decode step (default 1,8,64,256 on a GPU)"
    )
    b.add_argument("--batch-contexts", type=_ints, help="part batch: contexts (default 4096,32768 on a GPU)")
    b.add_argument(
        "--verify-lens",
        type=_ints,
        default=(1,),
        help="part batch: tokens per sequence per step, 1 a decode step, k > 1 a verify step (default 1)",
    )
    b.add_argument(
        "--kv-formats",
        type=_kv_formats,
        default=("bf16", "packed"),
        help="part decode: cache formats of the decode rows (default bf16,packed)",
    )
    b.add_argument(
        "--batch-kv-formats",
        type=_kv_formats,
        default=("bf16", "packed"),
        help="part batch: cache formats of the decode rows (default bf16,packed)",
    )
    b.add_argument(
        "--long-context",
        type=int,
        help="part long: the prompt's tokens, prefilled in chunks, decode at its end (default 1048000 on a GPU)",
    )
    b.add_argument(
        "--long-kv-formats",
        type=_kv_formats,
        default=("bf16",),
        help="part long: cache formats, one whole prompt each (default bf16)",
    )
    b.add_argument(
        "--long-budget-s",
        type=float,
        help="part long: stop launching chunks after this many seconds; the row says how far it got",
    )
    b.add_argument(
        "--preset",
        choices=("auto", "flash", "small"),
        default="auto",
        help="auto: V4.1-Flash geometry on a GPU, the small one on the CPU",
    )
    b.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    b.add_argument("--checkpoint", help="a V4.1 checkpoint directory: its geometry and weights instead of random ones")
    b.add_argument(
        "--weights",
        choices=("both", "bf16", "fp8"),
        default="both",
        help="weight formats of the projection kernels (b) and the decode (a), prefill (e) and batched (f, g) "
        "stacks, each against the floor of the bytes it reads (default both; part long takes bf16 of both; with "
        "--checkpoint, both loads it once in each format; under both, FP8 is skipped with its reason where it "
        "cannot run)",
    )
    b.add_argument(
        "--tp",
        type=int,
        default=1,
        metavar="N",
        help="tensor parallelism: every part runs rank 0's share of N (attnv41.tp: n_heads/N heads, groups/N "
        "output groups; caches, compressor and indexer replicated), what one GPU of N does per step",
    )
    b.add_argument("--out", default="bench-out", help="output folder (default ./bench-out)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--quick", action="store_true", help="few repetitions (a smoke run, not a measurement)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar while loading a checkpoint")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 success; 1 a failed check (or a bug: its exception propagates with
    its traceback); 2 a user mistake (bad arguments, a missing or corrupt golden file or
    checkpoint, an option out of range), printed as one line `attnv41 <cmd>: <message>`
    on stderr."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        print(e, file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except USER_ERRORS as e:
        if getattr(e, _INTERNAL, False):
            raise
        print(f"attnv41 {args.cmd}: {_message(e, args)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
