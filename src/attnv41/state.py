"""Per-layer and per-sequence state of the runtime, allocated once at full size.

`AttnV41LayerState` (per layer and sequence): the window ring, and on kv sources the
compressor's partial group and the compressed-KV and index-key caches, sized from
`max_seq`. `SharedV41` (per sequence): what source layers publish, latest writer
wins (attention-v41.md §2). Byte formats: every cache row holds values exact on the
fp8 (ring) or fp4 (caches) grids, as bf16 (kv_format "bf16") or in V4.1's own packed
byte formats (kv_format "packed", `attnv41.packed`): the same values, losslessly.
"""

from __future__ import annotations

import itertools

import torch

from .config import AttnV41Cfg, LayerRole

__all__ = ["AttnV41LayerState", "SharedV41", "KV_FORMATS", "CACHE_FORMATS", "check_kv_format", "cache_widths"]


_SEQ_IDS = itertools.count(1)  # sequence numbers, unique within the process

KV_FORMATS = ("bf16", "packed")
# V4.1's byte format of each cache when kv_format is "packed" (attnv41.packed)
CACHE_FORMATS = {"ring": "fp8_e8m0", "compress_kv": "fp4_e4m3", "index_k": "fp4_e8m0"}


def check_kv_format(kv_format) -> str:
    """kv_format, or ValueError naming it and the allowed values. (Packed rows need
    head_dim and index_head_dim multiples of 32, which every `AttnV41Cfg` has.)"""
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format = {kv_format!r}; allowed: {', '.join(map(repr, KV_FORMATS))}")
    return kv_format


def cache_widths(cfg: AttnV41Cfg, kv_format: str) -> dict[str, int]:
    """Columns of each cache: values (bf16) or bytes (packed)."""
    if kv_format == "bf16":
        return {"ring": cfg.head_dim, "compress_kv": cfg.head_dim, "index_k": cfg.index_head_dim}
    from .packed import row_bytes  # noqa: PLC0415

    return {
        "ring": row_bytes(CACHE_FORMATS["ring"], cfg.head_dim),
        "compress_kv": row_bytes(CACHE_FORMATS["compress_kv"], cfg.head_dim),
        "index_k": row_bytes(CACHE_FORMATS["index_k"], cfg.index_head_dim),
    }


