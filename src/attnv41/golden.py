"""Golden files (`../shared/golden/`, format `v41-attention-golden/1`): loading and replay.

`GoldenFile` reads a file's metadata, config, weights and per-layer tensors.
`replay` runs every regime in order, layer by layer, through an implementation and
compares every tensor present in the file by the README's rules (see `testing.py`,
`compare.py`); a tensor the README lists for a layer but the file lacks is skipped and
counted, and a run that compared nothing, or skipped every tensor of a kind, fails
(`ReplayReport.problems`). `attnv41 check` and the tests call the same code.

An implementation is any callable `make(cfg, weights, index_keys, device)` returning
an object with `layer(i, x, start_pos)`; the object the call returns carries the
golden names as attributes (`q`, `kv_win`, `sel`, `o`, `out`, `compress_kv`,
`index_k`, `index_score`, `index_k_owner`, `candidates`), None where not produced.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from .compare import LayerReport, ReplayReport, _compare_layer
from .config import AttnV41Cfg

__all__ = [
    "GoldenFile",
    "GoldenFormatError",
    "LayerReport",
    "ReplayReport",
    "replay",
    "bundled_golden_path",
    "VARIANTS",
    "INDEX_KEYS_FOR_VARIANT",
    "reference_impl",
    "runtime_impl",
    "runtime_split_impl",
    "IMPLS",
]

FORMAT = "v41-attention-golden/1"
VARIANTS = ("released", "intended")
INDEX_KEYS_FOR_VARIANT = {"released": "released", "intended": "own"}


class GoldenFormatError(ValueError):
    """A golden file whose content does not fit the format or the request (names the file)."""


def bundled_golden_path() -> Path:
    """The tiny golden file shipped inside the package (a copy of `v41_tiny.safetensors`)."""
    return Path(str(resources.files("attnv41") / "data" / "v41_tiny.safetensors"))


class GoldenFile:
    """One golden file: metadata, config, weights and tensors, read lazily."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            what = "is a directory, not a file" if self.path.is_dir() else "does not exist"
            raise FileNotFoundError(f"golden file {self.path} {what}")
        self._f = safe_open(str(self.path), framework="pt")
        meta = self._f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise GoldenFormatError(f"{self.path}: metadata format = {meta.get('format')!r}; allowed: {FORMAT!r}")
        dec = {k: _maybe_json(v) for k, v in meta.items()}
        self.meta = dec
        self.name: str = dec["name"]
        self.cfg = AttnV41Cfg.from_golden_meta(dec["config"])
        self.roles: list[str] = list(dec["roles"])
        self.regimes: list[dict[str, Any]] = list(dec["regimes"])
        self.variants: list[str] = list(dec["variants"])
        self.compress_kv_owner = {int(k): int(v) for k, v in dec.get("compress_kv_owner", {}).items()}
        self.selection_owner = {int(k): int(v) for k, v in dec.get("selection_owner", {}).items()}
        self.keys = set(self._f.keys())
        derived = [r.name for r in self.cfg.roles]
        if derived != self.roles:
            raise GoldenFormatError(
                f"{self.path}: roles {self.roles} differ from those derived from its config {derived}"
            )

    def tensor(self, key: str) -> torch.Tensor:
        return self._f.get_tensor(key)

    def weights(self, layer: int) -> dict[str, torch.Tensor]:
        """Layer weights under the released module's parameter names (`wq_a.weight`, ...)."""
        pre = f"weights/L{layer}/"
        return {k[len(pre) :]: self.tensor(k) for k in sorted(self.keys) if k.startswith(pre)}

    def get(self, variant: str, regime: str, layer: int, name: str) -> torch.Tensor | None:
        """`<variant>/<regime>/L<l>/<name>`; an absent `intended` tensor equals the `released` one."""
        for v in (variant, "released"):
            k = f"{v}/{regime}/L{layer}/{name}"
            if k in self.keys:
                return self.tensor(k)
        return None

    @property
    def prefill_rows(self) -> torch.Tensor:
        return self.tensor("rows/prefill").long()


def _maybe_json(v: str) -> Any:
    try:
        return json.loads(v)
    except (json.JSONDecodeError, TypeError):
        return v


def reference_impl(cfg: AttnV41Cfg, weights, index_keys: str, device):
    """The reference stack as a golden implementation."""
    from .reference.layer import RefStack

    return RefStack(cfg, weights, device=device, index_keys=index_keys)


def runtime_impl(cfg: AttnV41Cfg, weights, index_keys: str, device):
    """The runtime (`AttnV41` through `RuntimeStack`) as a golden implementation."""
    from .runtime.stack import RuntimeStack

    return RuntimeStack(cfg, weights, device=device, index_keys=index_keys)


class _SplitDecode:
    """The runtime with decode steps through `DecodeGraphs` (one CUDA graph per step on
    CUDA, the same device-driven step eagerly on the CPU): prefill through `forward`.

    A whole step is one graph, so no layer leaves a run; what each left observable is
    read after the step: its output and ring, the selection it attended with (its index
    source's row of `attn.plan.sel`, trimmed to the window and the visible top-k, the
    rest checked to be −1), on index sources the scores (their row of `plan.scores`)
    and the index-key owner, and on ratio>0 layers the rows its kv source's caches hold
    and the candidate mask."""

    def __init__(self, cfg: AttnV41Cfg, weights, index_keys: str, device):
        from .runtime.graphs import DecodeGraphs
        from .runtime.stack import RuntimeStack

        self.cfg = cfg
        self.stack = RuntimeStack(cfg, weights, device=device, index_keys=index_keys)
        self.graphs = DecodeGraphs(self.stack)

    def layer(self, i: int, x: torch.Tensor, start_pos: int):
        return self.stack.layer(i, x, start_pos)

    def decode_step(self, xs, start_pos: int) -> list:
        y = self.graphs.step(xs, start_pos)
        out = []
        for i in range(self.cfg.n_layers):
            cap = _Captured.of(self.cfg, self.stack, i, start_pos, self.graphs.key_owner[i])
            cap.out = y[i].clone()
            out.append(cap)
        return out


