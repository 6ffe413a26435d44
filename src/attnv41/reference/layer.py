"""One DeepSeek-V4.1 attention layer and a stack of them, written for clarity.

This is attention-v41.md step by step in plain PyTorch. It is the oracle the fast
runtime is checked against, and it imports nothing from the runtime or the kernels.

Regimes: a prefill of m tokens from position 0, single-token decode at any later
position, and a continuation: m tokens at a later position (a chunk of a prompt, or
draft tokens to verify), which presents each token's window as decode does, so every
token of it equals the token-by-token decode bit for bit (attention-v41.md §10). Per-layer state (`RefLayerState`) and the per-sequence shared state
(`RefShared`, what source layers publish) are explicit arguments; nothing is kept at
module level. Weights are a mapping from the released module's parameter names
(`wq_a.weight`, `compressor.wkv.weight`, `indexer.wq_b.weight`, `attn_sink`, ...) to
tensors.

FP8 weights (the released checkpoint path, golden `v41_fp8`): a linear of `FP8_LINEARS`
given as a float8_e4m3fn `<name>.weight` plus its e8m0 `<name>.scale` runs the released
FP8 math (`fp8.fp8_linear`: activations quantized per 32 columns); `wo_a` given so is
dequantized to bf16 and runs the same grouped bf16 einsum. Weights without scales take
the bf16 path, unchanged.

Index-key behaviour (attention-v41.md §9): `index_keys="own"` (default) makes a Full
layer always score against its own index-key cache; `"released"` reproduces the
released code, where a Full layer publishes its keys only on a call that produced a
new latent row and scores against whatever keys were published last.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..config import AttnV41Cfg, LayerRole
from .compressor import compress_latents, compress_pool, compress_project
from .fp8 import dequant_weight, fp8_linear
from .indexer import candidate_mask, index_scores, topk_select, visible_rows
from .norm import linear, rms_norm
from .qdq import fp4_e4m3_qdq, fp4_e8m0_qdq, fp8_qdq
from .rope import apply_rope, rope_freqs, rope_table
from .sparse_attn import sparse_attn

__all__ = [
    "INDEX_KEY_MODES",
    "RefTables",
    "RefLayerState",
    "RefShared",
    "RefTrace",
    "layer_forward",
    "project",
    "output_latent",
    "RefStack",
]

INDEX_KEY_MODES = ("own", "released")
# The linears the released FP8 checkpoint runs in FP8 (activations quantized per 32
# columns); `wo_a` is stored FP8 too but runs in bf16 after its dequantization.
FP8_LINEARS = ("wq_a", "wq_b", "wkv", "wo_b", "indexer.wq_b")
FP8_DEQUANTIZED = ("wo_a",)


@dataclass
class RefTables:
    """fp32 RoPE tables `[max_seq, rope_dim/2]`: plain (ratio-0 layers) and YaRN (ratio>0)."""

    plain_cos: torch.Tensor
    plain_sin: torch.Tensor
    yarn_cos: torch.Tensor
    yarn_sin: torch.Tensor

    @classmethod
    def build(cls, cfg: AttnV41Cfg, device: torch.device | str = "cpu") -> RefTables:
        plain = rope_table(cfg.max_seq, rope_freqs(cfg.rope_dim, cfg.rope_theta))
        yarn = rope_table(
            cfg.max_seq,
            rope_freqs(
                cfg.rope_dim,
                cfg.compress_rope_theta,
                (cfg.rope_factor, cfg.original_seq_len, cfg.beta_fast, cfg.beta_slow),
            ),
        )
        return cls(*(t.to(device) for t in (*plain, *yarn)))

    def for_ratio(self, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.plain_cos, self.plain_sin) if ratio == 0 else (self.yarn_cos, self.yarn_sin)


@dataclass
class RefLayerState:
    """Per layer and per sequence: the window ring, and on kv sources the compressor's
    partial group and the compressed-KV and index-key caches (`n_rows` rows valid)."""

    ring: torch.Tensor  # bf16 [window, head_dim]; position p in slot p % window; never written = 0
    comp_a: torch.Tensor | None = None  # fp32 [r, head_dim] (r >= 2): token p in slot p % r
    comp_g: torch.Tensor | None = None  # fp32 [r, head_dim], −∞ where empty
    compress_kv: torch.Tensor | None = None  # bf16 [max_seq // r, head_dim]
    index_k: torch.Tensor | None = None  # bf16 [max_seq // r, index_head_dim]
    n_rows: int = 0

    @classmethod
    def new(cls, cfg: AttnV41Cfg, role: LayerRole, device: torch.device | str = "cpu") -> RefLayerState:
        st = cls(ring=torch.zeros(cfg.window, cfg.head_dim, dtype=torch.bfloat16, device=device))
        if role.is_kv_source:
            r = role.ratio
            st.compress_kv = torch.zeros(cfg.max_seq // r, cfg.head_dim, dtype=torch.bfloat16, device=device)
            st.index_k = torch.zeros(cfg.max_seq // r, cfg.index_head_dim, dtype=torch.bfloat16, device=device)
            if r >= 2:
                st.comp_a = torch.zeros(r, cfg.head_dim, dtype=torch.float32, device=device)
                st.comp_g = torch.full((r, cfg.head_dim), float("-inf"), dtype=torch.float32, device=device)
        return st

    def reset(self) -> None:
        self.ring.zero_()
        self.n_rows = 0
        if self.comp_a is not None:
            self.comp_a.zero_()
            self.comp_g.fill_(float("-inf"))


@dataclass
class RefShared:
    """Per sequence: what source layers publish, latest writer wins (attention-v41.md §2)."""

    compress_kv: torch.Tensor | None = None  # the latest kv source's cache (a reference, not a copy)
    compress_ratio: int = 0
    index_k: torch.Tensor | None = None  # the index-key cache published last (a reference)
    index_k_owner: int = -1
    topk_idxs: torch.Tensor | None = None  # int32 [m, k], offset, −1 padded
    topk_pos: int = -1  # start_pos of the call that published topk_idxs
    candidates: torch.Tensor | None = None  # bool [m, L]
    candidates_pos: int = -1

    def reset(self) -> None:
        self.__init__()


@dataclass
class RefTrace:
    """What one reference layer call computed (the golden files' tensor names)."""

    q: torch.Tensor  # bf16 [m, H, D], after RoPE
    kv_win: torch.Tensor  # bf16: prefill [m, D] chunk rows; decode [window, D] the ring; continuation ctx rows
    sel: torch.Tensor  # int32 [m, window_cols + k]
    o: torch.Tensor  # bf16 [m, H, D], before the inverse rotation
    out: torch.Tensor  # bf16 [m, dim]
    compress_kv: torch.Tensor | None = None  # bf16 [L, D] (kv sources)
    index_k: torch.Tensor | None = None  # bf16 [L, index_head_dim] (kv sources)
    index_score: torch.Tensor | None = None  # bf16 [m, L] (index sources with L > 0)
    index_k_owner: int | None = None
    candidates: torch.Tensor | None = None  # bool [m, L] (candidate source)


def _w(w: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in w:
        raise KeyError(f"layer weight {name!r} is missing")
    return w[name]


def project(w: Mapping[str, torch.Tensor], name: str, x: torch.Tensor) -> torch.Tensor:
    """`bf16(x · Wᵀ)` for the linear `name` (`wq_a`, `indexer.wq_b`, ...): the released FP8
    linear (`fp8_linear`) when the weights hold `<name>.scale` next to a float8_e4m3fn
    `<name>.weight` (one of `FP8_LINEARS`), else the bf16 `linear`."""
    wt = _w(w, f"{name}.weight")
    sc = w.get(f"{name}.scale")
    if sc is None:
        if wt.dtype == torch.float8_e4m3fn:
            raise ValueError(f"{name}.weight is float8_e4m3fn without {name}.scale; allowed: bf16, or fp8 with a scale")
        return linear(x, wt)
    if name not in FP8_LINEARS:
        raise ValueError(f"{name}.scale given; allowed: a scale for {FP8_LINEARS} (and {FP8_DEQUANTIZED})")
    return fp8_linear(x, wt, sc, name=f"{name}.weight")


def _wo_a(w: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """`wo_a` in bf16: given so, or dequantized from FP8 as the released conversion does."""
    sc = w.get("wo_a.scale")
    return _w(w, "wo_a.weight") if sc is None else dequant_weight(_w(w, "wo_a.weight"), sc, name="wo_a.weight")


def _window_selection(cfg: AttnV41Cfg, m: int, start_pos: int, device) -> torch.Tensor:
    """The window part of the selection (attention-v41.md §4.5), int32.

    Prefill from 0: the released layout (chunk rows, −1 past t, width min(m, W)). One
    decode token: the ring, oldest first (slot indices). A continuation (m > 1 at
    start_pos > 0) attends over its context rows `ctx` = positions `base … start_pos+m−1`
    (`base = max(0, start_pos−W+1)`: the ring's rows before the call, then the call's
    own): column c of token p holds position `p−W+1+c` as an index into `ctx`, −1 where
    that position is negative. That is the decode layout (the ring oldest first holds
    exactly these positions in these columns), so the attention's blocks of 64 see the
    same entries in the same places and the bits equal decode's."""
    W = cfg.window
    if start_pos == 0:
        width = min(m, W)
        t = torch.arange(m, device=device)[:, None]
        idx = (t - W + 1).clamp_min(0) + torch.arange(width, device=device)[None, :]
        return torch.where(idx <= t, idx, -1).to(torch.int32)
    p = start_pos
    if m == 1:
        slots = (torch.arange(W, device=device) + p % W + 1) % W  # oldest first
        return torch.where(slots <= p, slots, -1).to(torch.int32)[None, :]
    base = max(0, p - W + 1)
    q = torch.arange(p, p + m, device=device)[:, None] - W + 1 + torch.arange(W, device=device)[None, :]
    return torch.where(q >= 0, q - base, -1).to(torch.int32)


def _context_rows(cfg: AttnV41Cfg, st: RefLayerState, start_pos: int) -> torch.Tensor:
    """A continuation's earlier window rows, positions `max(0, start_pos−W+1) … start_pos−1`
    in order, read from the ring before the call writes it."""
    W = cfg.window
    pos = torch.arange(max(0, start_pos - W + 1), start_pos, device=st.ring.device)
    return st.ring[pos % W].clone()


def _compress(
    cfg: AttnV41Cfg, role: LayerRole, w, st: RefLayerState, x: torch.Tensor, start_pos: int, tables: RefTables
) -> int:
    """Feed the call's tokens to the compressor; append every completed row to the
    caches. Returns how many rows were added."""
    r = role.ratio
    m = x.shape[0]
    a, g = compress_project(x, _w(w, "compressor.wkv.weight"), w.get("compressor.wgate.weight") if r >= 2 else None)
    if r == 1:
        pooled_rows = a.float()
    else:
        pooled = []
        for i in range(m):
            p = start_pos + i
            st.comp_a[p % r] = a[i]
            st.comp_g[p % r] = g[i]
            if (p + 1) % r == 0:
                pooled.append(compress_pool(st.comp_a[None], st.comp_g[None])[0])
                st.comp_g.fill_(float("-inf"))
        if not pooled:
            return 0
        pooled_rows = torch.stack(pooled)
    latent = compress_latents(pooled_rows, _w(w, "compressor.norm.weight"), cfg.norm_eps)
    n = latent.shape[0]
    j0 = st.n_rows
    row_pos = torch.arange(j0, j0 + n, device=x.device) * r
    cos, sin = tables.yarn_cos, tables.yarn_sin
    st.compress_kv[j0 : j0 + n] = fp4_e4m3_qdq(apply_rope(latent, cos, sin, row_pos))
    k = rms_norm(linear(latent, _w(w, "indexer.wk.weight")), _w(w, "indexer.k_norm.weight"), cfg.norm_eps)
    st.index_k[j0 : j0 + n] = fp4_e8m0_qdq(apply_rope(k, cos, sin, row_pos))
    st.n_rows = j0 + n
    return n


def layer_forward(
    cfg: AttnV41Cfg,
    role: LayerRole,
    w: Mapping[str, torch.Tensor],
    st: RefLayerState,
    shared: RefShared,
    x: torch.Tensor,
    start_pos: int,
    tables: RefTables,
    index_keys: str = "own",
) -> RefTrace:
    """One layer's attention for the m tokens of `x` (bf16 `[m, dim]`, the normed input)
    at positions `start_pos … start_pos+m−1`: a prefill from 0, one decode token, or a
    continuation (m > 1 tokens after position 0, see `_window_selection`).

    A call at `start_pos == 0` resets this layer's state; the caller resets `shared`
    once per new sequence (`RefStack` does it before layer 0).
    """
    m = x.shape[0]
    if index_keys not in INDEX_KEY_MODES:
        raise ValueError(f"index_keys = {index_keys!r}; allowed: {INDEX_KEY_MODES}")
    if not 1 <= start_pos + m <= cfg.max_seq:
        raise ValueError(f"positions {start_pos}..{start_pos + m - 1}; allowed: 0..{cfg.max_seq - 1}")
    if start_pos == 0:
        st.reset()
    dev = x.device
    H, D, W, r = cfg.n_heads, cfg.head_dim, cfg.window, role.ratio
    positions = torch.arange(start_pos, start_pos + m, device=dev)
    cos, sin = tables.for_ratio(r)

    # §4: q, kv and the window
    c = rms_norm(project(w, "wq_a", x), _w(w, "q_norm.weight"), cfg.norm_eps)
    q = apply_rope(project(w, "wq_b", c).view(m, H, D), cos, sin, positions)
    kv = rms_norm(project(w, "wkv", x), _w(w, "kv_norm.weight"), cfg.norm_eps)
    kv = fp8_qdq(apply_rope(kv, cos, sin, positions))
    cont = start_pos > 0 and m > 1
    before = _context_rows(cfg, st, start_pos) if cont else None
    keep = min(m, W)
    st.ring[(positions[m - keep :] % W)] = kv[m - keep :]
    if start_pos == 0:
        window_rows = kv
    elif cont:
        window_rows = torch.cat([before, kv])
    else:
        window_rows = st.ring.clone()
    offset = window_rows.shape[0]
    sel_parts = [_window_selection(cfg, m, start_pos, dev)]
    trace = {"q": q, "kv_win": window_rows}
    rows = [window_rows]

    # §5, §6: compressed rows and the selection
    if r > 0:
        end = start_pos + m
        L = end // r
        vis = visible_rows(positions, r)
        new_rows = 0
        if role.is_kv_source:
            new_rows = _compress(cfg, role, w, st, x, start_pos, tables)
            shared.compress_kv, shared.compress_ratio = st.compress_kv, r
            trace["compress_kv"] = st.compress_kv[:L]
            trace["index_k"] = st.index_k[:L]
        if shared.compress_kv is None or shared.compress_ratio != r:
            raise RuntimeError(
                f"layer {role.layer} (ratio {r}) runs before a kv source of ratio {r} published compressed rows"
            )
        if role.is_index_source:
            if role.is_kv_source and (index_keys == "own" or new_rows > 0):
                shared.index_k, shared.index_k_owner = st.index_k, role.layer
            if L > 0:
                if shared.index_k is None or shared.index_k.shape[0] < L:
                    raise RuntimeError(f"layer {role.layer}: no index keys with {L} rows were published")
                iq = project(w, "indexer.wq_b", c).view(m, cfg.index_heads, cfg.index_head_dim)
                iq = fp4_e8m0_qdq(apply_rope(iq, cos, sin, positions))
                hw = linear(x, _w(w, "indexer.weights_proj.weight")).float()
                hw = (hw * (cfg.index_head_dim**-0.5 * cfg.index_heads**-0.5)).to(torch.bfloat16)
                scores = index_scores(iq, hw, shared.index_k[:L], vis)
                if role.is_candidate_source:
                    shared.candidates = candidate_mask(scores, vis, cfg.cand_blocks, cfg.cand_block)
                    shared.candidates_pos = start_pos
                    trace["candidates"] = shared.candidates
                if role.uses_candidates:
                    if shared.candidates is None or shared.candidates_pos != start_pos:
                        raise RuntimeError(f"layer {role.layer}: no candidate mask was published for this call")
                    scores = scores.masked_fill(~shared.candidates, float("-inf"))
                trace["index_score"] = scores
                trace["index_k_owner"] = shared.index_k_owner
                shared.topk_idxs = topk_select(scores, vis, min(cfg.index_topk, L), offset)
                shared.topk_pos = start_pos
        if L > 0:
            if shared.topk_idxs is None or shared.topk_pos != start_pos:
                raise RuntimeError(f"layer {role.layer}: no selection was published for this call")
            sel_parts.append(shared.topk_idxs)
            rows.append(shared.compress_kv[:L])
    sel = torch.cat(sel_parts, dim=1)

    # §7: sparse attention with the sink
    o = sparse_attn(q, torch.cat(rows, dim=0), sel, _w(w, "attn_sink"), D**-0.5)

    # §8: inverse RoPE and the grouped low-rank output
    out = project(w, "wo_b", output_latent(cfg, w, o, positions, cos, sin))
    return RefTrace(sel=sel, o=o, out=out, **trace)


def output_latent(
    cfg: AttnV41Cfg,
    w: Mapping[str, torch.Tensor],
    o: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    """§8 up to `wo_b`'s input: the inverse RoPE of `o` (bf16 `[m, H, D]`) at `positions`
    with the layer's table, then the grouped `wo_a` (fp64 accumulation, as `linear`),
    rounded to bf16 `[m, groups·o_rank]`."""
    m = o.shape[0]
    o_rot = apply_rope(o, cos, sin, positions, inverse=True)
    G = cfg.groups
    og = o_rot.reshape(m, G, cfg.group_width).double()
    wo_a = _wo_a(w).double().view(G, cfg.o_rank, cfg.group_width)
    return torch.einsum("mgk,grk->mgr", og, wo_a).to(torch.bfloat16).reshape(m, G * cfg.o_rank)


class RefStack:
    """A stack of reference layers over one sequence: states, shared state and tables."""

    def __init__(
        self, cfg: AttnV41Cfg, weights: list[Mapping[str, torch.Tensor]], device="cpu", index_keys: str = "own"
    ):
        if len(weights) != cfg.n_layers:
            raise ValueError(f"{len(weights)} weight sets; allowed: exactly n_layers = {cfg.n_layers}")
        if index_keys not in INDEX_KEY_MODES:
            raise ValueError(f"index_keys = {index_keys!r}; allowed: {INDEX_KEY_MODES}")
        allowed = {f"{n}.scale" for n in FP8_LINEARS + FP8_DEQUANTIZED}
        for i, w in enumerate(weights):
            bad = sorted(k for k in w if k.endswith(".scale") and k not in allowed)
            if bad:
                raise ValueError(f"layer {i}: weight {bad[0]!r}; allowed scales: {sorted(allowed)}")
        self.cfg, self.weights, self.index_keys = cfg, weights, index_keys
        self.tables = RefTables.build(cfg, device)
        self.states = [RefLayerState.new(cfg, cfg.roles[i], device) for i in range(cfg.n_layers)]
        self.shared = RefShared()

    def layer(self, i: int, x: torch.Tensor, start_pos: int) -> RefTrace:
        if i == 0 and start_pos == 0:
            self.shared.reset()
        return layer_forward(
            self.cfg,
            self.cfg.roles[i],
            self.weights[i],
            self.states[i],
            self.shared,
            x,
            start_pos,
            self.tables,
            self.index_keys,
        )

    def step(self, xs: list[torch.Tensor], start_pos: int) -> list[RefTrace]:
        """All layers in order; `xs[i]` is layer i's input."""
        return [self.layer(i, xs[i], start_pos) for i in range(self.cfg.n_layers)]
