"""Golden files (`../shared/golden/`, format `v41-attention-golden/1`): loading and replay.

`GoldenFile` reads a file's metadata, config, weights and per-layer tensors.
`replay` runs every regime in order, layer by layer, through an implementation and
compares every tensor present in the file by the README's rules (see `testing.py`,
`compare.py`); a tensor the README lists for a layer but the file lacks is skipped and
counted, and a run that compared nothing, or skipped every tensor of a kind, fails
(`ReplayReport.problems`). `attnv41 check` and the tests call the same code.

FP8 files (`v41_fp8`, metadata `weights_dtype = "fp8"`; README section v41_fp8): weights
missing under a layer resolve through the metadata's `weight_aliases`; the FP8 linears
come as float8_e4m3fn `<name>.weight` plus float8_e8m0fnu `<name>.scale`, which only
implementations listing "fp8" in their `weights_dtypes` attribute accept (the reference
runs them the released way). Reduced storage is undone where the README says how
(`GoldenFile.get`): `compress_kv` and `index_k` of an earlier regime are the first rows
of the last regime's, and prefill `sel` of L2/L4/L0 is L1's/L3's/L1's first window
columns; `kv_win` holds only some rows (`kv_win_rows`) and is compared on those.

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
WEIGHTS_DTYPES = ("bf16", "fp8")


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
        self.weights_dtype: str = dec.get("weights_dtype", "bf16")
        if self.weights_dtype not in WEIGHTS_DTYPES:
            raise GoldenFormatError(f"{self.path}: weights_dtype = {self.weights_dtype!r}; allowed: {WEIGHTS_DTYPES}")
        self.weight_aliases: dict[str, str] = dict(dec.get("weight_aliases", {}))
        for k, v in self.weight_aliases.items():
            if v not in self.keys or k in self.keys:
                raise GoldenFormatError(
                    f"{self.path}: weight alias {k!r} -> {v!r}; allowed: a missing name to a stored one"
                )
        derived = [r.name for r in self.cfg.roles]
        if derived != self.roles:
            raise GoldenFormatError(
                f"{self.path}: roles {self.roles} differ from those derived from its config {derived}"
            )

    def tensor(self, key: str) -> torch.Tensor:
        return self._f.get_tensor(key)

    def weights(self, layer: int) -> dict[str, torch.Tensor]:
        """Layer weights under the released module's parameter names (`wq_a.weight`, ...),
        shared matrices resolved through `weight_aliases`; FP8 ones with their `.scale`."""
        pre = f"weights/L{layer}/"
        names = {k for k in self.keys if k.startswith(pre)} | {k for k in self.weight_aliases if k.startswith(pre)}
        return {k[len(pre) :]: self.tensor(self.weight_aliases.get(k, k)) for k in sorted(names)}

    def get(self, variant: str, regime: str, layer: int, name: str) -> torch.Tensor | None:
        """`<variant>/<regime>/L<l>/<name>`; an absent `intended` tensor equals the `released`
        one. In a reduced file, tensors the README derives from stored ones are derived."""
        for v in (variant, "released"):
            k = f"{v}/{regime}/L{layer}/{name}"
            if k in self.keys:
                return self.tensor(k)
        return self._derived(variant, regime, layer, name)

    def _regime(self, regime: str) -> dict[str, Any]:
        for r in self.regimes:
            if r["name"] == regime:
                return r
        raise GoldenFormatError(f"{self.path}: regime = {regime!r}; allowed: {[r['name'] for r in self.regimes]}")

    def _derived(self, variant: str, regime: str, layer: int, name: str) -> torch.Tensor | None:
        """README v41_fp8 "Reduced storage": compressed rows are written once, so an earlier
        regime's `compress_kv` / `index_k` are the first `L` rows of the last regime's; prefill
        `sel` of L2 equals L1's, of L4 L3's, of L0 the first `window_cols` columns of L1's."""
        if self.weights_dtype != "fp8":
            return None
        reg = self._regime(regime)
        role = self.cfg.roles[layer]
        last = self.regimes[-1]["name"]
        if name in ("compress_kv", "index_k") and role.is_kv_source and regime != last:
            rows = self.get(variant, last, layer, name)
            L = (int(reg["start_pos"]) + int(reg["len"])) // role.ratio
            return None if rows is None or rows.shape[0] < L else rows[:L]
        if name == "sel" and int(reg["start_pos"]) == 0:
            src = {0: 1, 2: 1, 4: 3}.get(layer)
            if src is None:
                return None
            k = f"released/{regime}/L{src}/sel"  # prefill is identical in both variants
            if k not in self.keys:
                return None
            sel = self.tensor(k)
            return sel[:, : int(reg["window_cols"])] if layer == 0 else sel
        return None

    def kv_win_rows(self, regime: str, rows_prefill: torch.Tensor) -> torch.Tensor | None:
        """The rows of an implementation's `kv_win` (prefill: chunk rows; decode: ring
        slots) that the file's `kv_win` holds at `regime`: None for all of them. Reduced
        files store prefill rows `rows/prefill` and, at decode, the slot this token wrote."""
        reg = self._regime(regime)
        start, m, W = int(reg["start_pos"]), int(reg["len"]), self.cfg.window
        ref = self.get("released", regime, 0, "kv_win")
        n = None if ref is None else ref.shape[0]
        full = m if start == 0 else W
        if n is None or n == full:
            return None
        if start == 0 and n == rows_prefill.numel():
            return rows_prefill
        if start > 0 and n == 1:
            return torch.tensor([start % W])
        raise GoldenFormatError(
            f"{self.path}: {regime}/L0/kv_win has {n} rows; allowed: {full}"
            + (f" or {rows_prefill.numel()} (rows/prefill)" if start == 0 else " or 1 (the slot written)")
        )

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


