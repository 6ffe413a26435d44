"""A V4.1 attention stack assembled from `attnv41.ops`, as an inference engine would.

The engine owns everything here: the projections (`wq_a`, `wq_b`, `wkv`, the compressor's
and indexer's linears, `wo_a`, `wo_b`; this example runs the reference's `project`, the
released math, FP8 weights included), the pools (one window pool per layer, a paged
compressed-KV pool and index-key pool per kv source, each bf16 or in V4.1's packed byte
formats), the block tables, the slot mappings and the compressor's partial groups. The ops
do the rest of attention-v41.md §4-§8 between the projections: the norm and RoPE chains
with their round trips and pool writes, the compressor's pooling, index scores, the
candidate mask, the top-k and the sparse attention with the sink.

`PagedV41.step(xs, seqs, pos)` runs one decode token for each of several sequences at
their own positions, through every layer. On the CPU its outputs equal `RefStack`'s (one
sequence at a time) bit for bit, with bf16 or packed pools (`tests/test_ops_engine.py`).

Run it: `python examples/paged_engine.py [--kv-format packed] [--weights fp8] [--device
cuda]`: a few sequences decoded side by side and checked against the reference (on CUDA
within the bf16 tolerance: the kernels sum in other orders).

Scope: decode steps, the index keys a Full layer scores being its own (the project's
default; `index_keys="own"`). Prefill runs token by token here; a real engine would
prefill with `attnv41.BatchV41` or `AttnV41` (or chunked calls of the same ops, whose
window selection then covers the chunk's own rows, attention-v41.md §4.5).
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
    """Decode state of `n_seqs` sequences over engine-owned pools; see the module doc."""

    def __init__(
        self,
        cfg: AttnV41Cfg,
        weights: list[dict[str, torch.Tensor]],
        n_seqs: int,
        kv_format: str = "bf16",
        block_rows: int = 4,
        device="cpu",
        seed: int = 0,
    ):
        if kv_format not in ("bf16", "packed"):
            raise ValueError(f"kv_format = {kv_format!r}; allowed: 'bf16', 'packed'")
        self.cfg, self.n_seqs, self.B, self.device = cfg, n_seqs, block_rows, torch.device(device)
        self.w = [{k: v.to(self.device) for k, v in wl.items()} for wl in weights]
        self.tables = RefTables.build(cfg, self.device)
        D, W = cfg.head_dim, cfg.window
        # one ring of W rows per sequence in each layer's window pool: position p of sequence
        # s at row s·W + p % W
        self.win = [_pool(n_seqs * W, D, "fp8_e8m0", kv_format, self.device) for _ in range(cfg.n_layers)]
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
        self._empty_comp = self.win[0][:0]  # the compressed pool of a window-only layer: no rows

    def _phys(self, table: torch.Tensor, seqs: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Pool rows of logical rows j (≥ 0) of sequences seqs."""
        return table[seqs, j // self.B].long() * self.B + j % self.B

    def step(self, xs: list[torch.Tensor], seqs: list[int], pos: list[int]) -> list[dict[str, torch.Tensor]]:
        """One decode token per sequence: `xs[i]` bf16 `[T, dim]` is layer i's input for the
        T tokens of sequences `seqs` (distinct) at positions `pos`. Returns per layer `o`
        (the attention, bf16 `[T, H, D]`) and `out` (bf16 `[T, dim]`)."""
        cfg, dev = self.cfg, self.device
        T, H, D, W = len(seqs), cfg.n_heads, cfg.head_dim, cfg.window
        s_t = torch.tensor(seqs, device=dev)
        p_t = torch.tensor(pos, device=dev)
        win_slot = s_t * W + p_t % W
        # the ring oldest first (attention-v41.md §4.5), as pool rows; −1 where never written
        ring = (torch.arange(W, device=dev)[None, :] + (p_t % W + 1)[:, None]) % W
        win_sel = torch.where(ring <= p_t[:, None], s_t[:, None] * W + ring, -1)
        comp = None  # the latest kv source's pools
        top = cand = None  # the selection's compressed part (logical rows), the candidate mask
        outs = []
        for i, role in enumerate(cfg.roles):
            w, x, r = self.w[i], xs[i], role.ratio
            cos, sin = self.tables.for_ratio(r)
            # §4: q, kv and the window
            c = OPS.rms_norm(project(w, "wq_a", x), w["q_norm.weight"], cfg.norm_eps)
            q = OPS.rope(project(w, "wq_b", c).view(T, H, D), cos, sin, p_t)
            OPS.kv_rows(project(w, "wkv", x), w["kv_norm.weight"], cfg.norm_eps, cos, sin, p_t, win_slot, self.win[i])
            offset = self.win[i].shape[0]
            sel = win_sel
            if r > 0:
                vis = (p_t + 1) // r  # L_t: the rows a token sees
                if role.is_kv_source:
                    self._compress(i, role, w, x, s_t, p_t)
                    comp = self.src[i]
                if role.is_index_source:
                    top, cand = self._select(i, role, w, x, c, s_t, p_t, vis, cand)
                # the compressed part: logical rows → pool rows of the latest kv source, + offset
                phys = self._phys(comp.table, s_t[:, None], top.clamp_min(0).long())
                sel = torch.cat([win_sel, torch.where(top >= 0, phys + offset, -1)], dim=1)
            pool = comp.comp if r > 0 else self._empty_comp
            # §7: sparse attention with the sink over the pools, read in place
            o = OPS.sparse_attn(q, self.win[i], pool, sel.to(torch.int32), offset, w["attn_sink"], D**-0.5)
            # §8: inverse RoPE, the grouped wo_a, wo_b
            u = self._wo_a(w, OPS.rope(o, cos, sin, p_t, inverse=True))
            outs.append({"o": o, "out": project(w, "wo_b", u)})
        return outs

    def _compress(self, i, role, w, x, s_t, p_t) -> None:
        """§5-§6.1: feed the tokens to layer i's compressor; rows that complete a group go to
        its compressed pool and their index keys to its key pool."""
        cfg, pools, r = self.cfg, self.src[i], role.ratio
        a, g = compress_project(x, w["compressor.wkv.weight"], w.get("compressor.wgate.weight") if r >= 2 else None)
        done = ((p_t + 1) % r == 0).nonzero().flatten()  # (an engine plans this on the host)
        if r >= 2:
            pools.part_a[s_t, p_t % r] = a
            pools.part_g[s_t, p_t % r] = g
            if len(done) == 0:
                return
            pooled = OPS.compress_pool(pools.part_a[s_t[done]], pools.part_g[s_t[done]]).to(BF)
            pools.part_g[s_t[done]] = float("-inf")
        else:
            pooled = a  # r = 1: one row per token, its bf16 projection
        j = (p_t[done] + 1) // r - 1  # the completed rows' logical index
        row = self._phys(pools.table, s_t[done], j)
        cos, sin = self.tables.yarn_cos, self.tables.yarn_sin
        latent = OPS.compress_rows(pooled, w["compressor.norm.weight"], cfg.norm_eps, cos, sin, j * r, row, pools.comp)
        kp = linear(latent, w["indexer.wk.weight"])
        OPS.index_key_rows(kp, w["indexer.k_norm.weight"], cfg.norm_eps, cos, sin, j * r, row, pools.keys)

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


def main(argv=None) -> int:
    import dataclasses

    from attnv41.golden import GoldenFile, bundled_golden_path
    from attnv41.reference.layer import RefStack
    from attnv41.synthetic import random_weights
    from attnv41.testing import compare_bf16

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv-format", choices=("bf16", "packed"), default="bf16")
    ap.add_argument(
        "--weights",
        choices=("golden", "fp8"),
        default="golden",
        help="the bundled tiny golden file's bf16 weights, or random FP8 ones (q_rank 32)",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args(argv)
    gold = GoldenFile(bundled_golden_path())
    if a.weights == "golden":
        cfg = gold.cfg
        weights = [gold.weights(i) for i in range(cfg.n_layers)]
    else:
        cfg = dataclasses.replace(gold.cfg, q_rank=32)  # every FP8 linear's in-dim a multiple of 32
        weights = random_weights(cfg, 0, weights="fp8")
    n = 3
    eng = PagedV41(cfg, weights, n_seqs=n, kv_format=a.kv_format, device=a.device)
    refs = [RefStack(cfg, weights) for _ in range(n)]
    gen = torch.Generator().manual_seed(1)
    starts = [0, 5, 11]  # sequence s starts at step starts[s]: other positions in the same step
    worst = 0.0
    for step in range(a.steps):
        seqs = [s for s in range(n) if 0 <= step - starts[s] < cfg.max_seq]
        pos = [step - starts[s] for s in seqs]
        xs = [torch.randn(len(seqs), cfg.dim, generator=gen).to(BF) for _ in range(cfg.n_layers)]
        got = eng.step([x.to(eng.device) for x in xs], seqs, pos)
        for t, (s, p) in enumerate(zip(seqs, pos)):
            exp = refs[s].step([x[t : t + 1] for x in xs], p)
            for i in range(cfg.n_layers):
                g = got[i]["out"][t : t + 1].cpu()
                if eng.device.type == "cpu":
                    if not torch.equal(g, exp[i].out):
                        print(f"step {step}, sequence {s} at {p}, layer {i}: out differs from the reference")
                        return 1
                    continue
                cmp = compare_bf16(f"out: step {step}, sequence {s} at {p}, layer {i}", g, exp[i].out)
                worst = max(worst, cmp.ratio)
                if not cmp.ok:
                    print(cmp)
                    return 1
    rule = "bit for bit" if eng.device.type == "cpu" else f"within the bf16 tolerance (worst {worst:.3g} of it)"
    print(f"{a.steps} steps of {n} sequences, {a.kv_format} pools, {a.weights} weights: the reference's outputs {rule}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
