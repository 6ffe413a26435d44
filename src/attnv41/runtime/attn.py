"""`AttnV41`: the attention runtime shared by all layers of a model.

Built once per model and device: the plain and YaRN RoPE tables for `max_seq`
positions and every workspace for `max_tokens` tokens. `forward` runs one layer for
m tokens (a prefill from position 0, or one decode token) and returns an
`AttnV41Run` of views into the workspaces, valid until the next call.

The kernels come from one table (`runtime/ops.py`): Triton on CUDA, torch twins on the
CPU. Projections go through torch (cuBLAS on CUDA). A decode token runs from device
metadata (`plan.py`): every role's step can be captured, and `DecodeGraphs` captures a
whole step as one graph.

Weights come in two formats (`AttnV41LayerWeights.format`): bf16, and the released
checkpoint's FP8, whose linears run through `ops.fp8_mm` (`_linear`, the one place that
picks by format): the Triton FP8 kernel on CUDA (`kernels/fp8_linear.py`), the exact
released math on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import AttnV41Cfg
from ..kernels import fp8_linear, gemv, select, sparse_attn_split, tc_mm
from ..kernels._triton import check_kernel_device, counters_of
from ..packed import pack
from ..reference.rope import rope_freqs, rope_table
from ..state import CACHE_FORMATS, AttnV41LayerState, SharedV41, cache_widths, check_kv_format
from ..weights import AttnV41LayerWeights
from . import decode as _decode
from .checks import AttnChecks, not_an_int
from .decode import AttnDecode, _dense_rows, _Ticket
from .device import check_device, on_own_device
from .ops import TORCH_OPS, TRITON_OPS, Ops, compacts, ops_for, prompt_tokens
from .plan import DEFAULT_BUCKET_MIN, DecodePlan

__all__ = ["AttnV41", "AttnV41Run", "INDEX_KEY_MODES"]

INDEX_KEY_MODES = ("own", "released")


# the format of each cache-backed field of a run when the caches are packed (attnv41.packed)
_RUN_FORMATS = {"rows_win": "fp8_e8m0", "rows_comp": "fp4_e4m3", "compress_kv": "fp4_e4m3", "index_k": "fp4_e8m0"}


@dataclass
class AttnV41Run:
    """What one `forward` returns; tensors are views into workspaces or state, valid
    until the next call.

    q:        bf16 [m, n_heads, head_dim], after RoPE.
    rows_win: bf16 window rows attention read (prefill: the chunk's kv [m, D]; decode:
              the ring [window, D] after this token's write). Also `kv_win`.
    rows_comp: bf16 [n_comp, D], the shared compressed rows read (n_comp = 0 on ratio 0).
    n_win, n_comp: the row counts; `offset` = where compressed rows start in `idx`.
    idx:      int32 [m, window_cols + topk], the selection sparse attention used.
    topk:     the width of its compressed part.
    o:        bf16 [m, n_heads, head_dim], attention output before the inverse rotation.
    out:      bf16 [m, dim], the layer output (a view of `AttnV41.out`).
    On index sources also `index_score` (bf16 [m, L]) and `index_k_owner`; on kv sources
    `compress_kv`/`index_k` (the layer's caches, rows [:L]); on the candidate source
    `candidates` (bool [m, L]).
    kv_format: the caches' format. With "packed" the cache-backed fields (rows_win of a
    decode step, rows_comp, compress_kv, index_k) are stored as the caches hold them,
    V4.1's byte formats (`stored(name)`), and unpacked to their bf16 values (exact) only
    when read: a run of a long context costs nothing until a field is looked at.
    """

    q: torch.Tensor
    rows_win: torch.Tensor
    rows_comp: torch.Tensor
    n_win: int
    n_comp: int
    offset: int
    idx: torch.Tensor
    topk: int
    o: torch.Tensor
    out: torch.Tensor
    index_score: torch.Tensor | None = None
    index_k_owner: int | None = None
    compress_kv: torch.Tensor | None = None
    index_k: torch.Tensor | None = None
    candidates: torch.Tensor | None = None
    kv_format: str = "bf16"

    def stored(self, name: str) -> torch.Tensor | None:
        """A field as stored (uint8 packed rows where the caches are packed)."""
        return object.__getattribute__(self, name)

    def __getattribute__(self, name: str):
        v = object.__getattribute__(self, name)
        if name in _RUN_FORMATS and isinstance(v, torch.Tensor) and v.dtype == torch.uint8:
            from ..packed import unpack  # noqa: PLC0415

            width = object.__getattribute__(self, "q").shape[2] if name != "index_k" else None
            if width is None:  # an index key of d values takes d/2 + d/32 bytes
                width = v.shape[1] * 32 // 17
            return unpack(v, _RUN_FORMATS[name], width)
        return v

    # golden-file names
    @property
    def kv_win(self) -> torch.Tensor:
        return self.rows_win

    @property
    def sel(self) -> torch.Tensor:
        return self.idx


INDEX_TILE_ENTRIES = 1 << 26  # index scores (tokens × keys) held at once in a prefill or continuation


class AttnV41(AttnChecks, AttnDecode):
    """RoPE tables, workspaces and kernels for V4.1 attention on one device.

    Memory: the tables take `2·max_seq·rope_dim` fp32 values; the workspaces
    O(max_tokens·n_heads·head_dim) bf16; the decode plan (`plan`, a `DecodePlan`: the
    device position, step metadata, per-index-source scores and selections) O(n_index_sources
    ·max_seq) bf16. Caches live in `AttnV41LayerState`. The index path (candidate mask,
    top-k) still allocates its temporaries per call through torch's caching allocator
    (inside a captured graph: from its pool, once); every other buffer is allocated here,
    once. `bucket_min` sets the smallest context bucket a decode step's index work covers;
    `plan` may be a `DecodePlan` the caller built (and owns), e.g. around its own
    position buffer. A prefill or continuation of m tokens over L index keys scores at
    most `index_tile_entries` (m·L) entries at a time (default 2²⁶: 128 MiB of bf16 scores,
    about 1.3 GiB with the top-k's sort): longer ones are scored in tiles of tokens, with
    the same bits, so a chunk at a 1M-token context needs no `[m, L]` buffer.

    Checks on every call (host-side, no device sync): arguments, positions, the order of
    layers and steps of the sequence, that weights, state and shared state belong to this
    config and the state to this sequence, and that a decode_body follows its own
    decode_prep. Weight shapes and dtypes are checked once per weights object and again
    whenever one of its tensors is replaced; tensor VALUES are not checked per call (the
    loaders reject non-finite weights). Non-finite activations: `nonfinite_count()`
    reports how many non-finite values entered a cache write (counted on the device; a
    NaN row in a cache stays there and can keep being selected, so watch it); with
    `check_finite=True` every eager call first checks `x` (a host sync) and raises before
    writing anything. Captured replays are not checked; the counter still counts.
    """

    def __init__(
        self,
        cfg: AttnV41Cfg,
        device: torch.device | str = "cpu",
        index_keys: str = "own",
        ops: str | Ops | None = None,
        check_finite: bool = False,
        bucket_min: int = DEFAULT_BUCKET_MIN,
        plan: DecodePlan | None = None,
        index_tile_entries: int = INDEX_TILE_ENTRIES,
        kv_format: str = "bf16",
    ):
        if not isinstance(index_tile_entries, int) or isinstance(index_tile_entries, bool) or index_tile_entries < 1:
            raise ValueError(f"index_tile_entries = {index_tile_entries!r}; allowed: an int >= 1")
        self.index_tile_entries = index_tile_entries
        if index_keys not in INDEX_KEY_MODES:
            raise ValueError(f"index_keys = {index_keys!r}; allowed: {INDEX_KEY_MODES}")
        if not isinstance(cfg, AttnV41Cfg):  # validated on construction (decode width included)
            raise TypeError(f"cfg is a {type(cfg).__name__}; allowed: AttnV41Cfg")
        self.cfg = cfg
        self.kv_format = check_kv_format(kv_format)
        self.device = check_device(device)
        self.index_keys = index_keys
        if not isinstance(check_finite, bool):
            raise TypeError(f"check_finite = {check_finite!r}; allowed: True or False")
        self.check_finite = check_finite
        if ops is None:
            self.ops = ops_for(self.device)
        elif isinstance(ops, Ops):
            self.ops = ops
        else:
            table = {"torch": TORCH_OPS, "triton": TRITON_OPS}
            if ops not in table:
                raise ValueError(f"ops = {ops!r}; allowed: {tuple(table)}")
            self.ops = table[ops]
        if self.device.type == "cuda" and self.ops.name.startswith("triton"):  # before anything is allocated
            check_kernel_device(self.device, "AttnV41", packed=self.kv_format == "packed")
        dev, c = self.device, cfg
        # the split kernels' arrival counters of this runtime (`counters_of`: its calls take
        # these, not the module-wide ones, so runtimes may run at once on other streams),
        # allocated before any capture
        self.counters: dict = {}
        with counters_of(self.counters):
            if self.ops.fp8_mm is fp8_linear.fp8_mm and dev.type == "cuda":
                fp8_linear.prepare(dev)
            if self.ops.mm_many is gemv.mm_many and dev.type == "cuda":
                gemv.prepare(dev)
            if self.ops.mm_many is tc_mm.mm_many_batch and dev.type == "cuda":
                tc_mm.prepare(dev)  # the split-K counters
            split = (sparse_attn_split.sparse_attn_split, sparse_attn_split.sparse_attn_batch)
            if self.ops.sparse_attn_decode in split and dev.type == "cuda":
                sparse_attn_split.prepare(dev)  # the block-parallel combine's counters
        yarn = (c.rope_factor, c.original_seq_len, c.beta_fast, c.beta_slow)
        self.plain_cos, self.plain_sin = (
            t.to(dev) for t in rope_table(c.max_seq, rope_freqs(c.rope_dim, c.rope_theta))
        )
        self.yarn_cos, self.yarn_sin = (
            t.to(dev) for t in rope_table(c.max_seq, rope_freqs(c.rope_dim, c.compress_rope_theta, yarn))
        )
        M, H, D = c.max_tokens, c.n_heads, c.head_dim
        bf = dict(dtype=torch.bfloat16, device=dev)
        self.iota = torch.arange(c.max_seq, dtype=torch.int32, device=dev)  # positions are views of it
        self.row_pos = torch.empty(M, dtype=torch.int32, device=dev)  # positions of new compressed rows
        self.c_pre = torch.empty(M, c.q_rank, **bf)
        self.c = torch.empty(M, c.q_rank, **bf)
        self.q = torch.empty(M, H, D, **bf)
        self.kv = torch.empty(M, D, **bf)
        self.o = torch.empty(M, H, D, **bf)
        self.o_rot = torch.empty(M, H, D, **bf)
        self.u = torch.empty(M, c.groups * c.o_rank, **bf)
        # cq's FP8 round trip for decode-sized calls (`_preq`), made by q_norm's kernel: the
        # FP8 GEMV reads it instead of quantizing cq in every program (same bits)
        self.c_q = torch.empty(min(M, gemv.DECODE_MAX_M), c.q_rank, **bf)
        self.out = torch.empty(M, c.dim, **bf)
        self.sel = torch.empty(M, c.window + c.index_topk, dtype=torch.int32, device=dev)
        self.iq = torch.empty(M, c.index_heads, c.index_head_dim, **bf)
        self.hw = torch.empty(M, c.index_heads, **bf)
        self.neg_inf = torch.full((), float("-inf"), **bf)  # masks the scores of non-candidate blocks
        self.lat_pre = torch.empty(M, D, **bf)
        self.latent = torch.empty(M, D, **bf)
        self.rows_tmp = torch.empty(M, D, **bf)
        self.k_pre = torch.empty(M, c.index_head_dim, **bf)
        self.k_rows = torch.empty(M, c.index_head_dim, **bf)
        # a call's compressor inputs, after the group in progress before it (< max ratio tokens)
        r_max = max(c.compress_ratios)
        self.comp_a = torch.empty(M + r_max, D, dtype=torch.float32, device=dev)
        self.comp_g = torch.empty(M + r_max, D, dtype=torch.float32, device=dev)
        self.pooled = torch.empty(M // 2 + 1, D, dtype=torch.float32, device=dev)
        # a continuation's window rows: the ring's earlier rows, then the call's own
        self.ctx = torch.empty(M + c.window - 1, D, **bf)
        self.ctx_packed = None  # kv_format "packed": a continuation's window rows, packed
        if self.kv_format == "packed":
            self.ctx_packed = torch.empty(
                M + c.window - 1, cache_widths(c, "packed")["ring"], dtype=torch.uint8, device=dev
            )
        self._empty_rows = torch.zeros(0, D, **bf)
        # Non-finite values that entered a cache write (ring, compressed KV, index keys),
        # counted on the device by the quantizers that write them: no host sync.
        self.nonfinite = torch.zeros(1, dtype=torch.int64, device=dev)
        # the decode steps' second stream under capture (`decode.SIDE_STREAM`)
        self._side = torch.cuda.Stream(device=dev) if dev.type == "cuda" else None
        # Decode steps run from device metadata: the position and everything derived from
        # it (window slots, visible rows, compressor slot and completion, the selections).
        if plan is None:
            plan = DecodePlan(cfg, dev, bucket_min)
        elif not isinstance(plan, DecodePlan):
            raise TypeError(f"plan is a {type(plan).__name__}; allowed: None or a DecodePlan")
        elif plan.device != dev or (plan.cfg is not cfg and plan.cfg != cfg):
            raise ValueError(f"plan was built for {plan.device} and another config; allowed: this runtime's ({dev})")
        self.plan = plan  # the caller may own it (and the position buffer inside it)
        self.dec_pos = self.plan.pos
        self._ticket: _Ticket | None = None  # the last decode_prep, which decode_body must match
        self._prepared: dict[int, torch.Tensor | None] = {}  # per layer: the keys its last prep chose
        self._freed = False

    # ------------------------------------------------------------------ lifetime
    def free(self) -> None:
        """Release every workspace and table; safe to call twice."""
        if self._freed:
            return
        for k, v in list(vars(self).items()):
            if isinstance(v, torch.Tensor):
                setattr(self, k, None)
        self.plan = None
        self._prepared = {}
        self._ticket = None
        self.counters.clear()  # the split kernels' arrival counters (a few MiB with tc_mm's)
        self._freed = True

    def nonfinite_count(self) -> int:
        """Non-finite values (NaN, ±inf) that entered a cache write (window ring, compressed
        KV, index keys) since construction or `reset_nonfinite()`: counted on the device
        by the kernels that write the caches; reading it synchronises."""
        self._check_freed("nonfinite_count")
        return int(self.nonfinite.item())

    def reset_nonfinite(self) -> None:
        self._check_freed("reset_nonfinite")
        self.nonfinite.zero_()

    def new_layer_state(self, layer: int) -> AttnV41LayerState:
        self._check_freed("new_layer_state")
        return AttnV41LayerState(self.cfg, self.cfg.role(layer), self.device, self.kv_format)

    def new_shared(self) -> SharedV41:
        self._check_freed("new_shared")
        return SharedV41(self.cfg, self.device)

    # ------------------------------------------------------------------ forward
    @on_own_device(lambda self: self)
    @torch.no_grad()  # an inference runtime: x and weights may require grad, nothing is recorded
    def forward(
        self, w: AttnV41LayerWeights, st: AttnV41LayerState, shared: SharedV41, x: torch.Tensor, start_pos: int
    ) -> AttnV41Run:
        """One layer's attention for the m tokens of `x` (bf16 `[m, dim]`, the normed input)
        at positions `start_pos …` (`m <= max_tokens`): a prefill from 0, one decode
        token, or a continuation: m > 1 tokens after position 0 (a chunk of a prompt, or
        draft tokens to verify). A continuation presents every token's window as decode
        does (`select.window_selection`) and runs the decode regime's attention, so each
        of its tokens equals the token-by-token decode; on the CPU bit for bit. A
        continuation of at most `window` tokens keeps what `rollback` needs to return the
        sequence to any position inside it.

        Host synchronisation points: none. A prefill's widths and slices follow from `m`,
        which the host knows. A decode token runs the device-driven step that
        `decode_prep`/`decode_body` and `DecodeGraphs` run (the same kernels, reading
        the position and everything derived from it from `plan`); the host keeps only
        its bookkeeping (counts, the order of layers and steps) and slices the returned
        views to the visible lengths.
        """
        self._check(w, st, shared, x, start_pos)
        x = _dense_rows(x)
        try:
            if start_pos > 0 and x.shape[0] == 1:
                return self._forward_decode(w, st, shared, x, start_pos)
            return self._forward_tokens(w, st, shared, x, start_pos)
        except BaseException:
            shared.failed = (w.role.layer, start_pos)  # part of the call may be written: a new sequence only
            raise

    def _forward_tokens(
        self, w: AttnV41LayerWeights, st: AttnV41LayerState, shared: SharedV41, x: torch.Tensor, s: int
    ) -> AttnV41Run:
        """`forward` of a prefill (s = 0) or a continuation (s > 0, m > 1), checked."""
        c, ops = self.cfg, self.ops
        role = w.role
        i, r, m = role.layer, role.ratio, x.shape[0]
        W = c.window
        cont = s > 0
        if not cont:
            if i == 0:
                shared.reset()
            st.reset()
            st.seq_id = shared.seq_id
            if role.is_kv_source:
                shared.sources[i] = st
        pos = self.iota[s : s + m]
        cos, sin = self._tables(r)
        log = cont and m <= W  # what rollback needs, taken before anything is written
        if log:
            self._log_undo(st, s, m)
        elif st.undo is not None:
            st.undo.clear()
        n_prev = min(s, W - 1)  # a continuation's earlier window rows, read before the ring is written
        # A continuation's window: the ring's earlier rows, then the new ones. With packed
        # caches it stays packed (ring bytes, the new rows packed: exact, they lie on the fp8
        # grid), so the decode attention reads window and compressed rows alike.
        packed = self.kv_format == "packed"
        ctx = self.ctx_packed if packed else self.ctx
        if cont:
            slots = torch.remainder(self.iota[s - n_prev : s], W)
            torch.index_select(st.ring, 0, slots, out=ctx[:n_prev])

        # §4: q, kv and the window
        cq, q, kv, hw_done = self._qkv(w, x, pos, cos, sin, m, st.ring)
        if cont:
            win = ctx[: n_prev + m]
            win[n_prev:].copy_(pack(kv, CACHE_FORMATS["ring"], check=False) if packed else kv)
        else:
            win = kv
        offset = win.shape[0]
        wsel = ops.window_selection(self.sel, m, s, W)
        n_wc = wsel.shape[1]

        run_extra: dict = {}
        comp = self._empty_rows
        k = 0
        if r > 0:
            L = (s + m) // r
            vis = torch.div(pos + 1, r, rounding_mode="floor")
            new_rows = 0
            if role.is_kv_source:
                new_rows = self._compress(w, st, x, s)
                shared.compress_kv, shared.compress_ratio, shared.n_compressed = st.compress_kv, r, st.n_rows
                run_extra["compress_kv"] = st.compress_kv[:L]
                run_extra["index_k"] = st.index_k[:L]
            if role.is_index_source:
                if role.is_kv_source and (self.index_keys == "own" or new_rows > 0):
                    shared.index_k, shared.index_k_owner = st.index_k, i
                if L > 0:
                    kk = min(c.index_topk, L)
                    tile = max(1, self.index_tile_entries // L)  # tokens scored at a time
                    if role.uses_candidates and compacts(ops, c, L) and not role.is_candidate_source:
                        # the record only where the full form keeps one (no [m, L] buffer past the tile budget)
                        rec = self._reindex_compact(
                            w, shared, cq, x, pos, vis, L, kk, offset, cos, sin, hw_done, tile >= m
                        )
                        if rec is not None:
                            run_extra["index_score"] = rec
                    elif tile >= m:
                        scores = self._index_scores(w, cq, x, pos, vis, shared.index_k[:L], cos, sin, hw_done=hw_done)
                        if role.is_candidate_source:
                            shared.candidates = ops.candidate_mask(scores, vis, c.cand_blocks, c.cand_block)
                            shared.candidates_pos = s
                            run_extra["candidates"] = shared.candidates
                        if role.uses_candidates:
                            scores = scores.masked_fill(~self._candidates(shared, 0, m, L), float("-inf"))
                        ops.topk_select(scores, vis, kk, offset, out=shared.topk_idxs)
                        run_extra["index_score"] = scores
                    else:
                        self._index_tiled(w, shared, cq, x, pos, vis, L, kk, offset, cos, sin, hw_done, tile, s)
                    shared.topk_m, shared.topk_k, shared.topk_pos = m, kk, s
                    shared.topk_version += 1
                    run_extra["index_k_owner"] = shared.index_k_owner
            if L > 0:
                k = shared.topk_k
                self.sel[:m, n_wc : n_wc + k].copy_(shared.topk_idxs[:m, :k])
                comp = shared.compress_kv[:L]
        sel = self.sel[:m, : n_wc + k]
        # Launch at the class's fixed width (−1 padding changes no output bit), so the
        # kernel sees one selection width per class instead of one per context length.
        width = self._width(r)
        self.sel[:m, n_wc + k : width].fill_(-1)

        # §7: sparse attention with the sink; §8: inverse RoPE, grouped low-rank output.
        # A continuation takes the decode regime's attention (with the inverse RoPE in its
        # epilogue), so its tokens' bits are decode's.
        sink, scale = w["attn_sink"], c.head_dim**-0.5
        if cont:
            rot = (cos, sin, pos, self.o_rot[:m])
            o = ops.sparse_attn_decode(q, win, comp, self.sel[:m, :width], offset, sink, scale, out=self.o[:m], rot=rot)
            out = self._output(w, o, pos, cos, sin, m, rotated=True)
        else:
            o = ops.sparse_attn(q, win, comp, self.sel[:m, :width], offset, sink, scale, out=self.o[:m])
            out = self._output(w, o, pos, cos, sin, m)

        st.next_pos = s + m
        self._advance(shared, i, s, m)
        if log:
            st.undo["calls"] = shared.calls
        self._ticket = None  # a decode_prep before this call can no longer be run
        shared.prepared = None
        return AttnV41Run(
            q=q,
            rows_win=win,
            rows_comp=comp,
            n_win=win.shape[0],
            n_comp=comp.shape[0],
            offset=offset,
            idx=sel,
            topk=k,
            o=o,
            out=out,
            kv_format=self.kv_format,
            **run_extra,
        )

    # ------------------------------------------------------------------ rollback
    def _log_undo(self, st: AttnV41LayerState, s: int, m: int) -> None:
        """Before a continuation of m <= window tokens at s writes anything: the ring as it
        is (its slots of positions ≥ any rollback target are restored from it). The
        compressor's inputs of the call's groups are logged by `_compress`."""
        c = self.cfg
        u = st.undo
        if u is None:
            u = st.undo = {}
        if "ring" not in u:
            u["ring"] = torch.empty_like(st.ring)
            if st.comp_a is not None:
                rows = c.window + st.role.ratio - 1
                u["a"] = torch.empty(rows, c.head_dim, dtype=torch.float32, device=self.device)
                u["g"] = torch.empty_like(u["a"])
        u["ring"].copy_(st.ring)
        u["span"] = (s, s + m)
        u["calls"] = -1  # set once the call has run
        if st.comp_a is not None:
            u["a0"] = (s // st.role.ratio) * st.role.ratio  # the position of u["a"][0]

    @on_own_device(lambda self: self)
    def rollback(self, states, shared: SharedV41, pos: int) -> None:
        """Return a sequence to position `pos`, as if it had run only up to `pos − 1`:
        the next step starts at `pos`. For speculative decoding: verify k draft tokens
        in one continuation (`forward` with m = k at the next position), keep the
        accepted prefix, roll back to the first rejected one.

        states: the sequence's layer states, all `n_layers` in order; shared: its shared
        state. Allowed: `pos` inside the sequence's last step when that step was a
        continuation of at most `window` tokens (m > 1 after position 0; it kept an
        undo log), `s ≤ pos ≤` the current end; again after a rollback, down to s.
        `index_keys="own"` only, but for the no-op pos = end (in released mode which
        keys a layer scores depends on the call history). What is restored: the window ring's slots of positions ≥ pos,
        the compressor's row count and its group in progress; rows past the new count
        stay in the caches, unread (never visible), and are rewritten as positions
        advance. Everything is checked before anything changes; a refused call changes
        nothing. Eager only (host bookkeeping; not during graph capture)."""
        self._check_live("rollback")
        self._check_shared(shared)
        c, n = self.cfg, self.cfg.n_layers
        if not isinstance(states, (list, tuple)) or len(states) != n:
            got = f"a {type(states).__name__}" + (f" of {len(states)}" if isinstance(states, (list, tuple)) else "")
            raise ValueError(f"states is {got}; allowed: the sequence's {n} layer states, in layer order")
        for i, st in enumerate(states):
            self._check_state(st, c.roles[i])
            self._check_bound(st, shared)
        if isinstance(pos, bool) or not isinstance(pos, int):
            raise not_an_int("pos", pos)
        self._check_failed(shared, f"rollback to {pos}")
        if shared.last_layer != n - 1:
            raise ValueError(
                f"rollback during a step (layer {shared.last_layer} ran last); allowed: after layer {n - 1}"
            )
        end = shared.step_end
        if pos == end:
            return
        if self.index_keys != "own":
            raise ValueError(
                f"rollback to {pos} with index_keys = {self.index_keys!r}; allowed: 'own', or pos = {end} (no change)"
            )
        logs = [st.undo or {} for st in states]
        span = logs[-1].get("span")
        calls = logs[-1].get("calls", -1)
        ok = calls == shared.calls and all(
            u.get("span") == span and u.get("calls") == calls - (n - 1 - i) for i, u in enumerate(logs)
        )
        if not ok:
            raise ValueError(
                f"rollback to {pos}: the last step (positions {shared.step_pos}..{end - 1}) kept no undo log; "
                f"allowed: pos = {end} (no change), or a position inside the last step when it was a "
                f"continuation of 2..{c.window} tokens"
            )
        s = span[0]
        if not s <= pos <= end:
            raise ValueError(f"pos = {pos}; allowed: {s}..{end} (inside the last continuation, up to the current end)")
        try:
            self._rollback_states(states, shared, pos, end)
        except BaseException:  # part of the caches restored, part not: a new sequence only
            shared.failed = ("rollback", pos)
            raise

    def _rollback_states(self, states, shared: SharedV41, pos: int, end: int) -> None:
        """`rollback`'s writes, checked: ring slots, compressor rows and group, bookkeeping."""
        W = self.cfg.window
        slots = torch.remainder(self.iota[pos:end], W).long()
        for st in states:
            u = st.undo
            st.ring.index_copy_(0, slots, u["ring"].index_select(0, slots))
            r = st.role.ratio
            if st.role.is_kv_source:
                st.n_rows = pos // r
                if r >= 2:
                    g0 = (pos // r) * r
                    h, a0 = pos - g0, u["a0"]
                    st.comp_a[:h].copy_(u["a"][g0 - a0 : pos - a0])
                    st.comp_g[:h].copy_(u["g"][g0 - a0 : pos - a0])
                    st.comp_g[h:].fill_(float("-inf"))
            st.next_pos = pos
        r = shared.compress_ratio
        shared.n_compressed = pos // r if r else 0
        shared.topk_pos = shared.candidates_pos = -1  # nothing published is for the next step
        shared.step_pos, shared.step_end = pos - 1, pos
        self._ticket = None
        shared.prepared = None

    def decode_index_score(self, role, keys: torch.Tensor, p: int) -> torch.Tensor:
        """bf16 `[1, L]`: the index scores the decode step at p of index source `role` left
        in the plan, over positions (L = (p + 1) // ratio), scored against `keys` (the
        index-key cache it used): a reindex layer's candidates at their positions and −∞
        elsewhere when it took the compact form (`runtime.ops.compacts`), as the full form
        leaves them. A view in the full form, a new tensor in the compact one."""
        c, plan = self.cfg, self.plan
        r = role.ratio
        L = (p + 1) // r
        scores = plan.scores[plan.sel_slot(role.layer)]
        if role.uses_candidates and compacts(self.ops, c, min(plan.bucket(p) // r, keys.shape[0])):
            n = c.cand_blocks * c.cand_block
            return select.gathered_to_full(scores[:, :n], plan.cand_ids[:1], c.cand_block, L)
        return scores[:, :L]

    def _forward_decode(
        self, w: AttnV41LayerWeights, st: AttnV41LayerState, shared: SharedV41, x: torch.Tensor, p: int
    ) -> AttnV41Run:
        """`forward` of one decode token (checked): the device-driven step, eagerly."""
        c, role = self.cfg, w.role
        r, W = role.ratio, c.window
        keys = self._decode_publish(role, st, shared, p)
        self.plan.set_pos(p)
        rows = shared.compress_kv if r > 0 else None
        out = self._decode_kernels(w, st, x, rows, keys, self.plan.bucket(p))
        st.next_pos = p + 1
        self._advance(shared, role.layer, p, 1)
        self._ticket = None  # a decode_prep before this call can no longer be run
        shared.prepared = None
        plan, run_extra = self.plan, {}
        L = (p + 1) // r if r else 0
        k = min(c.index_topk, L)
        if role.is_kv_source:
            run_extra["compress_kv"] = st.compress_kv[:L]
            run_extra["index_k"] = st.index_k[:L]
        if role.is_index_source and L > 0:
            run_extra["index_score"] = self.decode_index_score(role, keys, p)
            run_extra["index_k_owner"] = shared.index_k_owner
            if role.is_candidate_source:
                run_extra["candidates"] = plan.cand[:1, :L]
        comp = rows[:L] if r else self._empty_rows
        return AttnV41Run(
            q=self.q[:1],
            rows_win=st.ring,
            rows_comp=comp,
            n_win=W,
            n_comp=comp.shape[0],
            offset=W,
            idx=plan.sel_for(role.layer)[:, : W + k],
            topk=k,
            o=self.o[:1],
            out=out,
            kv_format=self.kv_format,
            **run_extra,
        )

    def _tables(self, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.plain_cos, self.plain_sin) if ratio == 0 else (self.yarn_cos, self.yarn_sin)

    def _width(self, ratio: int) -> int:
        """The class's fixed selection width (`decode_fixed_topk`)."""
        return self.cfg.window + (self.cfg.index_topk if ratio > 0 else 0)

    def _linear(self, w: AttnV41LayerWeights, name: str, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """`out = bf16(x · Wᵀ)` for one of the linears `FP8_LINEARS` in its weights' format:
        bf16 → `ops.mm`; FP8 (`<name>.scale` present) → `ops.fp8_mm`, the released math
        (checked available in `_check_role`)."""
        sc = w.get(name + ".scale")
        if sc is None:
            return self.ops.mm(x, w[name + ".weight"], out=out)
        return self.ops.fp8_mm(x, w[name + ".weight"], sc, out=out)

    @staticmethod
    def _preq(m: int, scales) -> bool:
        """Whether an input of m tokens read by weights with these `scales` gets its FP8
        round trip from its producer (`c_q`): a decode-sized call (m ≤
        gemv.DECODE_MAX_M) with an FP8 weight. The bits are those of the round trip made
        inside the linear; what changes is who makes it, once."""
        return m <= gemv.DECODE_MAX_M and any(sc is not None for sc in scales)

    def _qkv(
        self,
        w,
        x,
        pos,
        cos,
        sin,
        m: int,
        ring: torch.Tensor,
        ring_slot: torch.Tensor | None = None,
        side: torch.cuda.Stream | None = None,
        index=None,
    ):
        """§4 for m tokens at `pos`: the q latent `cq`, the rotated queries `q` and the
        window row `kv` (normed, rotated, fp8 round-tripped; counted by the non-finite
        counter as it enters the ring), written into ring[pos % W], and whether the indexer's
        head weights and queries were projected into `hw` and `iq` on the way (index
        sources). The one copy of this path: prefill and decode. side: a second stream on
        which the window row's chain runs beside q's norm and wq_b (forked after the first
        projections, joined before the return; the same kernels, so the same bytes), and
        with `decode.SIDE_WKV` wkv's product before it, beside wq_a's (forked before it;
        each output's bits are those of its weight alone). index (with side): `fn(cq, kw)`,
        an index source's index path, run on side once cq is normed (kw: the keywords of
        its index queries' product, `{"xq": cq's round trip}` or `{}`); the index queries
        are then not in wq_b's pass."""
        c, ops = self.cfg, self.ops
        H, D = c.n_heads, c.head_dim
        # wkv's product beside the others, with the window row's chain, on the second stream
        kv_beside = side is not None and _decode.SIDE_WKV
        # one pass over x: wq_a, wkv (bf16, or FP8 with their scales) and, on index sources, the head weights
        ws, outs = [w["wq_a.weight"], w["wkv.weight"]], [self.c_pre[:m], self.rows_tmp[:m]]
        scales = [w.get("wq_a.scale"), w.get("wkv.scale")]
        if kv_beside:
            del ws[1], outs[1], scales[1]
            self._beside(side, self._kv_proj_row, w, x, m, cos, sin, pos, ring, ring_slot)
        hw_done = w.role.is_index_source  # the indexer's head weights and queries projected here (into hw, iq)
        if hw_done:
            ws.append(w["indexer.weights_proj.weight"])
            outs.append(self.hw[:m])
            scales.append(None)
        ops.mm_many(x, tuple(ws), tuple(outs), tuple(scales))
        if side is not None and not kv_beside:
            self._beside(side, self._kv_row, w, m, cos, sin, pos, ring, ring_slot)
        q = self.q[:m]
        # one pass over cq: wq_b and, on index sources, the index queries (`hw_done` covers both)
        ws, outs, scales = [w["wq_b.weight"]], [q.view(m, H * D)], [w.get("wq_b.scale")]
        if hw_done and index is None:
            ws.append(w["indexer.wq_b.weight"])
            outs.append(self.iq[:m].view(m, -1))
            scales.append(w.get("indexer.wq_b.scale"))
        # cq's FP8 round trip made by the norm for FP8 weights (the keywords only then: op
        # tables written for bf16 weights need not take them)
        pq = dict(qdq_out=self.c_q[:m]) if self._preq(m, scales) else {}
        cq = ops.rms_norm(self.c_pre[:m], w["q_norm.weight"], c.norm_eps, out=self.c[:m], **pq)
        # q's RoPE as wq_b's output is stored (the decode GEMV's epilogue; else the rope op after)
        xq = dict(xq=pq["qdq_out"]) if pq else {}
        if index is not None:
            self._beside(side, index, cq, xq)
        ops.mm_many(cq, tuple(ws), tuple(outs), tuple(scales), rope=(0, D, cos, sin, pos), **xq)
        if side is None:
            self._kv_row(w, m, cos, sin, pos, ring, ring_slot)
        else:
            torch.cuda.current_stream(self.device).wait_stream(side)
        return cq, q, self.kv[:m], hw_done

    def _kv_proj_row(self, w, x, m: int, cos, sin, pos, ring: torch.Tensor, ring_slot: torch.Tensor | None) -> None:
        """wkv's product of x into `rows_tmp` (alone: each output's bits are those of its
        weight alone), then `_kv_row`."""
        self.ops.mm_many(x, (w["wkv.weight"],), (self.rows_tmp[:m],), (w.get("wkv.scale"),))
        self._kv_row(w, m, cos, sin, pos, ring, ring_slot)

    def _kv_row(self, w, m: int, cos, sin, pos, ring: torch.Tensor, ring_slot: torch.Tensor | None) -> None:
        """rms_norm → RoPE → fp8 round trip (counted by the non-finite counter) → ring[pos % W]:
        one kernel, from `rows_tmp` into `kv`. ring_slot: the row of ring each token goes to
        (a batched step's staging rows), else pos % window."""
        slot = {} if ring_slot is None else dict(slot=ring_slot)
        self.ops.kv_chain(
            self.rows_tmp[:m], w["kv_norm.weight"], self.cfg.norm_eps, cos, sin, pos, self.kv[:m], ring,
            self.nonfinite, **slot,
        )  # fmt: skip

    def _output(
        self, w, o, pos, cos, sin, m: int, out: torch.Tensor | None = None, rotated: bool = False
    ) -> torch.Tensor:
        """§8: inverse RoPE of o (already in `o_rot` when `rotated`), the grouped low-rank
        projection, the output projection."""
        c, ops = self.cfg, self.ops
        if rotated:
            o_rot = self.o_rot[:m]
        else:
            o_rot = ops.apply_rope(o, cos, sin, pos, inverse=True, out=self.o_rot[:m])
        G, gw = c.groups, c.group_width
        u = self.u[:m]
        # wo_a: bf16, or FP8 as the checkpoint stores it (with its scale: read as its exact bf16)
        wo_a = w["wo_a.weight"].view(G, c.o_rank, gw)
        ops.group_mm(o_rot.view(m, G, gw), wo_a, out=u.view(m, G, c.o_rank), scale=w.get("wo_a.scale"))
        # u's round trip stays inside wo_b's GEMV: an fp8_qdq launch before it measured slower
        # than the programs' own quantization (23.1 against 22.7 µs; BENCHMARKS.md, 2026-12-02,
        # second entry)
        return self._linear(w, "wo_b", u, self.out[:m] if out is None else out)

    def _compress(self, w: AttnV41LayerWeights, st: AttnV41LayerState, x: torch.Tensor, s: int) -> int:
        """The call's tokens (positions s …) into the compressor: with the group in
        progress before s (in the state's slots), complete groups become rows
        `s // r …` of the layer's caches (§5, §6.1); the remainder stays in its state
        (slot p mod r; the gate scores of the other slots −∞, their values those of the
        last completed group, as the token-by-token path leaves them). Returns the number
        of rows added."""
        c, ops = self.cfg, self.ops
        r, m, D = st.role.ratio, x.shape[0], c.head_dim
        j0 = s // r
        if r == 1:
            n = m
            ops.mm(x, w["compressor.wkv.weight"], out=self.lat_pre[:n])
        else:
            h = s - j0 * r  # tokens of the group in progress, already in slots 0 … h−1
            a, g = self.comp_a[: h + m], self.comp_g[: h + m]
            a[:h].copy_(st.comp_a[:h])
            g[:h].copy_(st.comp_g[:h])
            ops.mm(x, w["compressor.wkv.weight"], out=a[h:])  # fp32 weights: fp32 math
            ops.mm(x, w["compressor.wgate.weight"], out=g[h:])
            if st.undo is not None and "a" in st.undo:
                st.undo["a"][: h + m].copy_(a)
                st.undo["g"][: h + m].copy_(g)
            n = (h + m) // r
            rem = h + m - n * r
            pooled = ops.compress_pool(a[: n * r].view(n, r, D), g[: n * r].view(n, r, D), out=self.pooled[:n])
            st.comp_a[:rem].copy_(a[n * r :])
            st.comp_g[:rem].copy_(g[n * r :])
            if n == 0:
                return 0
            st.comp_a[rem:].copy_(a[(n - 1) * r + rem : n * r])
            st.comp_g[rem:].fill_(float("-inf"))
            self.lat_pre[:n].copy_(pooled)
        latent = ops.rms_norm(self.lat_pre[:n], w["compressor.norm.weight"], c.norm_eps, out=self.latent[:n])
        row_pos = torch.mul(self.iota[j0 : j0 + n], r, out=self.row_pos[:n])
        rows = ops.apply_rope(
            latent.view(n, 1, D), self.yarn_cos, self.yarn_sin, row_pos, out=self.rows_tmp[:n].view(n, 1, D)
        )
        packed = self.kv_format == "packed"
        # packed caches: the round trip into a workspace (lat_pre, k_pre: read already), then
        # its values in V4.1's byte format (exact: they lie on the grid)
        dst = self.lat_pre[:n] if packed else st.compress_kv[j0 : j0 + n]
        ops.fp4_e4m3_qdq(rows.view(n, D), out=dst, nonfinite=self.nonfinite)
        if packed:
            st.compress_kv[j0 : j0 + n].copy_(pack(dst, CACHE_FORMATS["compress_kv"], check=False))
        kp = ops.mm(latent, w["indexer.wk.weight"], out=self.k_pre[:n])
        kr = ops.rms_norm(kp, w["indexer.k_norm.weight"], c.norm_eps, out=self.k_rows[:n])
        ops.apply_rope(kr.view(n, 1, -1), self.yarn_cos, self.yarn_sin, row_pos, out=kr.view(n, 1, -1))
        dst = self.k_pre[:n] if packed else st.index_k[j0 : j0 + n]
        ops.fp4_e8m0_qdq(kr, out=dst, nonfinite=self.nonfinite)
        if packed:
            st.index_k[j0 : j0 + n].copy_(pack(dst, CACHE_FORMATS["index_k"], check=False))
        st.n_rows = j0 + n
        return n

    def _index_queries(self, w, cq, x, pos, cos, sin, hw_done: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Index queries `iq` `[m, H, d]` and scaled head weights `hw` `[m, H]` (§6.2–§6.3).
        `hw_done`: `_qkv` already projected the head weights into `hw` (its fused pass over
        x) and the index queries into `iq` (its fused pass over cq)."""
        c, ops = self.cfg, self.ops
        m = x.shape[0]
        iq, hw = self.iq[:m], self.hw[:m]
        if not hw_done:
            self._linear(w, "indexer.wq_b", cq, iq.view(m, -1))
            ops.mm(x, w["indexer.weights_proj.weight"], out=hw)
        # RoPE → fp4 e8m0 round trip of the queries, and hw scaled in place as bf16(fp32(hw)·fp32(scale)):
        # one kernel
        ops.index_q_chain(iq, cos, sin, pos, iq, hw=hw, hw_scale=c.index_head_dim**-0.5 * c.index_heads**-0.5)
        return iq, hw

    def _index_scores(
        self, w, cq, x, pos, vis, keys, cos, sin, out: torch.Tensor | None = None, hw_done: bool = False, **gather
    ) -> torch.Tensor:
        """Index queries, head weights and scores `[m, L]` (§6.2–§6.4); with `ids=`,
        `cand_block=` the gathered form over the candidates (`runtime.ops.compacts`)."""
        iq, hw = self._index_queries(w, cq, x, pos, cos, sin, hw_done=hw_done)
        tokens = {} if gather else prompt_tokens(iq.shape[0])
        return self.ops.index_scores(iq, hw, keys, vis, out=out, **gather, **tokens)

    def _candidates(self, shared: SharedV41, t0: int, t1: int, L: int) -> torch.Tensor:
        """bool `[t1 − t0, L]`: the published candidate mask of tokens t0..t1−1, from the
        mask or from a tiled prefill's kept block ids (`select.candidate_blocks`)."""
        cand = shared.candidates[t0:t1]
        if cand.dtype == torch.bool:
            return cand
        return select.candidate_mask_of_blocks(cand, L, self.cfg.cand_block)

    def _reindex_compact(self, w, shared, cq, x, pos, vis, L, kk, offset, cos, sin, hw_done, record: bool):
        """A reindex layer's scores and top-k over its candidates only (`runtime.ops.compacts`)
        in a prefill or continuation of m tokens: the kept blocks ascending (from the
        published mask, or sorted from a tiled prefill's kept block ids), the gathered
        scores tile by tile (`index_tile_entries` over cand_blocks · cand_block entries),
        each tile's top-k written as positions into `topk_idxs`. The selection is the full
        form's (`compacts`' condition). With `record`, returns the scores at their positions
        for the run (`index_score`: the masked full scores); else None."""
        c, ops = self.cfg, self.ops
        m, cb = x.shape[0], c.cand_block
        n = c.cand_blocks * cb
        iq, hw = self._index_queries(w, cq, x, pos, cos, sin, hw_done=hw_done)
        keys = shared.index_k[:L]
        cand = shared.candidates
        tile = max(1, self.index_tile_entries // n)
        record = [] if record else None
        for t0 in range(0, m, tile):
            t1 = min(m, t0 + tile)
            ids = torch.empty(t1 - t0, c.cand_blocks, dtype=torch.int32, device=self.device)
            if cand.dtype == torch.bool:
                select.kept_block_ids(cand[t0:t1, :L], cb, out=ids)
            else:  # a tiled prefill's kept block ids (reference order, n_blocks not kept): ascending
                ids.copy_(torch.sort(cand[t0:t1], dim=1).values)
            scores = ops.index_scores(iq[t0:t1], hw[t0:t1], keys, vis[t0:t1], ids=ids, cand_block=cb)
            ops.topk_fixed(scores, vis[t0:t1], kk, offset, out=shared.topk_idxs[t0:t1, :kk], ids=ids, cand_block=cb)
            if record is not None:
                record.append(select.gathered_to_full(scores, ids, cb, L))
        return None if record is None else torch.cat(record)

    def _index_tiled(self, w, shared, cq, x, pos, vis, L, kk, offset, cos, sin, hw_done, tile, s) -> None:
        """Scores, candidates and top-k of a prefill or continuation whose `[m, L]` scores
        would pass `index_tile_entries`: `tile` tokens at a time, so no buffer grows as m·L
        (a 1M-token context's scores alone would take m·2 MiB). Each token's scores, mask
        and selection are its own row's (index_scores runs one program per token; mask and
        top-k are row-wise), so the bits are those of the untiled call. The candidate
        source publishes its mask as kept block ids, int32 `[m, ≤ cand_blocks]`; the run
        records neither the scores nor the mask (`index_score`, `candidates` absent)."""
        c, ops, role = self.cfg, self.ops, w.role
        m = x.shape[0]
        iq, hw = self._index_queries(w, cq, x, pos, cos, sin, hw_done=hw_done)
        keys = shared.index_k[:L]
        ids = None
        if role.is_candidate_source:
            ids = torch.empty(m, min(c.cand_blocks, -(-L // c.cand_block)), dtype=torch.int32, device=self.device)
        for t0 in range(0, m, tile):
            t1 = min(m, t0 + tile)
            scores = ops.index_scores(iq[t0:t1], hw[t0:t1], keys, vis[t0:t1], **prompt_tokens(t1 - t0))
            if ids is not None:
                select.candidate_blocks(scores, vis[t0:t1], c.cand_blocks, c.cand_block, out=ids[t0:t1])
                if role.uses_candidates:  # its own mask (as the untiled path: published first)
                    scores = scores.masked_fill(
                        ~select.candidate_mask_of_blocks(ids[t0:t1], L, c.cand_block), float("-inf")
                    )
            elif role.uses_candidates:
                scores = scores.masked_fill(~self._candidates(shared, t0, t1, L), float("-inf"))
            ops.topk_select(scores, vis[t0:t1], kk, offset, out=shared.topk_idxs[t0:t1])
            del scores
        if ids is not None:
            shared.candidates, shared.candidates_pos = ids, s