reference_impl.weights_dtypes = WEIGHTS_DTYPES  # the reference runs FP8 weights the released way


def runtime_impl(cfg: AttnV41Cfg, weights, index_keys: str, device, kv_format: str = "bf16"):
    """The runtime (`AttnV41` through `RuntimeStack`) as a golden implementation; caches
    in `kv_format`."""
    from .runtime.stack import RuntimeStack

    return RuntimeStack(cfg, weights, device=device, index_keys=index_keys, kv_format=kv_format)


# FP8 weights run on the CPU (torch ops); on CUDA the runtime itself refuses them.
runtime_impl.weights_dtypes = WEIGHTS_DTYPES


class _SplitDecode:
    """The runtime with decode steps through `DecodeGraphs` (one CUDA graph per step on
    CUDA, the same device-driven step eagerly on the CPU): prefill through `forward`.

    A whole step is one graph, so no layer leaves a run; what each left observable is
    read after the step: its output and ring, the selection it attended with (its index
    source's row of `attn.plan.sel`, trimmed to the window and the visible top-k, the
    rest checked to be −1), on index sources the scores (their row of `plan.scores`)
    and the index-key owner, and on ratio>0 layers the rows its kv source's caches hold
    and the candidate mask."""

    def __init__(self, cfg: AttnV41Cfg, weights, index_keys: str, device, kv_format: str = "bf16"):
        from .runtime.graphs import DecodeGraphs
        from .runtime.stack import RuntimeStack

        self.cfg = cfg
        self.stack = RuntimeStack(cfg, weights, device=device, index_keys=index_keys, kv_format=kv_format)
        self.graphs = DecodeGraphs(self.stack)

    def layer(self, i: int, x: torch.Tensor, start_pos: int):
        return self.stack.layer(i, x, start_pos)

    def decode_step(self, xs, start_pos: int) -> list:
        y = self.graphs.step(xs, start_pos)
        out = []
        for i in range(self.cfg.n_layers):
            cap = _Captured.of(self.cfg, self.stack, i, start_pos, self.graphs.key_owner[i], self.graphs._keys[i])
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
    def of(cls, cfg: AttnV41Cfg, stack, i: int, pos: int, key_owner: int, keys=None) -> _Captured:
        """What layer i's decode step at pos left observable; `keys`: the index-key cache it
        scored (the driver's; default the sequence's published one)."""
        from .compare import _kv_source

        c = cls()
        role = cfg.roles[i]
        plan = stack.attn.plan
        c.kv_win = stack.states[i].values("ring").detach().cpu().clone()
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
            c.compress_kv = st.values("compress_kv", L).detach().cpu().clone()
            c.index_k = st.values("index_k", L).detach().cpu().clone()
            c.observed_from.update(compress_kv=src, index_k=src)
            if role.is_index_source and L > 0:
                keys = stack.shared.index_k if keys is None else keys
                c.index_score = stack.attn.decode_index_score(role, keys, pos).detach().cpu().clone()
                c.index_k_owner = key_owner
            cand = cfg.candidate_source_layer
            cand_ratio = cfg.roles[cand].ratio if cand is not None else 0
            if cand is not None and cand <= i and cand_ratio == r and L > 0:
                c.candidates = plan.cand[:, :L].detach().cpu().clone()
                c.observed_from["candidates"] = cand
        return c