class _Captured:
    """What a captured layer step leaves observable (see `_SplitDecode`); q and o are
    workspace values the next layer overwrites inside the graph."""

    not_produced = ("q", "o")

    def __init__(self):
        self.out = self.kv_win = self.sel = None
        self.compress_kv = self.index_k = self.candidates = None
        self.index_score = self.index_k_owner = None
        self.observed_from: dict[str, int] = {}
        self.errors: dict[str, str] = {}

    @classmethod
    def of(cls, cfg: AttnV41Cfg, stack, i: int, pos: int, key_owner: int) -> _Captured:
        from .compare import _kv_source

        c = cls()
        role = cfg.roles[i]
        plan = stack.attn.plan
        c.kv_win = stack.states[i].ring.detach().cpu().clone()
        r = role.ratio
        L = (pos + 1) // r if r else 0
        k = min(cfg.index_topk, L)
        width = cfg.window + k
        buf = plan.sel_for(i).detach().cpu().clone()
        if buf.shape[0] != 1 or buf.shape[1] < width:
            c.errors["sel"] = f"plan.sel_for({i}) is {tuple(buf.shape)}; allowed: [1, >= {width}]"
        elif (buf[:, width:] != -1).any():
            c.errors["sel"] = f"plan.sel_for({i}) past column {width} is {buf[0, width:].tolist()}; allowed: all −1"
        else:
            c.sel = buf[:, :width]
        if r > 0:
            src = _kv_source(cfg, i)
            st = stack.states[src]
            c.compress_kv = st.compress_kv[:L].detach().cpu().clone()
            c.index_k = st.index_k[:L].detach().cpu().clone()
            c.observed_from.update(compress_kv=src, index_k=src)
            if role.is_index_source and L > 0:
                c.index_score = plan.scores[plan.sel_slot(i), :, :L].detach().cpu().clone()
                c.index_k_owner = key_owner
            cand = cfg.candidate_source_layer
            cand_ratio = cfg.roles[cand].ratio if cand is not None else 0
            if cand is not None and cand <= i and cand_ratio == r and L > 0:
                c.candidates = plan.cand[:, :L].detach().cpu().clone()
                c.observed_from["candidates"] = cand
        return c


def runtime_split_impl(cfg: AttnV41Cfg, weights, index_keys: str, device):
    return _SplitDecode(cfg, weights, index_keys, device)


IMPLS = {"reference": reference_impl, "runtime": runtime_impl, "runtime-split": runtime_split_impl}


def replay(
    golden: GoldenFile,
    variant: str,
    make_impl: Callable[..., Any] = reference_impl,
    device: str | torch.device = "cpu",
    impl_name: str = "reference",
    on_layer: Callable[[LayerReport], None] | None = None,
) -> ReplayReport:
    """Run every regime of `golden` in order through a fresh implementation and compare."""
    if variant not in golden.variants:
        raise GoldenFormatError(f"variant = {variant!r}; allowed: {golden.variants}")
    cfg = golden.cfg
    golden_w = [golden.weights(i) for i in range(cfg.n_layers)]
    weights = [{k: v.to(device) for k, v in w.items()} for w in golden_w]
    impl = make_impl(cfg, weights, INDEX_KEYS_FOR_VARIANT[variant], device)
    report = ReplayReport(golden.name, variant, impl_name)
    rows_prefill = golden.prefill_rows
    keys: dict[int, torch.Tensor] = {}  # per kv source: our index-key rows as last reported
    for reg in golden.regimes:
        rname, start = reg["name"], int(reg["start_pos"])
        traces: dict[int, Any] = {}
        score_rows: dict = {}  # per layer: rows whose scores were excused, selection verdicts
        x_cpu = []
        for i in range(cfg.n_layers):
            x = golden.get(variant, rname, i, "x")
            if x is None:
                raise GoldenFormatError(f"{golden.path}: {variant}/{rname}/L{i}/x is missing")
            x_cpu.append(x)
        xs = [x.to(device) for x in x_cpu]
        # A split-decode implementation runs a whole decode step at once (CUDA graphs
        # span several layers); its traces are then compared layer by layer.
        step_traces = impl.decode_step(xs, start) if start > 0 and hasattr(impl, "decode_step") else None
        for i in range(cfg.n_layers):
            role = cfg.roles[i]
            tr = step_traces[i] if step_traces is not None else impl.layer(i, xs[i], start)
            traces[i] = tr
            lr = _compare_layer(
                lambda layer, n, _r=rname: golden.get(variant, _r, layer, n),
                cfg,
                rname,
                start,
                int(reg["len"]),
                int(reg["window_cols"]),
                int(reg["offset"]),
                i,
                role,
                tr,
                traces,
                score_rows,
                rows_prefill if start == 0 else None,
                lambda layer, _x=x_cpu: (_x[layer], golden_w[layer]),
                keys,
            )
            report.layers.append(lr)
            if on_layer:
                on_layer(lr)
    attn = getattr(impl, "attn", None) or getattr(getattr(impl, "stack", None), "attn", None)
    if attn is not None:
        report.nonfinite = attn.nonfinite_count()
    return report