class AttnV41LayerState:
    """One layer's state for one sequence.

    kv_format:   "bf16" (the caches below hold bf16 values) or "packed" (they hold V4.1's
                 byte formats, uint8 rows, `CACHE_FORMATS`/`attnv41.packed`: the same values;
                 `values` unpacks). Shapes below are the bf16 ones; packed rows are
                 `cache_widths` bytes wide. Zero bytes are zero values in both.
    ring:        bf16 [window, head_dim]; position p in slot p % window; never written = 0.
    comp_a/g:    fp32 [r, head_dim] (kv sources, r >= 2): token p in slot p % r; g = −∞ where empty.
    compress_kv: bf16 [⌈max_seq / r⌉, head_dim] (kv sources): rows 0..n_rows−1 valid; at
                 decode, row n_rows holds the group in progress (rewritten every step until
                 the group completes; never read before).
    index_k:     bf16 [⌈max_seq / r⌉, index_head_dim] (kv sources), likewise.
    next_pos:    the position after this layer's last call (eager calls and `DecodeGraphs`
                 keep it; a decode step you replay from your own CUDA graph does not).
    seq_id:      the sequence (`SharedV41.seq_id`) this state was prefilled in; None before.
    cfg:         the geometry it was allocated for (the runtime refuses a state of another).
    """

    def __init__(self, cfg: AttnV41Cfg, role: LayerRole, device: torch.device | str, kv_format: str = "bf16"):
        dev = torch.device(device)
        self.cfg = cfg
        self.role = role
        self.kv_format = check_kv_format(kv_format)
        self.seq_id: int | None = None
        widths = cache_widths(cfg, kv_format)
        dt = torch.uint8 if kv_format == "packed" else torch.bfloat16
        self.ring = torch.zeros(cfg.window, widths["ring"], dtype=dt, device=dev)
        self.comp_a = self.comp_g = self.compress_kv = self.index_k = None
        if role.is_kv_source:
            r = role.ratio
            rows = -(-cfg.max_seq // r)  # the last group may be in progress at max_seq − 1
            self.compress_kv = torch.zeros(rows, widths["compress_kv"], dtype=dt, device=dev)
            self.index_k = torch.zeros(rows, widths["index_k"], dtype=dt, device=dev)
            if r >= 2:
                self.comp_a = torch.zeros(r, cfg.head_dim, dtype=torch.float32, device=dev)
                self.comp_g = torch.full((r, cfg.head_dim), float("-inf"), dtype=torch.float32, device=dev)
        self.n_rows = 0
        self.next_pos = 0
        # What `AttnV41.rollback` needs after a continuation of at most `window` tokens
        # (allocated by the first such call): the ring before it, the compressor inputs of
        # its groups, the positions it spans and the shared state's call count after it.
        self.undo: dict | None = None

    def reset(self) -> None:
        """Forget the sequence (a new one starts at position 0)."""
        if self.undo is not None:
            self.undo.clear()
        self.ring.zero_()
        if self.comp_g is not None:
            self.comp_a.zero_()
            self.comp_g.fill_(float("-inf"))
        self.n_rows = 0
        self.next_pos = 0
        self.seq_id = None

    def values(self, name: str, rows: int | None = None) -> torch.Tensor:
        """bf16 values of `ring`, `compress_kv` or `index_k` (its first `rows` rows): the
        tensor itself with bf16 caches, unpacked (exact) with packed ones."""
        t = getattr(self, name)[:rows]
        if self.kv_format != "packed":
            return t
        from .packed import unpack  # noqa: PLC0415

        return unpack(t, CACHE_FORMATS[name], self.cfg.index_head_dim if name == "index_k" else self.cfg.head_dim)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every state tensor by name (for snapshots in tests and debugging)."""
        d = {"ring": self.ring}
        for k in ("comp_a", "comp_g", "compress_kv", "index_k"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d


class SharedV41:
    """What source layers publish for one sequence, latest writer wins.

    compress_kv / compress_ratio / n_compressed: the latest kv source's cache (a
        reference to its state tensor, not a copy), its ratio and valid row count.
    index_k / index_k_owner: the index-key cache published last and which layer owns it.
    topk_idxs: int32 [max_tokens, index_topk]; rows [:topk_m], columns [:topk_k] hold the
        latest index source's selection (already offset, −1 padded) for the call at
        `topk_pos`.
    candidates: bool [m, L] mask of the candidate source for the call at `candidates_pos`,
        or, after a call scored in tiles of tokens (`AttnV41.index_tile_entries`), its
        kept block ids, int32 [m, ≤ cand_blocks] (`kernels.select.candidate_blocks`).
    sources: the kv sources' states of this sequence by layer (bound at their prefill), so
        a decode step prepared without the state (`decode_prep`) publishes their caches.

    At decode the selections live on the device (`AttnV41.plan.sel`, one row per index
    source); `topk_idxs` holds the prefill's, and the host fields (`topk_k`, `topk_pos`, …)
    describe every published selection.

    Order bookkeeping (host ints; layers run strictly in order, one step after another):
    `step_pos`/`step_end` are the positions of the step in progress (or the last one),
    `last_layer` the layer that ran last in it (n_layers − 1: the step is complete), and
    `seq_id` a number unique to each sequence (new at every reset), which layer states are
    bound to at their prefill, so a state of another sequence is refused. `failed`: set
    when a layer call or graph step raised part-way through its writes (an out-of-memory
    error, an interrupt); until the next prefill from 0 (or `continue_at`) every call of
    the sequence but a new one is refused, since re-running a half-run call does not give
    its bytes (it would read ring slots it already overwrote).
    """

    def __init__(self, cfg: AttnV41Cfg, device: torch.device | str):
        dev = torch.device(device)
        self.cfg = cfg
        self.topk_idxs = torch.full((cfg.max_tokens, cfg.index_topk), -1, dtype=torch.int32, device=dev)
        self.topk_version = 0  # +1 on every publish, never reset: tells a changed selection apart
        self.calls = 0  # +1 on every layer call (or graph step) bookkept, never reset: dates undo logs
        self.reset()

    def reset(self) -> None:
        self.compress_kv: torch.Tensor | None = None
        self.compress_ratio = 0
        self.n_compressed = 0
        self.index_k: torch.Tensor | None = None
        self.index_k_owner = -1
        self.topk_m = 0
        self.topk_k = 0
        self.topk_pos = -1
        self.candidates: torch.Tensor | None = None
        self.candidates_pos = -1
        self.sources: dict[int, AttnV41LayerState] = {}
        self.last_layer = -1  # the layer that ran last, and the positions of its call:
        self.step_pos = -1  # layers run strictly in order, layer i right after layer i−1
        self.step_end = -1  # start_pos + m of the step in progress (the next step starts there)
        # (layer, pos, order state before) of this sequence's last decode_prep: it may be
        # prepared again while its order state is still the one that prep left
        self.prepared: tuple[int, int, tuple[int, int, int]] | None = None
        # (layer, or None for a whole graph step, or "rollback"; its position) of a call that
        # raised part-way through its writes: the caches hold part of it, so only a new
        # sequence may follow
        self.failed: tuple[int | str | None, int] | None = None
        self.seq_id = next(_SEQ_IDS)

    def continue_at(self, states, next_pos: int) -> None:
        """Bookkeeping for a context written straight into the caches (benchmarks, tests):
        bind `states` to this sequence and mark the step ending at `next_pos` complete, so
        the next decode step starts there."""
        n, hi = self.cfg.n_layers, self.cfg.max_seq
        if isinstance(next_pos, bool) or not isinstance(next_pos, int) or not 1 <= next_pos <= hi:
            raise ValueError(f"next_pos = {next_pos!r}; allowed: 1..{hi} (max_seq)")
        if len(states) != n or any(st.role.layer != i for i, st in enumerate(states)):
            got = [getattr(getattr(st, "role", None), "layer", None) for st in states]
            raise ValueError(f"states of layers {got}; allowed: one per layer, in order (n_layers = {n})")
        self.prepared = None
        self.failed = None  # the caller vouches for the caches' contents
        self.calls += 1  # the caches are the caller's now: undo logs of earlier calls are stale
        for st in states:
            st.seq_id, st.next_pos = self.seq_id, next_pos
            if st.role.is_kv_source:
                self.sources[st.role.layer] = st
        self.last_layer, self.step_pos, self.step_end = len(states) - 1, next_pos - 1, next_pos

    def snapshot(self) -> dict:
        """Host fields and cloned tensors, for tests that check a failed call changed nothing."""
        d = {k: v for k, v in vars(self).items() if not isinstance(v, torch.Tensor) and k != "sources"}
        d["sources"] = dict(self.sources)
        d["topk_idxs"] = self.topk_idxs.clone()
        d["compress_kv_id"] = None if self.compress_kv is None else self.compress_kv.data_ptr()
        d["index_k_id"] = None if self.index_k is None else self.index_k.data_ptr()
        d["candidates"] = None if self.candidates is None else self.candidates.clone()
        return d