def runtime_split_impl(cfg: AttnV41Cfg, weights, index_keys: str, device, kv_format: str = "bf16"):
    return _SplitDecode(cfg, weights, index_keys, device, kv_format)


runtime_split_impl.weights_dtypes = WEIGHTS_DTYPES


class _ChunkTrace:
    """One layer's trace of a prompt run in chunks, assembled in the one-shot prefill's
    encoding (chunk rows = positions, compressed entries at offset n) so the file's
    prefill tensors compare against it unchanged."""

    def __init__(self):
        self.q = self.kv_win = self.sel = self.o = self.out = None
        self.compress_kv = self.index_k = self.index_score = self.candidates = None
        self.index_k_owner = None


class ChunkedPrefill:
    """A golden implementation (`inner`: reference or runtime) whose prefill runs in
    chunks of `chunk` tokens: the first through `layer` at position 0, the others as
    continuations (m > 1 after 0; a last chunk of one token is a decode step). Each
    layer's calls are assembled into one trace in the one-shot prefill's encoding:
    q, o, out and the window rows concatenated; the selection as positions (the window
    part ascending, −1 padded to min(n, window); compressed entries at offset n, −1
    padded to the one-shot width); scores padded with −∞ and the candidate mask by its
    blocks to the one-shot row count; caches and the key owner as the last chunk left
    them. Decode regimes go to `inner` unchanged."""

    def __init__(self, inner, cfg: AttnV41Cfg, chunk: int):
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"prefill chunk = {chunk!r}; allowed: an int >= 1")
        self.inner, self.cfg, self.chunk = inner, cfg, chunk
        self.attn = _counter(inner)
        if hasattr(inner, "decode_step"):
            self.decode_step = inner.decode_step

    def layer(self, i: int, x: torch.Tensor, start_pos: int):
        return self.inner.layer(i, x, start_pos)

    def prefill_step(self, xs) -> list[_ChunkTrace]:
        cfg = self.cfg
        n = xs[0].shape[0]
        parts: list[list] = [[] for _ in range(cfg.n_layers)]
        for s in range(0, n, self.chunk):
            e = min(n, s + self.chunk)
            for i in range(cfg.n_layers):
                tr = self.inner.layer(i, xs[i][s:e], s)
                parts[i].append((s, e, {k: _cpu_clone(getattr(tr, k, None)) for k in _CHUNK_FIELDS}))
        return [assemble_chunks(cfg, i, parts[i], n) for i in range(cfg.n_layers)]


