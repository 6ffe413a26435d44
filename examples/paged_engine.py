"""A V4.1 attention stack assembled from `attnv41.ops`, as an inference engine would.

The engine owns everything here: the projections (`wq_a`, `wq_b`, `wkv`, the compressor's
and indexer's linears, `wo_a`, `wo_b`; this example runs the reference's `project`, the
released math, FP8 weights included), the pools (one window pool per layer, a paged
compressed-KV pool and index-key pool per kv source, each bf16 or in V4.1's packed byte
formats), the block tables, the slot mappings and the compressor's partial groups. The ops
do the rest of attention-v41.md §4-§8 between the projections: the norm and RoPE chains
with their round trips and pool writes, the compressor's pooling, index scores, the
candidate mask, the top-k and the sparse attention with the sink.

`PagedV41.prefill(xs, seq, start)` runs a chunk of one sequence (a prompt from position 0,
or a continuation), `PagedV41.step(xs, seqs, pos)` one decode token for each of several
sequences at their own positions, through every layer. On the CPU their outputs equal
`RefStack`'s (one sequence at a time) bit for bit, with bf16 or packed pools
(`compare_with_reference`, `tests/test_ops_engine.py`).

Run it: `python examples/paged_engine.py [--kv-format packed] [--weights fp8] [--device
cuda]`: three sequences served side by side (`schedule`) and checked against the
reference (on CUDA within the bf16 tolerance: the kernels sum in other orders).

Layouts that decide bits: a prompt from 0 attends over its own kv rows in the released
prefill's window selection (each token's chunk rows, min(m, window) wide, −1 past the
token; `sparse_attn_prefill`, the runtimes' prefill kernel on CUDA), a continuation and
decode over the ring in its order (positions p−window+1 … p, −1 where negative;
`sparse_attn`); the attention's 64-entry blocks then hold what the reference's hold.
Appending −1 entries at the end moves no bit, inserting them does.

Scope: the index keys a Full layer scores are its own (the project's default;
`index_keys="own"`). The host plans the compressor's groups and the chunk sizes here (an
engine's scheduler would); a captured engine step would take them from device metadata as
`attnv41.BatchGraphs` does.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

import attnv41.ops  # noqa: F401  (registers torch.ops.attnv41.*)
from attnv41.config import AttnV41Cfg
from attnv41.packed import row_bytes
from attnv41.reference.compressor import compress_project
from attnv41.reference.fp8 import dequant_weight
from attnv41.reference.layer import RefTables, project
from attnv41.reference.norm import linear

OPS = torch.ops.attnv41
BF = torch.bfloat16


def _pool(rows: int, width: int, fmt: str, kv_format: str, device) -> torch.Tensor:
    """An engine pool of `rows` rows of `width` values: bf16, or V4.1's packed rows (uint8)."""
    if kv_format == "packed":
        return torch.zeros(rows, row_bytes(fmt, width), dtype=torch.uint8, device=device)
    return torch.zeros(rows, width, dtype=BF, device=device)


@dataclass
class _SourcePools:
    """A kv source layer's paged pools: compressed rows and index keys share the block table
    (logical row j of sequence s at pool row `table[s, j // B] · B + j % B`)."""

    comp: torch.Tensor  # [blocks · B, D] bf16, or packed fp4_e4m3 rows
    keys: torch.Tensor  # [blocks · B, index_head_dim] bf16, or packed fp4_e8m0 rows
    table: torch.Tensor  # int32 [seqs, blocks per sequence]
    part_a: torch.Tensor | None  # fp32 [seqs, r, D]: the compressor's partial group (r ≥ 2)
    part_g: torch.Tensor | None  # fp32 [seqs, r, D], −∞ where empty


