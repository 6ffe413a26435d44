"""The compressor and the index selection of a batched layer (`BatchV41`,
`runtime/batch.py`): every sequence's groups pooled at once (decode steps, continuations
from device metadata, host-planned steps), the index scores over the paged key pool (with
released index keys: each token's owner), the candidate mask and the top-k.

A mixin: it reads the runtime's config, pool, op table, workspaces and the layer wiring
(`runtime/batch.py`).
"""

from __future__ import annotations

import torch

from ..kernels import select
from ..weights import AttnV41LayerWeights
from .ops import compacts, prompt_tokens
from .pool import BatchStep, _cdiv

__all__ = ["BatchParts"]


class BatchParts:
    """`BatchV41`'s compressor and index selection (module docstring)."""

    def _released_scores(self, iq, hw, step: BatchStep, vis, owners, t0: int, t1: int, Lw: int) -> torch.Tensor:
        """Index scores of tokens t0..t1−1 with released keys: each token over the keys of
        the layer `owners[t]` (its own table's ratio), one `index_scores_paged` per owner
        among them (a row's bits depend on its own inputs only)."""
        ops, pool, roles = self.ops, self.pool, self.cfg.roles
        groups: dict[int, list[int]] = {}
        for t in range(t0, t1):
            groups.setdefault(owners[t], []).append(t)
        if len(groups) == 1:
            (j,) = groups
            keys, table = pool.index_k[j], pool.tables[roles[j].ratio]
            return ops.index_scores_paged(
                iq[t0:t1], hw[t0:t1], keys, table, step.tok_slot[t0:t1], pool.block_rows, vis[t0:t1], Lw
            )
        scores = torch.empty(t1 - t0, Lw, dtype=torch.bfloat16, device=self.device)
        for j, ts in groups.items():
            idx = torch.tensor(ts, device=self.device)
            keys, table = pool.index_k[j], pool.tables[roles[j].ratio]
            scores[idx - t0] = ops.index_scores_paged(
                iq[idx], hw[idx], keys, table, step.tok_slot[idx], pool.block_rows, vis[idx], Lw
            )
        return scores

    def _released_scores_dev(self, iq, hw, step: BatchStep, vis, own, t0: int, t1: int, Lw: int) -> torch.Tensor:
        """`_released_scores` at fixed shapes (capturable): the owners `own` [T] on the
        device. One `index_scores_paged` per layer that publishes keys, each token seeing
        its visible rows only in its owner's (the others see none: nothing of them is
        read), the owner's row kept. A row's bits depend on its own inputs only, so each
        token gets the bytes of the eager grouping. A publisher whose table holds fewer
        rows than `Lw` (a larger ratio than the scoring layer's: `Lw = bucket // r`) is
        scored over the rows it holds, −∞ past them: `_keys_plan` keeps a token's visible
        count within its owner's rows, and rows past it are −∞ in any call."""
        ops, pool, roles = self.ops, self.pool, self.cfg.roles
        o, v = own[t0:t1], vis[t0:t1]
        scores = None
        for j in self.publishers:
            table = pool.tables[roles[j].ratio]
            wj = min(Lw, table.shape[1] * pool.block_rows)
            mine = o == j
            s = ops.index_scores_paged(
                iq[t0:t1], hw[t0:t1], pool.index_k[j], table, step.tok_slot[t0:t1], pool.block_rows,
                torch.where(mine, v, 0), wj,
            )  # fmt: skip
            if wj < Lw:
                s = torch.cat([s, s.new_full((t1 - t0, Lw - wj), float("-inf"))], dim=1)
            scores = s if scores is None else torch.where(mine[:, None], s, scores)
        return scores

    def _compress_decode(self, w: AttnV41LayerWeights, x: torch.Tensor, step: BatchStep) -> None:
        """A decode-only step's compressor (ratio ≥ 2) at fixed shapes, as the one-sequence
        decode step runs it (`AttnV41._compress_step`): each token into its slot's state at
        p mod r, every sequence's group pooled (complete or not) and written at cache row
        ⌊p/r⌋ (in progress: past the visible rows, unread, rewritten until it completes),
        the gate scores of completed groups reset to −∞. The same bytes as `_compress`."""
        c, ops, pool, attn = self.cfg, self.ops, self.pool, self.attn
        i, r, D, T = w.role.layer, w.role.ratio, c.head_dim, step.T
        plan = step.__dict__.setdefault("_plans", {}).get(("decode", r))
        if plan is None:
            p = step.pos.long()
            sl = step.tok_slot.long()
            plan = dict(
                state=sl * r + p % r,
                groups=(sl[:, None] * r + torch.arange(r, device=self.device)[None, :]).reshape(-1),
                done=((p + 1) % r == 0)[:, None],
                phys=pool.physical(r, sl, p // r),
                row_pos=((p // r) * r).to(torch.int32),
            )
            step._plans[("decode", r)] = plan
        a_all = ops.mm(x, w["compressor.wkv.weight"], out=attn.comp_a[:T])
        g_all = ops.mm(x, w["compressor.wgate.weight"], out=attn.comp_g[:T])
        sa, sg = pool.comp_a[i].view(-1, D), pool.comp_g[i].view(-1, D)
        sa.index_copy_(0, plan["state"], a_all)
        sg.index_copy_(0, plan["state"], g_all)
        grp = plan["groups"]
        pooled = ops.compress_pool(
            sa.index_select(0, grp).view(T, r, D), sg.index_select(0, grp).view(T, r, D), out=attn.comp_a[:T]
        )
        sgv = pool.comp_g[i]
        sgv.index_copy_(
            0,
            step.tok_slot.long(),
            sgv.index_select(0, step.tok_slot.long()).masked_fill(plan["done"][:, :, None], float("-inf")),
        )
        attn.lat_pre[:T].copy_(pooled)
        self._compressed_rows(w, attn.lat_pre[:T], plan)

    def _compress_cont(self, w: AttnV41LayerWeights, x: torch.Tensor, step: BatchStep) -> None:
        """A continuation step's compressor (ratio r ≥ 2) at fixed shapes (capturable): every
        token pools the group it belongs to as it stands after the step (positions before
        its sequence's call from the slot's state, those of the call from the step's rows,
        later ones absent: gate −∞, value 0) and writes it at cache row ⌊p/r⌋. A completed
        group's row has `_compress`'s inputs in its order, so its bytes; the tokens of one
        group write the same bytes; a group still in progress lies past the visible rows,
        unread, rewritten until it completes. The state then holds what one token at a time
        leaves: each slot the step's last token on it, and after a completed group the
        gate scores of the slots past the new group in progress −∞. The undo buffers get
        the state before the step and the step's rows first (`rollback`)."""
        c, ops, pool, attn = self.cfg, self.ops, self.pool, self.attn
        i, r, D, T = w.role.layer, w.role.ratio, c.head_dim, step.T
        plan = step.__dict__.setdefault("_plans", {}).get(("cont", r))
        if plan is None:
            p, sl = step.pos.long(), step.tok_slot.long()
            s, e, off = step.seq_start.long(), step.seq_end.long(), step.seq_off.long()
            j = torch.arange(r, device=self.device)[None, :]
            q = (p // r)[:, None] * r + j  # [T, r]: the positions of each token's group
            S1 = pool.state_slots
            src = torch.where(
                q < s[:, None],
                sl[:, None] * r + j,
                torch.where(q < e[:, None], S1 * r + off[:, None] + (q - s[:, None]), S1 * r + T),
            )
            last = p + r * torch.div(e - 1 - p, r, rounding_mode="floor")  # the step's last token on p's slot
            done = (e // r > s // r)[:, None] & (j >= (e % r)[:, None])  # gates reset by a completed group
            plan = dict(
                src=src.reshape(-1),
                state=sl * r + p % r,
                last=off + last - s,
                done=done[:, :, None],
                phys=pool.physical(r, sl, p // r),
                row_pos=((p // r) * r).to(torch.int32),
            )
            step._plans[("cont", r)] = plan
        a_all = ops.mm(x, w["compressor.wkv.weight"], out=attn.comp_a[:T])
        g_all = ops.mm(x, w["compressor.wgate.weight"], out=attn.comp_g[:T])
        sa3, sg3 = pool.comp_a[i], pool.comp_g[i]
        sa, sg = sa3.view(-1, D), sg3.view(-1, D)
        pa, pg, ua, ug = step.undo_state[i]
        sl = step.tok_slot.long()
        torch.index_select(sa3, 0, sl, out=pa)
        torch.index_select(sg3, 0, sl, out=pg)
        ua.copy_(a_all)
        ug.copy_(g_all)
        a = torch.cat([sa, a_all, a_all.new_zeros(1, D)]).index_select(0, plan["src"]).view(T, r, D)
        g = torch.cat([sg, g_all, g_all.new_full((1, D), float("-inf"))]).index_select(0, plan["src"]).view(T, r, D)
        # the state: each slot the step's last token on it (a sequence's tokens on one slot write the same row)
        sa.index_copy_(0, plan["state"], a_all.index_select(0, plan["last"]))
        sg.index_copy_(0, plan["state"], g_all.index_select(0, plan["last"]))
        sg3.index_copy_(0, sl, sg3.index_select(0, sl).masked_fill(plan["done"], float("-inf")))
        pooled = ops.compress_pool(a, g, out=attn.comp_a[:T])
        attn.lat_pre[:T].copy_(pooled)
        self._compressed_rows(w, attn.lat_pre[:T], plan)

    def _compressed_rows(self, w: AttnV41LayerWeights, lat: torch.Tensor, plan: dict) -> None:
        """New compressed rows (pooled, bf16) → norm → RoPE → fp4 → the pool at `phys`, and
        their index keys (`indexer.wk` → norm → RoPE → fp4), one fused chain each."""
        c, ops, pool, attn = self.cfg, self.ops, self.pool, self.attn
        i, n = w.role.layer, lat.shape[0]
        # the chains write the pools' rows (packed pools: V4.1's bytes) at their physical rows
        latent = ops.compress_kv_chain(
            lat,
            w["compressor.norm.weight"],
            c.norm_eps,
            attn.yarn_cos,
            attn.yarn_sin,
            plan["row_pos"],
            plan["phys"],
            attn.latent[:n],
            pool.compress_kv[i],
            attn.nonfinite,
        )
        kp = ops.mm(latent, w["indexer.wk.weight"], out=attn.k_pre[:n])
        ops.index_k_chain(
            kp,
            w["indexer.k_norm.weight"],
            c.norm_eps,
            attn.yarn_cos,
            attn.yarn_sin,
            plan["row_pos"],
            plan["phys"],
            pool.index_k[i],
            attn.nonfinite,
        )

    def _compress_plan(self, step: BatchStep, r: int) -> dict:
        """The step's compressor bookkeeping for ratio r (the same for every kv source of
        that ratio; built once per step on the host, then index tensors on the device).

        Per sequence the rows `combined` = its group in progress (state slots 0 … h−1),
        then its tokens; its first n·r combined rows are n complete groups. `comb` gathers
        combined from [state rows (slot·r + j) | the step's rows (S·r + t)]; `groups`
        picks every complete group's rows from combined; `dst`/`src` write the new state
        (the remainder into slots 0 … rem−1; after a completion the last group's values
        into the others, whose gate scores `dead` become −∞, as the one-sequence path
        leaves them); `logical`/`slots` name each new cache row."""
        plans = step.__dict__.setdefault("_plans", {})
        if r in plans:
            return plans[r]
        S = self.pool.state_slots
        comb, groups, dst, src, dead, logical, slots, logs = [], [], [], [], [], [], [], {}
        for slot, s, m, o in zip(step.slots, step.starts, step.lens, step.offsets):
            j0 = s // r
            h = s - j0 * r
            c0 = len(comb)
            comb += [slot * r + j for j in range(h)] + [S * r + o + t for t in range(m)]
            n, rem = (h + m) // r, (h + m) % r
            groups += range(c0, c0 + n * r)
            dst += [slot * r + j for j in range(rem)]
            src += [c0 + n * r + j for j in range(rem)]
            if n > 0:
                dst += [slot * r + j for j in range(rem, r)]
                src += [c0 + (n - 1) * r + j for j in range(rem, r)]
                dead += [slot * r + j for j in range(rem, r)]
            logical += range(j0, j0 + n)
            slots += [slot] * n
            if slot in step.logged:
                logs[slot] = (j0 * r, c0, h + m)

        def t(v):
            return torch.tensor(v, dtype=torch.int64, device=self.device)

        plan = dict(comb=t(comb), groups=t(groups), dst=t(dst), src=t(src), dead=t(dead), n=len(logical), logs=logs)
        if logical:
            lg = t(logical)
            plan["phys"] = self.pool.physical(r, t(slots), lg)
            plan["row_pos"] = (lg * r).to(torch.int32)
        plans[r] = plan
        return plan

    def _compress(self, w: AttnV41LayerWeights, x: torch.Tensor, step: BatchStep) -> None:
        """The step's tokens into layer i's compressor, every sequence at once (each after
        its group in progress: `_compress_plan`); completed groups into the pools at their
        physical rows (one fused chain each for the rows and the index keys)."""
        c, ops, pool, attn = self.cfg, self.ops, self.pool, self.attn
        i, r, D = w.role.layer, w.role.ratio, c.head_dim
        T = step.T
        if r == 1:
            lat_all = ops.mm(x, w["compressor.wkv.weight"], out=attn.lat_pre[:T])
            plan = step.__dict__.setdefault("_plans", {}).get(1)
            if plan is None:  # a token's row is its position (from the device metadata: capturable)
                lg = step.pos.long()
                plan = dict(n=T, phys=pool.physical(1, step.tok_slot.long(), lg), row_pos=step.pos)
                step._plans[1] = plan
        else:
            plan = self._compress_plan(step, r)
            a_all = ops.mm(x, w["compressor.wkv.weight"], out=attn.comp_a[:T])
            g_all = ops.mm(x, w["compressor.wgate.weight"], out=attn.comp_g[:T])
            sa, sg = pool.comp_a[i].view(-1, D), pool.comp_g[i].view(-1, D)
            a = torch.cat([sa, a_all]).index_select(0, plan["comb"])
            g = torch.cat([sg, g_all]).index_select(0, plan["comb"])
            for slot, (a0, c0, ln) in plan["logs"].items():  # the group inputs from position a0 on
                self.undo[slot]["a"][i] = (a0, a[c0 : c0 + ln].clone(), g[c0 : c0 + ln].clone())
            sa.index_copy_(0, plan["dst"], a.index_select(0, plan["src"]))
            sg.index_copy_(0, plan["dst"], g.index_select(0, plan["src"]))
            sg.index_fill_(0, plan["dead"], float("-inf"))
            n = plan["n"]
            if n == 0:
                return
            grp = plan["groups"]
            lat_all = attn.lat_pre[:n]
            lat_all.copy_(ops.compress_pool(a.index_select(0, grp).view(n, r, D), g.index_select(0, grp).view(n, r, D)))
        self._compressed_rows(w, lat_all, plan)

    def _select(self, w, cq, x, step: BatchStep, keys_layer: int, cos, sin, hw_done: bool) -> None:
        """An index source's queries; then for every token at once: its scores over its
        sequence's keys in the paged pool (`ops.index_scores_paged`, the step's widest
        visible count as the width, −∞ past each token's own), the candidate mask or its
        use, and the fixed-width top-k (logical rows ascending, −1 tail). Each token's
        result equals its sequence's alone (the fixed-width forms' contract)."""
        c, ops, pool, attn = self.cfg, self.ops, self.pool, self.attn
        i, r = w.role.layer, w.role.ratio
        T = step.T
        iq, hw = attn.iq[:T], attn.hw[:T]
        if not hw_done:
            attn._linear(w, "indexer.wq_b", cq, iq.view(T, -1))
            ops.mm(x, w["indexer.weights_proj.weight"], out=hw)
        ops.index_q_chain(iq, cos, sin, step.pos, iq, hw=hw, hw_scale=c.index_head_dim**-0.5 * c.index_heads**-0.5)
        K = c.index_topk
        pub = torch.full((T, K), -1, dtype=torch.int32, device=self.device)
        self.sel_pub[i] = pub
        widths = [(s + m) // r for s, m in zip(step.starts, step.lens)]
        Lw = max(widths) if step.bucket is None else step.bucket // r
        if Lw == 0:
            if w.role.is_candidate_source:
                self.cand_pub = self.cand_ids = None
            return
        vis = torch.div(step.pos + 1, r, rounding_mode="floor")
        k = min(K, Lw)
        # tokens scored at a time (AttnV41.index_tile_entries): no [T, Lw] buffer at a 1M
        # context; every op is row-wise, so the bits do not depend on the tiling
        tile = max(1, attn.index_tile_entries // Lw)
        tiled = tile < T
        # reindex layers over their candidates only (runtime/ops.compacts): the candidate source's
        # kept blocks ascending (in tiles its published ids, else written with its mask); a
        # reindex layer with its own keys scores them
        compact = compacts(ops, c, Lw)
        gather = w.role.uses_candidates and compact and step.owners_dev is None and step.keys_plan is None
        if w.role.is_candidate_source:
            keep = min(c.cand_blocks, _cdiv(Lw, c.cand_block))
            self._cand_width = Lw
            self.cand_pub = (
                torch.empty(T, keep, dtype=torch.int32, device=self.device)
                if tiled
                else torch.empty(T, Lw, dtype=torch.bool, device=self.device)
            )
            ids_own = self.cand_pub if tiled else torch.empty(T, keep, dtype=torch.int32, device=self.device)
            self.cand_ids = ids_own if compact else None
        trace, pieces = None, []
        if self.trace_slot in step.slots:
            b = step.slots.index(self.trace_slot)
            trace = (step.offsets[b], step.lens[b], widths[b])
        if gather:
            self._select_candidates(iq, hw, step, vis, pool.index_k[keys_layer], pool.tables[r], Lw, pub, trace, i)
            return
        owners = None  # released keys: the layer each token's sequence scores (host, per token)
        own_dev = None  # ... or on the device (a captured step)
        if step.owners_dev is not None:
            own_dev = step.owners_dev[self.index_sources.index(i)]
        elif step.keys_plan is not None:  # no owner yet: the sequence sees no key (L = 0), any pool reads nothing
            owners = [keys_layer if j is None else j for j, m in zip(step.keys_plan[0][i], step.lens) for _ in range(m)]
        for t0 in range(0, T, tile):
            t1 = min(T, t0 + tile)
            if own_dev is not None:
                scores = self._released_scores_dev(iq, hw, step, vis, own_dev, t0, t1, Lw)
            elif owners is None:
                scores = ops.index_scores_paged(
                    iq[t0:t1],
                    hw[t0:t1],
                    pool.index_k[keys_layer],
                    pool.tables[r],
                    step.tok_slot[t0:t1],
                    pool.block_rows,
                    vis[t0:t1],
                    Lw,
                    **prompt_tokens(t1 - t0, max(step.lens, default=0)),  # {} in a decode step (runs of 1)
                )
            else:
                scores = self._released_scores(iq, hw, step, vis, owners, t0, t1, Lw)
            if w.role.is_candidate_source:
                if tiled:
                    mask = torch.empty(t1 - t0, Lw, dtype=torch.bool, device=self.device)
                    ops.candidate_mask_fixed(scores, vis[t0:t1], c.cand_blocks, c.cand_block, out=mask)
                    select.kept_block_ids(mask, c.cand_block, out=self.cand_pub[t0:t1])
                else:
                    ids = {} if self.cand_ids is None else {"ids_out": self.cand_ids}
                    ops.candidate_mask_fixed(scores, vis, c.cand_blocks, c.cand_block, out=self.cand_pub, **ids)
            if w.role.uses_candidates:
                scores = torch.where(self._candidates(t0, t1, Lw), scores, attn.neg_inf)
            ops.topk_fixed(scores, vis[t0:t1], k, 0, out=pub[t0:t1, :k])
            if trace is not None and trace[2] > 0:  # the traced sequence's rows in this tile
                a, e = max(t0, trace[0]), min(t1, trace[0] + trace[1])
                if a < e:
                    pieces.append(scores[a - t0 : e - t0, : trace[2]].clone())
        if pieces:
            self._scores[i] = torch.cat(pieces)

    def _select_candidates(self, iq, hw, step: BatchStep, vis, keys, table, Lw: int, pub, trace, i: int) -> None:
        """A reindex layer's scores over its candidates only (`runtime.ops.compacts`): the
        gathered form over the kept blocks the candidate source wrote this step, and the
        top-k of its entries written as positions; the bytes of the full form's selection."""
        c, ops = self.cfg, self.ops
        if self.cand_ids is None or self._cand_width != Lw:
            raise RuntimeError(f"layer {i}: no candidate blocks of width {Lw} were written this step")
        ids, cb, T = self.cand_ids, c.cand_block, step.T
        # tokens at a time as the full form tiles them (no [T, C] buffer past index_tile_entries)
        tile = max(1, self.attn.index_tile_entries // (ids.shape[1] * cb))
        pieces = []
        for t0 in range(0, T, tile):
            t1 = min(T, t0 + tile)
            sl = slice(t0, t1)
            scores = ops.index_scores_paged(
                iq[sl], hw[sl], keys, table, step.tok_slot[sl], self.pool.block_rows, vis[sl], Lw,
                ids=ids[sl], cand_block=cb,
            )  # fmt: skip
            ops.topk_fixed(scores, vis[sl], c.index_topk, 0, out=pub[sl], ids=ids[sl], cand_block=cb)
            if trace is not None and trace[2] > 0:  # the traced sequence's scores at their positions
                a, e = max(t0, trace[0]), min(t1, trace[0] + trace[1])
                if a < e:
                    pieces.append(select.gathered_to_full(scores[a - t0 : e - t0], ids[a:e], cb, trace[2]))
        if pieces:
            self._scores[i] = torch.cat(pieces)

    def _candidates(self, t0: int, t1: int, width: int) -> torch.Tensor:
        """bool `[t1 − t0, width]`: the step's published candidate mask of tokens t0..t1−1
        (stored as the mask, or as kept block ids when the step was scored in tiles)."""
        cand = self.cand_pub[t0:t1]
        if cand.dtype == torch.bool:
            return cand[:, :width]
        return select.candidate_mask_of_blocks(cand, width, self.cfg.cand_block)