def assemble_chunks(cfg: AttnV41Cfg, i: int, parts, n: int) -> _ChunkTrace:
    """Layer i's calls over a prompt of n tokens, `parts` = [(start, end, fields)] in
    `AttnV41.forward`'s encoding, as one trace in the one-shot prefill's (`ChunkedPrefill`)."""
    W = cfg.window
    r = cfg.roles[i].ratio
    L = n // r if r else 0
    k = min(cfg.index_topk, L)
    out = _ChunkTrace()
    for f in ("q", "o", "out"):
        setattr(out, f, torch.cat([p[2][f] for p in parts]))
    rows, sels, scores, cands = [], [], [], []
    for s, e, t in parts:
        m = e - s
        decode = s > 0 and m == 1
        kv = t["kv_win"]
        rows.append(kv[s % W : s % W + 1] if decode else kv[-m:])
        wc = W if s > 0 else min(m, W)
        off = W if decode else kv.shape[0]
        base = 0 if s == 0 else max(0, s - W + 1)
        for row in range(m):
            p = s + row
            vals = t["sel"][row].tolist()
            if decode:
                win = [p - W + 1 + c for c, v in enumerate(vals[:wc]) if v >= 0]
            else:
                win = [v + base for v in vals[:wc] if v >= 0]
            win = sorted(win) + [-1] * (min(n, W) - len(win))
            comp = [v - off + n if v >= 0 else -1 for v in vals[wc:]]
            sels.append(win + comp + [-1] * (k - len(comp)))
        # a chunk with no visible row yet scores nothing: −∞ (no candidate) in the one-shot rows
        sc = torch.full((m, L), float("-inf"), dtype=torch.bfloat16)
        if t["index_score"] is not None:
            sc[:, : t["index_score"].shape[1]] = t["index_score"]
        scores.append((t["index_score"] is not None, sc))
        B = cfg.cand_block
        blocks = torch.zeros(m, -(-L // B), dtype=torch.bool)
        if t["candidates"] is not None:
            c = t["candidates"]
            blocks[:, : -(-c.shape[1] // B)] = c[:, ::B]  # a block's mask value, from its first position
        cands.append((t["candidates"] is not None, blocks.repeat_interleave(B, dim=1)[:, :L]))
    out.kv_win = torch.cat(rows)
    out.sel = torch.tensor(sels, dtype=torch.int32)
    last = parts[-1][2]
    out.compress_kv, out.index_k, out.index_k_owner = last["compress_kv"], last["index_k"], last["index_k_owner"]
    if any(made for made, _ in scores):
        out.index_score = torch.cat([v for _, v in scores])
    if any(made for made, _ in cands):
        out.candidates = torch.cat([v for _, v in cands])
    return out


_CHUNK_FIELDS = (
    "q",
    "o",
    "out",
    "kv_win",
    "sel",
    "index_score",
    "candidates",
    "compress_kv",
    "index_k",
    "index_k_owner",
)


def _cpu_clone(v):
    return v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v


class _Trace:
    """A trace from a dict of `AttnV41Run` field names (absent fields None)."""

    def __init__(self, fields: dict):
        for k in _CHUNK_FIELDS:
            setattr(self, k, fields.get(k))


class BatchedGolden:
    """The golden file's sequence in one slot of a batched step (`BatchV41`) beside
    `batch − 1` other sequences of random tokens at other positions and lengths: fresh
    prompts, decode tokens, chunks (half of them then rolled back inside, as a rejected
    verify), restarts when one reaches max_seq. The prefill runs
    whole or in chunks of `chunk` tokens (the others' tokens in the same steps); its
    calls are assembled in the one-shot encoding (`assemble_chunks`), the decode steps
    compared as they are. Every trace of the golden slot is kept in `log`, so two runs
    (batch N and batch 1) can be compared byte for byte. Either variant (`index_keys`
    "own" or "released"; released: no rollbacks). `seed` draws the other sequences, the
    slot and the order in each step."""

    def __init__(
        self,
        cfg: AttnV41Cfg,
        weights,
        index_keys: str,
        device,
        batch: int,
        chunk=None,
        seed: int = 0,
        kv_format: str = "bf16",
    ):
        import random

        from .runtime.batch import BatchV41
        from .synthetic import random_inputs
        from .weights import AttnV41LayerWeights

        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch = {batch!r}; allowed: an int >= 1")
        self.cfg, self.chunk, self.batch = cfg, chunk, batch
        self.rng = random.Random(seed)
        self.bt = BatchV41(cfg, device, n_slots=batch, block_rows=8, kv_format=kv_format, index_keys=index_keys)
        self.attn = self.bt.attn
        self.weights = [
            AttnV41LayerWeights.from_state_dict(cfg.roles[i], weights[i], cfg=cfg, device=self.attn.device)
            for i in range(cfg.n_layers)
        ]
        self.slot = self.rng.randrange(batch)
        self.bt.trace_slot = self.slot
        self.others = {
            sl: random_inputs(cfg, cfg.max_seq, seed + 1000 + sl, device=self.attn.device)
            for sl in range(batch)
            if sl != self.slot
        }
        self.log: list[dict] = []

    def layer(self, i: int, x: torch.Tensor, start_pos: int):
        raise RuntimeError("a batched replay runs whole steps (prefill_step, decode_step)")

    def _step(self, xs, s: int, m: int) -> list[dict]:
        c, pool = self.cfg, self.bt.pool
        room = c.max_tokens - m
        slots, starts, lens, inputs = [self.slot], [s], [m], [xs]
        for sl in sorted(self.others):
            if room == 0:
                break
            ln = pool.length[sl]
            if ln == 0 or ln + 1 > c.max_seq or self.rng.random() < 0.05:
                st, n = 0, self.rng.randint(1, max(1, min(c.max_seq // 2, room)))
            else:
                st, n = ln, self.rng.choice([1, 1, 1, 2, 3, 5])
            n = max(1, min(n, room, c.max_seq - st))
            room -= n
            slots.append(sl)
            starts.append(st)
            lens.append(n)
            inputs.append([x[st : st + n] for x in self.others[sl]])
        order = list(range(len(slots)))
        self.rng.shuffle(order)
        slots, starts, lens, inputs = ([v[j] for j in order] for v in (slots, starts, lens, inputs))
        step = self.bt.begin(slots, starts, lens)
        traces = []
        for i in range(c.n_layers):
            self.bt.forward(self.weights[i], torch.cat([inp[i] for inp in inputs]), step)
            t = {k: _cpu_clone(self.bt.trace.get(k)) for k in _CHUNK_FIELDS}
            traces.append(t)
            self.log.append(t)
        # other sequences that verified draft tokens keep some of them: roll back inside
        # (own index keys only: the released mode has no rollback)
        for sl, st, n in zip(slots, starts, lens):
            if sl != self.slot and st > 0 and 2 <= n <= c.window and self.rng.random() < 0.5:
                if self.bt.index_keys == "own":
                    self.bt.rollback(sl, st + self.rng.randint(0, n - 1))
        return traces

    def prefill_step(self, xs) -> list[_ChunkTrace]:
        cfg = self.cfg
        n = xs[0].shape[0]
        size = n if self.chunk is None else self.chunk
        parts: list[list] = [[] for _ in range(cfg.n_layers)]
        for s in range(0, n, size):
            e = min(n, s + size)
            for i, t in enumerate(self._step([x[s:e] for x in xs], s, e - s)):
                parts[i].append((s, e, t))
        return [assemble_chunks(cfg, i, parts[i], n) for i in range(cfg.n_layers)]

    def decode_step(self, xs, start_pos: int) -> list[_Trace]:
        return [_Trace(t) for t in self._step(xs, start_pos, xs[0].shape[0])]


def batch_invariance(a: BatchedGolden, b: BatchedGolden) -> tuple[int, list[str]]:
    """Compare the golden slot's traces of two batched replays (e.g. batch N and batch 1)
    byte for byte: (tensors compared, descriptions of those that differ)."""
    if len(a.log) != len(b.log):
        return 0, [f"{len(a.log)} against {len(b.log)} layer calls"]
    n, bad = 0, []
    for j, (x, y) in enumerate(zip(a.log, b.log)):
        for k in sorted(set(x) | set(y)):
            u, v = x.get(k), y.get(k)
            n += 1
            if isinstance(u, torch.Tensor) and isinstance(v, torch.Tensor):
                same = u.shape == v.shape and u.dtype == v.dtype and torch.equal(u, v)
            else:
                same = u == v
            if not same:
                bad.append(f"call {j} (layer {j % a.cfg.n_layers}) {k}")
    return n, bad


IMPLS = {"reference": reference_impl, "runtime": runtime_impl, "runtime-split": runtime_split_impl}


def replay(
    golden: GoldenFile,
    variant: str,
    make_impl: Callable[..., Any] = reference_impl,
    device: str | torch.device = "cpu",
    impl_name: str = "reference",
    on_layer: Callable[[LayerReport], None] | None = None,
    prefill_chunk: int | None = None,
    impl=None,
) -> ReplayReport:
    """Run every regime of `golden` in order through a fresh implementation and compare.
    `prefill_chunk`: run the prefill in chunks of that many tokens (`ChunkedPrefill`).
    `impl`: an implementation already built (`BatchedGolden`) instead of `make_impl`'s."""
    if variant not in golden.variants:
        raise GoldenFormatError(f"variant = {variant!r}; allowed: {golden.variants}")
    cfg = golden.cfg
    supported = getattr(make_impl, "weights_dtypes", ("bf16",))
    if golden.weights_dtype not in supported:
        raise GoldenFormatError(
            f"{golden.path}: weights_dtype = {golden.weights_dtype!r}, which impl {impl_name!r} does not run; "
            f"allowed: {list(supported)}"
        )
    golden_w = [golden.weights(i) for i in range(cfg.n_layers)]
    weights = [{k: v.to(device) for k, v in w.items()} for w in golden_w]
    if impl is None:
        impl = make_impl(cfg, weights, INDEX_KEYS_FOR_VARIANT[variant], device)
    if prefill_chunk is not None and not isinstance(impl, BatchedGolden):
        impl = ChunkedPrefill(impl, cfg, prefill_chunk)
    report = ReplayReport(golden.name, variant, impl_name)
    rows_prefill = golden.prefill_rows
    keys: dict[int, torch.Tensor] = {}  # per kv source: our index-key rows as last reported
    for reg in golden.regimes:
        rname, start = reg["name"], int(reg["start_pos"])
        kv_rows = golden.kv_win_rows(rname, rows_prefill)
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
        if start == 0 and hasattr(impl, "prefill_step"):
            step_traces = impl.prefill_step(xs)
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
                kv_rows,
            )
            report.layers.append(lr)
            if on_layer:
                on_layer(lr)
    counter = _counter(impl)
    if counter is not None:
        report.nonfinite = counter.nonfinite_count()
    return report


def _counter(impl):
    """What counts the non-finite values an implementation wrote into its caches: itself
    when it has `nonfinite_count` (`tp.TPStack`), else its runtime (`attn`, `stack.attn`);
    None for the reference."""
    if callable(getattr(impl, "nonfinite_count", None)):
        return impl
    return getattr(impl, "attn", None) or getattr(getattr(impl, "stack", None), "attn", None)


def replay_batched(
    golden: GoldenFile,
    device="cpu",
    batch: int = 8,
    chunk: int | None = None,
    seed: int = 0,
    kv_format: str = "bf16",
    variant: str = "intended",
) -> tuple[ReplayReport, int, list[str]]:
    """`replay` of `variant` through `BatchedGolden` (the golden sequence among
    `batch − 1` others, caches in `kv_format`), then the same sequence alone (batch 1, the
    same chunking, bf16 caches): returns the report, the tensors compared between the two
    runs and those that differ (batch invariance, and with packed caches their equality
    to bf16 caches)."""
    cfg = golden.cfg
    weights = [{k: v.to(device) for k, v in golden.weights(i).items()} for i in range(cfg.n_layers)]
    runs = []
    for n, fmt in ((batch, kv_format), (1, "bf16")):
        impl = BatchedGolden(cfg, weights, INDEX_KEYS_FOR_VARIANT[variant], device, n, chunk, seed, fmt)
        rep = replay(golden, variant, device=device, impl_name=f"runtime-batch{n}", impl=impl)
        runs.append((rep, impl))
    n, bad = batch_invariance(runs[0][1], runs[1][1])
    return runs[0][0], n, bad