class PagedV41:
    """Prefill and decode state of `n_seqs` sequences over engine-owned pools (module doc).

    Window pools hold a ring of `window + max_chunk` rows per sequence (position p of
    sequence s at row s·R + p % R, R = window + max_chunk), so that a chunk's rows are
    written before its attention without overwriting rows its own tokens still read."""

    def __init__(
        self,
        cfg: AttnV41Cfg,
        weights: list[dict[str, torch.Tensor]],
        n_seqs: int,
        kv_format: str = "bf16",
        block_rows: int = 4,
        max_chunk: int = 16,
        device="cpu",
        seed: int = 0,
    ):
        if kv_format not in ("bf16", "packed"):
            raise ValueError(f"kv_format = {kv_format!r}; allowed: 'bf16', 'packed'")
        self.cfg, self.n_seqs, self.B, self.device = cfg, n_seqs, block_rows, torch.device(device)
        self.max_chunk, self.R = max_chunk, cfg.window + max_chunk
        self.w = [{k: v.to(self.device) for k, v in wl.items()} for wl in weights]
        self.tables = RefTables.build(cfg, self.device)
        D = cfg.head_dim
        self.win = [_pool(n_seqs * self.R, D, "fp8_e8m0", kv_format, self.device) for _ in range(cfg.n_layers)]
        self.src: dict[int, _SourcePools] = {}
        gen = torch.Generator().manual_seed(seed)
        for role in cfg.roles:
            if not role.is_kv_source:
                continue
            r = role.ratio
            per_seq = -(-(cfg.max_seq // r) // block_rows)
            # blocks handed out in a shuffled order, as a paged allocator would
            table = torch.randperm(n_seqs * per_seq, generator=gen).view(n_seqs, per_seq).to(torch.int32)
            rows = n_seqs * per_seq * block_rows
            part = (
                (
                    torch.zeros(n_seqs, r, D, device=self.device),
                    torch.full((n_seqs, r, D), float("-inf"), device=self.device),
                )
                if r >= 2
                else (None, None)
            )
            self.src[role.layer] = _SourcePools(
                _pool(rows, D, "fp4_e4m3", kv_format, self.device),
                _pool(rows, cfg.index_head_dim, "fp4_e8m0", kv_format, self.device),
                table.to(self.device),
                *part,
            )

    def prefill(self, xs: list[torch.Tensor], seq: int, start: int) -> list[dict[str, torch.Tensor]]:
        """The m tokens of sequence `seq` at positions start … start+m−1 (1 ≤ m ≤ max_chunk;
        `xs[i]` bf16 `[m, dim]` is layer i's input): a prompt from 0 (the released prefill's
        window layout: each token's own chunk rows, −1 past it, min(m, window) wide) or a
        continuation chunk (start > 0: the decode layout, so its bits are decode's). Returns
        per layer `o` (bf16 `[m, H, D]`) and `out` (bf16 `[m, dim]`)."""
        m, W, dev = xs[0].shape[0], self.cfg.window, self.device
        if not 1 <= m <= self.max_chunk or not 0 <= seq < self.n_seqs or start < 0:
            raise ValueError(
                f"m = {m}, seq = {seq}, start = {start}; allowed: 1..{self.max_chunk}, 0..{self.n_seqs - 1}, ≥ 0"
            )
        s_t = torch.full((m,), seq, device=dev)
        p_t = torch.arange(start, start + m, device=dev)
        if start > 0:
            return self._layers(xs, s_t, p_t, self._decode_window(s_t, p_t), "chunk")
        for pools in self.src.values():  # a new sequence: no partial group
            if pools.part_g is not None:
                pools.part_g[seq] = float("-inf")
        # the released prefill: each token's own chunk rows (indices into the chunk's kv rows)
        t = torch.arange(m, device=dev)[:, None]
        q = (t - W + 1).clamp_min(0) + torch.arange(min(m, W), device=dev)[None, :]
        return self._layers(xs, s_t, p_t, torch.where(q <= t, q, -1), "prompt")

    def step(self, xs: list[torch.Tensor], seqs, pos) -> list[dict[str, torch.Tensor]]:
        """One decode token for each of the sequences `seqs` (distinct) at positions `pos`
        (≥ 1: a sequence's first tokens go through `prefill`); `xs[i]` bf16 `[T, dim]`.
        Returns what `prefill` returns, for these T tokens.

        seqs, pos: lists (checked), or int64 tensors on the engine's device (not checked:
        that would read them back). With tensors nothing here reads the device: the step
        can be captured in a CUDA graph and replayed with new inputs, positions advanced
        on the device (`tests/test_ops_engine.py`; bf16 weights: the reference's FP8 linear
        checks its scale bytes on the host)."""
        if isinstance(seqs, torch.Tensor):
            s_t, p_t = seqs, pos
        else:
            if len(set(seqs)) != len(seqs) or min(pos) < 1:
                raise ValueError(f"seqs = {seqs}, pos = {pos}; allowed: distinct sequences, positions ≥ 1")
            s_t = torch.tensor(seqs, device=self.device)
            p_t = torch.tensor(pos, device=self.device)
        return self._layers(xs, s_t, p_t, self._decode_window(s_t, p_t), "decode")

    def _decode_window(self, s_t: torch.Tensor, p_t: torch.Tensor) -> torch.Tensor:
        """The decode layout (attention-v41.md §4.5): positions p−W+1 … p oldest first, as
        window-pool rows; −1 where negative."""
        W = self.cfg.window
        q = p_t[:, None] - W + 1 + torch.arange(W, device=self.device)[None, :]
        return torch.where(q >= 0, s_t[:, None] * self.R + q % self.R, -1)

    def _phys(self, table: torch.Tensor, seqs: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Pool rows of logical rows j (≥ 0) of sequences seqs."""
        return table[seqs, j // self.B].long() * self.B + j % self.B

    def _layers(self, xs, s_t, p_t, win_sel, mode: str) -> list[dict[str, torch.Tensor]]:
        """Every layer for the tokens (s_t[t], p_t[t]) with the window part `win_sel`: rows
        of the window pool, or in mode "prompt" (from position 0) of the call's own kv rows,
        attended by the prefill regime's kernel; "chunk" (a continuation) and "decode" (one
        token per sequence: its compressor read from nothing on the host)."""
        prompt = mode == "prompt"
        cfg = self.cfg
        T, H, D = s_t.shape[0], cfg.n_heads, cfg.head_dim
        win_slot = s_t * self.R + p_t % self.R
        comp = None  # the latest kv source's pools
        top = cand = None  # the selection's compressed part (logical rows), the candidate mask
        outs = []
        for i, role in enumerate(cfg.roles):
            w, x, r = self.w[i], xs[i], role.ratio
            cos, sin = self.tables.for_ratio(r)
            # §4: q, kv and the window
            c = OPS.rms_norm(project(w, "wq_a", x), w["q_norm.weight"], cfg.norm_eps)
            q = OPS.rope(project(w, "wq_b", c).view(T, H, D), cos, sin, p_t)
            kv = OPS.kv_rows(
                project(w, "wkv", x), w["kv_norm.weight"], cfg.norm_eps, cos, sin, p_t, win_slot, self.win[i]
            )
            win = kv if prompt else self.win[i]
            offset = win.shape[0]
            sel = win_sel
            if r > 0:
                vis = (p_t + 1) // r  # L_t: the rows a token sees
                if role.is_kv_source:
                    compress = self._compress_decode if mode == "decode" else self._compress
                    compress(i, role, w, x, s_t, p_t)
                    comp = self.src[i]
                if role.is_index_source:
                    top, cand = self._select(i, role, w, x, c, s_t, p_t, vis, cand)
                # the compressed part: logical rows → pool rows of the latest kv source, + offset
                phys = self._phys(comp.table, s_t[:, None], top.clamp_min(0).long())
                sel = torch.cat([win_sel, torch.where(top >= 0, phys + offset, -1)], dim=1)
            pool = comp.comp if r > 0 else win[:0]  # a window-only layer: no compressed rows
            # §7: sparse attention with the sink over the pools, read in place
            # and §8's inverse RoPE (in the attention's epilogue past a prompt), wo_a, wo_b
            sel, sink = sel.to(torch.int32), w["attn_sink"]
            if prompt:
                o = OPS.sparse_attn_prefill(q, win, pool, sel, offset, sink, D**-0.5)
                o_rot = OPS.rope(o, cos, sin, p_t, inverse=True)
            else:
                o, o_rot = torch.empty_like(q), torch.empty_like(q)
                OPS.sparse_attn_out(q, win, pool, sel, offset, sink, D**-0.5, cos, sin, p_t, o, o_rot)
            outs.append({"o": o, "out": project(w, "wo_b", self._wo_a(w, o_rot))})
        return outs

    def _compress_decode(self, i, role, w, x, s_t, p_t) -> None:
        """`_compress` for one token per sequence, read from nothing on the host: every
        token's group as it stands is pooled and written at its row ⌊p/r⌋ with its index key
        (until the group completes, past the visible rows: never read); the completed
        group's row has the r members' values in slot order, so `_compress`'s bits."""
        pools, r = self.src[i], role.ratio
        a, g = compress_project(x, w["compressor.wkv.weight"], w.get("compressor.wgate.weight") if r >= 2 else None)
        if r >= 2:
            pools.part_a[s_t, p_t % r] = a
            pools.part_g[s_t, p_t % r] = g
            pooled = OPS.compress_pool(pools.part_a[s_t], pools.part_g[s_t]).to(BF)
        else:
            pooled = a
        self._write_rows(w, pools, pooled, s_t, p_t // r, r)

    def _write_rows(self, w, pools, pooled, s_t, j, r) -> None:
        """§5's compressed rows j (logical, per sequence s_t) from pooled rows, and §6.1's
        index keys, into the kv source's pools."""
        cfg = self.cfg
        row = self._phys(pools.table, s_t, j)
        cos, sin = self.tables.yarn_cos, self.tables.yarn_sin
        latent = OPS.compress_rows(pooled, w["compressor.norm.weight"], cfg.norm_eps, cos, sin, j * r, row, pools.comp)
        kp = linear(latent, w["indexer.wk.weight"])
        OPS.index_key_rows(kp, w["indexer.k_norm.weight"], cfg.norm_eps, cos, sin, j * r, row, pools.keys)

    def _compress(self, i, role, w, x, s_t, p_t) -> None:
        """§5-§6.1: feed the tokens to layer i's compressor; rows that complete a group go to
        its compressed pool and their index keys to its key pool. (Planned on the host, as
        an engine's scheduler would.)"""
        cfg, pools, r = self.cfg, self.src[i], role.ratio
        a, g = compress_project(x, w["compressor.wkv.weight"], w.get("compressor.wgate.weight") if r >= 2 else None)
        s_l, p_l = s_t.tolist(), p_t.tolist()
        done = [t for t, p in enumerate(p_l) if (p + 1) % r == 0]
        if r >= 2:
            # a completed group's r members, in slot order (position % r): this call's tokens,
            # or earlier ones from the partial-group state
            at = {(s, p): t for t, (s, p) in enumerate(zip(s_l, p_l))}
            if done:
                mem_a = torch.empty(len(done), r, cfg.head_dim, device=self.device)
                mem_g = torch.empty_like(mem_a)
                for n, t in enumerate(done):
                    for k in range(r):
                        q = p_l[t] - r + 1 + k
                        u = at.get((s_l[t], q))
                        mem_a[n, k] = a[u] if u is not None else pools.part_a[s_l[t], k]
                        mem_g[n, k] = g[u] if u is not None else pools.part_g[s_l[t], k]
                pooled = OPS.compress_pool(mem_a, mem_g).to(BF)
            # what the call leaves: each sequence's tokens of a group it does not complete
            last = {}
            for s, p in zip(s_l, p_l):
                last[s] = max(last.get(s, p), p)
            keep = [t for t, (s, p) in enumerate(zip(s_l, p_l)) if p // r * r + r - 1 > last[s]]
            keep = torch.tensor(keep, dtype=torch.long, device=self.device)
            if len(keep):
                pools.part_a[s_t[keep], p_t[keep] % r] = a[keep]
                pools.part_g[s_t[keep], p_t[keep] % r] = g[keep]
            if not done:
                return
        else:
            pooled = a  # r = 1: one row per token, its bf16 projection
        done_t = torch.tensor(done, device=self.device)
        self._write_rows(w, pools, pooled, s_t[done_t], (p_t[done_t] + 1) // r - 1, r)

    def _select(self, i, role, w, x, c, s_t, p_t, vis, cand):
        """§6.2-§6.6 on index source layer i: the scores over the index keys published last,
        the candidate mask (its source publishes it, reindex layers apply it), the top-k as
        logical rows (−1 tail). Returns (top, the candidate mask now published)."""
        cfg, T = self.cfg, s_t.shape[0]
        cos, sin = self.tables.yarn_cos, self.tables.yarn_sin
        # the index keys published last: this layer's own on a Full layer, else the latest
        # Full layer's (index_keys="own")
        pools = self.src[max(k for k in self.src if k <= i and cfg.roles[k].is_index_source)]
        iq = OPS.index_queries(project(w, "indexer.wq_b", c).view(T, cfg.index_heads, -1), cos, sin, p_t)
        hw = linear(x, w["indexer.weights_proj.weight"]).float()
        hw = (hw * (cfg.index_head_dim**-0.5 * cfg.index_heads**-0.5)).to(BF)
        width = pools.table.shape[1] * self.B
        scores = OPS.index_scores(iq, hw, pools.keys, pools.table, s_t.to(torch.int32), vis, self.B, width)
        if role.is_candidate_source:
            cand = OPS.candidate_mask(scores, vis, cfg.cand_blocks, cfg.cand_block)
        mask = cand if role.uses_candidates else None
        return OPS.topk(scores, vis, min(cfg.index_topk, width), 0, mask), cand

    def _wo_a(self, w, o_rot: torch.Tensor) -> torch.Tensor:
        """The grouped wo_a (fp64 sums rounded once, as the reference): `[T, groups·o_rank]`."""
        cfg, T = self.cfg, o_rot.shape[0]
        wt = w["wo_a.weight"]
        if "wo_a.scale" in w:  # FP8 bytes: their exact bf16, as the released conversion
            wt = dequant_weight(wt, w["wo_a.scale"], name="wo_a.weight")
        G = cfg.groups
        og = o_rot.reshape(T, G, cfg.group_width).double()
        wg = wt.double().view(G, cfg.o_rank, cfg.group_width)
        return torch.einsum("tgk,grk->tgr", og, wg).to(BF).reshape(T, G * cfg.o_rank)


CHUNKS = {0: [(0, 5)], 3: [(1, 11)], 4: [(1, 6)], 7: [(2, 1)], 20: [(2, 3)], 25: [(0, 16)]}


def schedule(cfg: AttnV41Cfg, steps: int, chunks=None, seed: int = 1):
    """A serving pattern over 3 sequences: `chunks` {step: [(sequence, tokens)]} (default
    `CHUNKS`: prompts of 5, 11 (over the tiny window) and 1 tokens started at different
    steps, continuation chunks of 6, 3 and 16 tokens), and at every step a decode token of
    each started sequence not in a chunk. Yields ("prefill", seq, start, xs) and ("decode",
    seqs, positions, xs); xs: every layer's input."""
    gen = torch.Generator().manual_seed(seed)
    chunks = CHUNKS if chunks is None else chunks
    nxt: dict[int, int] = {}  # each started sequence's next position

    def inputs(m):
        return [torch.randn(m, cfg.dim, generator=gen).to(BF) for _ in range(cfg.n_layers)]

    for step in range(steps):
        busy = {s for s, _ in chunks.get(step, [])}
        seqs = [s for s in sorted(nxt) if s not in busy and nxt[s] < cfg.max_seq]
        if seqs:
            yield "decode", seqs, [nxt[s] for s in seqs], inputs(len(seqs))
            for s in seqs:
                nxt[s] += 1
        for s, m in chunks.get(step, []):
            start = nxt.get(s, 0)
            if start + m <= cfg.max_seq:
                yield "prefill", s, start, inputs(m)
                nxt[s] = start + m


def compare_with_reference(
    cfg, weights, kv_format="bf16", device="cpu", steps=40, block_rows=4, chunks=None, max_chunk=16
) -> float:
    """`schedule`'s calls through a `PagedV41` and through one `RefStack` per sequence: each
    call's `o` and `out` (every layer, every token) bit for bit on the CPU, within the bf16
    tolerance of the whole call's tensor elsewhere (returns the worst error over the
    tolerance). Raises AssertionError naming the first difference."""
    from attnv41.reference.layer import RefStack
    from attnv41.testing import compare_bf16

    eng = PagedV41(
        cfg, weights, n_seqs=3, kv_format=kv_format, block_rows=block_rows, max_chunk=max_chunk, device=device
    )
    refs = [RefStack(cfg, weights) for _ in range(3)]
    worst = 0.0
    for n, (kind, who, pos, xs) in enumerate(schedule(cfg, steps, chunks)):
        dev_xs = [x.to(eng.device) for x in xs]
        if kind == "prefill":
            got = eng.prefill(dev_xs, who, pos)
            traces = [refs[who].step(xs, pos)]
        else:
            got = eng.step(dev_xs, who, pos)
            traces = [refs[s].step([x[t : t + 1] for x in xs], p) for t, (s, p) in enumerate(zip(who, pos))]
        for i in range(cfg.n_layers):
            for name in ("o", "out"):
                a = got[i][name].cpu()
                b = torch.cat([getattr(tr[i], name) for tr in traces])
                where = f"call {n} ({kind} of {who} at {pos}), layer {i} ({cfg.roles[i].name}): {name}"
                if eng.device.type == "cpu":
                    diff = (a.view(torch.int16) != b.view(torch.int16)).flatten(1).any(1).nonzero().flatten()
                    assert len(diff) == 0, f"{where}, tokens {diff.tolist()}"
                else:
                    c = compare_bf16(where, a, b)
                    assert c.ok, str(c)
                    worst = max(worst, c.ratio)
    return worst


def main(argv=None) -> int:
    import dataclasses

    from attnv41.golden import GoldenFile, bundled_golden_path
    from attnv41.synthetic import random_weights

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv-format", choices=("bf16", "packed"), default="bf16")
    ap.add_argument(
        "--weights",
        choices=("golden", "fp8"),
        default="golden",
        help="the bundled tiny golden file's bf16 weights, or random FP8 ones (q_rank 32)",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args(argv)
    gold = GoldenFile(bundled_golden_path())
    if a.weights == "golden":
        cfg = gold.cfg
        weights = [gold.weights(i) for i in range(cfg.n_layers)]
    else:
        cfg = dataclasses.replace(gold.cfg, q_rank=32)  # every FP8 linear's in-dim a multiple of 32
        weights = random_weights(cfg, 0, weights="fp8")
    try:
        worst = compare_with_reference(cfg, weights, a.kv_format, a.device, a.steps)
    except AssertionError as e:
        print(f"differs from the reference: {e}")
        return 1
    rule = "bit for bit" if torch.device(a.device).type == "cpu" else f"within the bf16 tolerance ({worst:.3g} of it)"
    print(f"{a.steps} steps, 3 sequences, {a.kv_format} pools, {a.weights} weights: the reference's outputs {rule}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
