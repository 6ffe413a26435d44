"""The capturable decode split of `AttnV41` (runtime-api.md): `decode_prep` (host: the
position into the device plan, the step's bookkeeping) and `decode_body` (device only:
every kernel of one layer's single-token step, from the plan's metadata), with the
queries about it (`decode_capturable`, `decode_fixed_topk`, `bucket`) and the decode
token's compressor step.

A mixin: it reads the runtime's tables, workspaces, op table and plan (`runtime/attn.py`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from ..kernels import gemv, tc_mm
from ..state import AttnV41LayerState, SharedV41
from ..weights import AttnV41LayerWeights
from .checks import not_an_int
from .device import on_own_device
from .ops import compacts
from .plan import ROW, ROW_POS, SLOT, VIS

__all__ = ["AttnDecode"]

# Inside a CUDA graph capture of decode steps (the single-token layer step `_decode_kernels`,
# the batched runtime's decode-only steps), independent kernels on the runtime's second
# stream, forked and joined within the layer: the window row's chain beside q's norm and
# wq_b, and a kv source's compressor step (ratio ≥ 2 in batched steps) beside the layer's
# first projections (it reads only x, the layer's state and the plan). The same kernels on
# the same inputs and outputs, so the same bytes as one stream; eager steps keep one stream
# (a fork and a join cost host time on every call). Needs the split products' "launch"
# form (the "counter" forms share arrival counters, which two streams must not; with those
# forms set, a capture raises ValueError). On since the fortieth entry (BENCHMARKS.md; the
# one-stream steps: scripts/ab_steps.py, "one stream").
SIDE_STREAM = True
# Two more forks with SIDE_STREAM, off: no faster (fortieth entry, H100; the same bytes).
# `SIDE_WKV`: wkv's product alone on the second stream before the window row's chain,
# beside wq_a's (and the index head weights') on the first. `SIDE_INDEX`: an index source's
# index path (its index queries' product, scores, candidate mask, top-k) on the second
# stream from q's norm on, beside wq_b's product (single-sequence steps only). The FP8
# single-sequence step at 32K: 3.260 ms with the first, 3.273 with the second, 3.272 with
# both, 3.251 with neither (the call before; one stream 3.361 and 3.356 in the two calls);
# the batched B = 64 step with `SIDE_WKV` 8.965 against 8.574.
SIDE_WKV = False
SIDE_INDEX = False


@dataclass
class _Ticket:
    """What one `decode_prep` prepared: the sequence, layer and position its decode_body
    must run for, the compressed rows it returned, and whether an eager body ran it."""

    shared: SharedV41
    layer: int
    pos: int
    rows: torch.Tensor | None
    keys: torch.Tensor | None  # the index keys an index source scores against
    before: tuple[int, int, int]  # the sequence's order state before the prep
    done: bool = False


class AttnDecode:
    """`AttnV41`'s decode split (module docstring)."""

    def decode_capturable(self, w: AttnV41LayerWeights) -> bool:
        """Whether this layer's single-token step can be captured into a CUDA graph: true
        for every role. Sources too run from device metadata (compressor slot and group
        completion, visible rows, the bucket's masked scores, a fixed-width top-k)."""
        self._check_freed("decode_capturable")
        self._check_role(w)
        return True

    def decode_fixed_topk(self, w: AttnV41LayerWeights) -> int:
        """The selection width a captured step launches sparse attention with: the widest
        selection of the layer's class, so the launch argument is constant. −1 padding
        adds an exact zero, so results equal the eager step's bit for bit."""
        self._check_freed("decode_fixed_topk")
        self._check_role(w)
        return self._width(w.role.ratio)

    def bucket(self, start_pos: int) -> int:
        """The context bucket of a decode step at `start_pos` (see `DecodePlan`): index
        sources score `bucket // ratio` keys, masked past the visible ones."""
        self._check_freed("bucket")
        self._check_pos_decode(start_pos)
        return self.plan.bucket(start_pos)

    def invalidate_decode_uploads(self) -> None:
        """Forget what the decode buffers hold; the next `decode_prep` writes them again."""
        self._check_freed("invalidate_decode_uploads")
        self.plan.invalidate()

    @on_own_device(lambda self: self)
    def decode_prep(self, w: AttnV41LayerWeights, shared: SharedV41, start_pos: int) -> torch.Tensor | None:
        """Host half of a layer's decode step at `start_pos`: the position into the device
        plan (with the metadata derived from it, only when it changed) and the host
        bookkeeping the step implies (what the layer publishes, the visible counts).
        Returns the compressed rows the layer's attention reads (the kv source's cache, a
        tensor whose address a graph bakes), or None on ratio-0 layers.

        Checks the layer's turn in the sequence (layer 0 opens the step after the last
        complete one, layer i follows layer i−1 of the same step) and records the prepared
        step: the next eager `decode_body` must be this layer's, with these rows. The
        sequence's order state advances here, so a graph replay of the body (which runs
        no host code) keeps it; preparing the same layer and position again is allowed
        until its body ran eagerly."""
        self._check_live("decode_prep")
        self._check_role(w)
        role = w.role
        self._check_pos_decode(start_pos)
        self._check_shared(shared)
        i = role.layer
        self._check_failed(shared, f"layer {i} at start_pos {start_pos}")
        t = self._ticket
        again = t is not None and not t.done and t.shared is shared and t.layer == i and t.pos == start_pos
        pr = shared.prepared
        # prepared last in this sequence, its order state unchanged since, though another
        # sequence's decode_prep on this runtime came between (that dropped the ticket)
        again_seq = pr is not None and pr[:2] == (i, start_pos) and self._book(shared) == (i, start_pos, start_pos + 1)
        if not (again or again_seq):
            self._check_order(i, shared, start_pos, 1)
        st = self._source_state(role, shared)
        self._check_sources(role, st, shared, start_pos, 1)
        keys = self._decode_publish(role, st, shared, start_pos)
        self.plan.set_pos(start_pos)
        rows = shared.compress_kv if role.ratio > 0 else None
        before = t.before if again else pr[2] if again_seq else self._book(shared)
        self._advance(shared, i, start_pos, 1)
        self._ticket = _Ticket(shared, i, start_pos, rows, keys, before)
        shared.prepared = (i, start_pos, before)
        self._prepared[i] = keys
        return rows

    def _source_state(self, role, shared: SharedV41) -> AttnV41LayerState | None:
        """A kv source's state in this sequence (bound at its prefill), for decode_prep."""
        if not role.is_kv_source:
            return None
        st = shared.sources.get(role.layer)
        if st is None or st.seq_id != shared.seq_id:
            raise ValueError(
                f"layer {role.layer} is a kv source whose state was not prefilled in this sequence; "
                "allowed: decode after its prefill (forward at start_pos 0)"
            )
        return st

    def _decode_publish(self, role, st: AttnV41LayerState | None, shared: SharedV41, p: int) -> torch.Tensor | None:
        """The host bookkeeping of a (checked) decode step of layer `role.layer` at p: what
        it publishes (attention-v41.md §2), all of it known from p. Returns the index
        keys an index source scores against (None for other layers)."""
        c, r = self.cfg, role.ratio
        if r == 0:
            return None
        L = (p + 1) // r
        if role.is_kv_source:
            st.n_rows = L
            shared.compress_kv, shared.compress_ratio, shared.n_compressed = st.compress_kv, r, L
        if not role.is_index_source:
            return None
        if role.is_kv_source and (self.index_keys == "own" or (p + 1) % r == 0):
            shared.index_k, shared.index_k_owner = st.index_k, role.layer
        for key in self._plan_writes(role):  # the device selection (and mask) this step writes
            self.plan.owners[key] = (weakref.ref(shared), shared.seq_id, p)
        if L > 0:
            if role.is_candidate_source:
                shared.candidates, shared.candidates_pos = self.plan.cand[:1, :L], p
            shared.topk_m, shared.topk_k, shared.topk_pos = 1, min(c.index_topk, L), p
            shared.topk_version += 1
        return shared.index_k

    def _plan_writes(self, role) -> tuple:
        """The plan buffers a decode step of this layer writes for later layers of its step:
        an index source's selection row, a candidate source's mask."""
        keys = (("sel", self.plan.sel_slot(role.layer)),) if role.is_index_source else ()
        return keys + ((("cand", 0),) if role.is_candidate_source else ())

    def _plan_reads(self, layer: int, key: tuple) -> str:
        """Whether a decode step of `layer` writes ("w"), else reads ("r") plan buffer `key`,
        or neither ("")."""
        role = self.cfg.roles[layer]
        if key in self._plan_writes(role):
            return "w"
        if key[0] == "sel":
            return "r" if role.ratio > 0 and self.plan.sel_slot(layer) == key[1] else ""
        return "r" if role.uses_candidates else ""

    def _check_plan_free(self, role, shared: SharedV41, start_pos: int) -> None:
        """A decode step of an index (or candidate) source writes the plan's device selection
        row (or candidate mask), which the later layers of its step read. The plan is the
        runtime's, one for every sequence: refuse the write while another sequence's decode
        step in progress still has a layer to run that reads that buffer (layers of two
        sequences interleaved one by one), so neither sequence changes. Checked, writes nothing."""
        n = self.cfg.n_layers
        for key in self._plan_writes(role):
            own = self.plan.owners.get(key)
            other = None if own is None else own[0]()
            if other is None or other is shared or other.seq_id != own[1] or other.failed is not None:
                continue  # no owner, this sequence, or a sequence since dropped, restarted or failed
            q = own[2]
            if (other.step_pos, other.step_end) != (q, q + 1):
                continue  # that step is no longer in progress
            for j in range(other.last_layer + 1, n):
                use = self._plan_reads(j, key)
                if use == "w":
                    break  # that step writes the buffer again before any further read
                if use == "r":
                    what = "selection" if key[0] == "sel" else "candidate mask"
                    raise ValueError(
                        f"layer {role.layer} at start_pos {start_pos} (sequence #{shared.seq_id}) would overwrite "
                        f"the decode {what} that sequence #{own[1]}'s step at start_pos {q} still reads (its layer "
                        f"{j}; layer {other.last_layer} ran last): the decode selections live in the runtime's "
                        f"plan, one for every sequence; allowed: finish that step (layers {other.last_layer + 1}.."
                        f"{n - 1}) first, or start that sequence anew (layer 0 at start_pos 0), or decode the "
                        "sequences on separate runtimes"
                    )

    def _check_pos_decode(self, start_pos: int) -> None:
        hi = self.cfg.max_seq - 1
        if isinstance(start_pos, bool) or not isinstance(start_pos, int):
            raise not_an_int("start_pos", start_pos, f"1..{hi}")
        if not 1 <= start_pos <= hi:
            raise ValueError(f"start_pos = {start_pos!r}; allowed: 1..{hi} (a decode position below max_seq)")

    @on_own_device(lambda self: self)
    def decode_prep_role(self, ratio_positive: bool, shared: SharedV41, start_pos: int) -> None:
        """The position half of `decode_prep` for a class of layers (ratio>0 or ratio 0):
        writes the device position and its metadata (only when it changed). The selections
        themselves are made on the device by the index sources, so nothing else is
        uploaded. Checks that a ratio>0 layer at `start_pos` has a selection published.
        The caller keeps the order of layers and steps."""
        self._check_live("decode_prep_role")
        if not isinstance(ratio_positive, bool):
            raise TypeError(f"ratio_positive = {ratio_positive!r}; allowed: True (ratio>0 layers) or False (ratio 0)")
        self._check_pos_decode(start_pos)
        self._check_shared(shared)
        r = shared.compress_ratio
        L = (start_pos + 1) // r if r else 0
        published = shared.topk_pos == start_pos and shared.topk_m == 1
        if ratio_positive and L > 0 and not published:
            raise ValueError(
                f"start_pos {start_pos}: no selection was published for this step (run the index source first)"
            )
        self.plan.set_pos(start_pos)

    @on_own_device(lambda self: self)
    @torch.no_grad()  # an inference runtime: x and weights may require grad, nothing is recorded
    def decode_body(
        self, w: AttnV41LayerWeights, st: AttnV41LayerState, x: torch.Tensor, rows_b: torch.Tensor | None
    ) -> torch.Tensor:
        """Device half of a layer's decode step: projections, the ring write at
        `pos % window`, on kv sources the compressor (slot, pooled row and its cache
        writes from the device metadata), on index sources the scores over the bucket and
        the fixed-width top-k into the plan, sparse attention over the class's padded
        selection, output projection into `out[:1]`, which it returns. No host
        synchronisation, no per-token scalar: a captured graph replays for any position
        once `decode_prep` has updated the device position.

        Eagerly it must follow this layer's `decode_prep` (the last one on this runtime),
        with the rows it returned and the layer's state of that sequence, and runs that
        step once; everything is checked before the first kernel. During CUDA graph
        capture (which runs and writes nothing) no prepared step is needed, so several
        layers can be captured into one graph; call `decode_prep` for each of them, in
        order, before every replay. A captured index source scores the whole cache
        (`max_seq // ratio` keys, masked past the visible ones), so its graph is valid at
        every position; `DecodeGraphs` captures one graph per bucket instead."""
        c, role = self.cfg, w.role
        self._check_freed("decode_body")
        self._check_x(x, m_max=1)
        x = _dense_rows(x)
        self._check_layer(w, st)
        if role.ratio == 0 and rows_b is not None:
            got = (
                f"a {tuple(rows_b.shape)} tensor" if isinstance(rows_b, torch.Tensor) else f"a {type(rows_b).__name__}"
            )
            raise ValueError(f"layer {role.layer} has ratio 0: rows_b must be None (got {got})")
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # Capture runs nothing and writes no state; the graph's replays are ordered by the
            # decode_prep calls before them. So layers prepared earlier can be captured
            # together (one graph over several layers); only what the graph bakes is checked.
            ok = role.ratio == 0 or (
                isinstance(rows_b, torch.Tensor)
                and rows_b.dim() == 2
                and rows_b.shape[1] == c.head_dim
                and rows_b.dtype == torch.bfloat16
                and rows_b.device == self.device
                and (not role.is_kv_source or _same_tensor(rows_b, st.compress_kv))
            )
            if not ok:
                got = None if not isinstance(rows_b, torch.Tensor) else tuple(rows_b.shape)
                raise ValueError(
                    f"layer {role.layer} has ratio {role.ratio}: rows_b = {got}; allowed: the [n, {c.head_dim}] "
                    "bf16 rows decode_prep returned"
                )
            if st.seq_id is None:
                raise ValueError(
                    f"layer {role.layer}: its state was never prefilled; allowed: the state of the sequence decoded"
                )
            keys = self._prepared.get(role.layer)
            if role.is_index_source and keys is None:
                raise ValueError(
                    f"layer {role.layer} is an index source: capture its decode_body after its decode_prep "
                    "(which chooses the index keys it scores)"
                )
            return self._decode_kernels(w, st, x, rows_b, keys, c.max_seq)
        t = self._ticket
        if t is None or t.layer != role.layer:
            last = "none" if t is None else f"layer {t.layer} at start_pos {t.pos}"
            raise ValueError(
                f"decode_body of layer {role.layer} without its decode_prep (last prepared: {last}); "
                f"allowed: right after decode_prep(w, shared, start_pos) of layer {role.layer}"
            )
        if t.done:
            raise ValueError(
                f"decode_body of layer {role.layer} at start_pos {t.pos} already ran (it would write the ring "
                f"twice); allowed: once per decode_prep (next: {self._expected_next(self._book(t.shared))})"
            )
        if st.seq_id is not None and st.seq_id != t.shared.seq_id:
            raise ValueError(
                f"layer {role.layer}: its state belongs to sequence #{st.seq_id}, but the last decode_prep on this "
                f"runtime was for sequence #{t.shared.seq_id} (layer {t.layer} at start_pos {t.pos}); allowed: the "
                f"state prefilled in sequence #{t.shared.seq_id}, or decode_prep(w, the shared state of sequence "
                f"#{st.seq_id}, start_pos) again right before this decode_body"
            )
        self._check_bound(st, t.shared)
        if role.ratio > 0 and not _same_tensor(rows_b, t.rows):
            got = None if not isinstance(rows_b, torch.Tensor) else tuple(rows_b.shape)
            raise ValueError(
                f"layer {role.layer} has ratio {role.ratio}: rows_b = {got}; allowed: the "
                f"{tuple(t.rows.shape)} [n, {c.head_dim}] rows decode_prep returned for this step "
                "(the compressed-KV cache of this sequence's kv source of this ratio)"
            )
        self._check_values(x, role.layer, t.pos)
        self.plan.set_pos(t.pos)  # an eager forward between prep and body may have moved it
        try:
            out = self._decode_kernels(w, st, x, rows_b, t.keys, self.plan.bucket(t.pos))
        except BaseException:
            t.done = True  # not again, nor prepared again: it may have written part of the step
            t.shared.prepared = None
            t.shared.failed = (role.layer, t.pos)
            raise
        t.done = True
        t.shared.prepared = None  # ran: preparing it again would run it twice
        st.next_pos = t.pos + 1
        return out

    def _decode_kernels(
        self,
        w: AttnV41LayerWeights,
        st: AttnV41LayerState,
        x: torch.Tensor,
        rows_b: torch.Tensor | None,
        keys: torch.Tensor | None,
        bucket: int,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The kernels of one decode token, reading the position and everything derived
        from it from `plan` (derived before: `plan.set_pos` or a captured `plan.derive`);
        index sources score `bucket // ratio` keys. No checks (callers validate). Writes
        the layer output into `out` (default `self.out[:1]`) and returns it."""
        c, ops, role, plan = self.cfg, self.ops, w.role, self.plan
        r, W = role.ratio, c.window
        pos = plan.pos
        cos, sin = self._tables(r)
        side = self._side_stream()
        early = side is not None and r > 0 and role.is_kv_source
        if early:  # the compressor step on the second stream, joined with the window row's chain in _qkv
            self._beside(side, self._compress_step, w, st, x, r)
        index = None  # the index path on the second stream, from q's norm on (SIDE_INDEX)
        if side is not None and SIDE_INDEX and r > 0 and role.is_index_source:

            def index(cq, xq):
                self._decode_index(w, cq, x, keys, bucket, cos, sin, hw_done=True, iq=xq)

        cq, q, kv, hw_done = self._qkv(w, x, pos, cos, sin, 1, st.ring, side=side, index=index)
        if r == 0:
            sel, comp = plan.sel0, self._empty_rows
        else:
            if role.is_kv_source:
                if not early:
                    self._compress_step(w, st, x, r)
                rows_b = st.compress_kv
            comp = rows_b
            sel = plan.sel_for(role.layer)
            if role.is_index_source and index is None:
                self._decode_index(w, cq, x, keys, bucket, cos, sin, hw_done=hw_done)
        # The decode regime's attention (split over the selection on CUDA): every decode
        # token takes it, so its bits never depend on the call (ops.py, sparse_attn_split).
        rot = (cos, sin, pos, self.o_rot[:1])  # the inverse RoPE of o in the attention's epilogue
        o = ops.sparse_attn_decode(q, st.ring, comp, sel, W, w["attn_sink"], c.head_dim**-0.5, out=self.o[:1], rot=rot)
        return self._output(w, o, pos, cos, sin, 1, out=out, rotated=True)

    def _decode_index(self, w, cq, x, keys, bucket: int, cos, sin, hw_done: bool, iq: dict | None = None) -> None:
        """An index source's selection for one decode token into the plan: scores over the
        bucket's `bucket // ratio` keys, the candidate mask (the candidate source), the
        fixed-width top-k. `iq`: None when `_qkv` projected the index queries (with
        `hw_done`), else the keywords of their projection here (`{"xq": cq's round trip}`
        or `{}`: the same call with the weight alone, so the same bits)."""
        c, ops, role, plan = self.cfg, self.ops, w.role, self.plan
        r, W = role.ratio, c.window
        pos, meta, sel = plan.pos, plan.meta[r], plan.sel_for(role.layer)
        Lb = 0 if keys is None else min(bucket // r, keys.shape[0])
        if Lb == 0:
            # No row can be visible in this bucket (bucket // r = 0 ≥ L), or, in released
            # mode, no index keys were published yet (then L = 0, checked): the
            # selection's compressed part is empty.
            sel[:, W:].fill_(-1)
            return
        if iq is not None:
            ws = (w["indexer.wq_b.weight"],)
            ops.mm_many(cq, ws, (self.iq[:1].view(1, -1),), (w.get("indexer.wq_b.scale"),), **iq)
        vis = meta[VIS]
        slot = plan.sel_slot(role.layer)
        compact = compacts(ops, c, Lb)  # the candidate source's ids, a reindex layer's candidates only
        if role.uses_candidates and compact:
            n, ids = c.cand_blocks * c.cand_block, plan.cand_ids[:1]
            scores = self._index_scores(
                w, cq, x, pos, vis, keys[:Lb], cos, sin, out=plan.scores[slot, :, :n], hw_done=hw_done,
                ids=ids, cand_block=c.cand_block,
            )  # fmt: skip
            ops.topk_fixed(scores, vis, c.index_topk, W, out=sel[:, W:], ids=ids, cand_block=c.cand_block)
            return
        scores = self._index_scores(
            w, cq, x, pos, vis, keys[:Lb], cos, sin, out=plan.scores[slot, :, :Lb], hw_done=hw_done
        )
        if role.is_candidate_source:
            ids = {"ids_out": plan.cand_ids[:1]} if compact else {}
            ops.candidate_mask_fixed(scores, vis, c.cand_blocks, c.cand_block, out=plan.cand[:1, :Lb], **ids)
        if role.uses_candidates:
            torch.where(plan.cand[:1, :Lb], scores, self.neg_inf, out=scores)  # one kernel
        k = min(c.index_topk, Lb)
        ops.topk_fixed(scores, vis, k, W, out=sel[:, W : W + k])
        if k < c.index_topk:
            sel[:, W + k :].fill_(-1)

    def _side_stream(self):
        """The second stream of a captured decode step (`SIDE_STREAM`), else None."""
        if not (SIDE_STREAM and self._side is not None and torch.cuda.is_current_stream_capturing()):
            return None
        forms = {"gemv": gemv._SPLIT_FORM, "tc_mm": tc_mm._SPLIT_FORM}
        if any(f != "launch" for f in forms.values()):
            raise ValueError(
                f"SIDE_STREAM with the split forms {forms}; allowed: 'launch' for both (the other forms' arrival "
                "counters must not be shared by kernels running at once on two streams)"
            )
        return self._side

    def _beside(self, side: torch.cuda.Stream, fn, *args) -> None:
        """`fn(*args)` enqueued on `side` after everything enqueued so far on the current
        stream (the caller joins it back with `wait_stream`)."""
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            fn(*args)

    def _compress_step(self, w: AttnV41LayerWeights, st: AttnV41LayerState, x: torch.Tensor, r: int) -> None:
        """§5/§6.1 for one decode token from the device metadata: the token into compressor
        slot p mod r, the group's pooled row (complete or not) through norm, RoPE at
        row·r and the fp4 round trips, written at cache row ⌊p/r⌋ of both caches. A
        group completes at p when p+1 is a multiple of r; before that its row is
        in progress: past the visible rows (⌊(p+1)/r⌋), never read, rewritten each step
        until it completes. On completion the gate scores are reset to −∞."""
        c, ops, plan = self.cfg, self.ops, self.plan
        meta = plan.meta[r]
        if r == 1:
            ops.mm(x, w["compressor.wkv.weight"], out=self.lat_pre[:1])
        else:
            a, g = self.comp_a[:1], self.comp_g[:1]
            ops.mm(x, w["compressor.wkv.weight"], out=a)  # fp32 weights: fp32 math
            ops.mm(x, w["compressor.wgate.weight"], out=g)
            slot = meta[SLOT]
            st.comp_a.index_copy_(0, slot, a)
            st.comp_g.index_copy_(0, slot, g)
            pooled = ops.compress_pool(st.comp_a[None], st.comp_g[None], out=self.pooled[:1])
            st.comp_g.masked_fill_(plan.done[r][0], float("-inf"))
            self.lat_pre[:1].copy_(pooled)
        row, row_pos = meta[ROW], meta[ROW_POS]
        # rms_norm → RoPE at row·r → fp4 e4m3 round trip → compress_kv[row]; then the index key's
        # rms_norm → RoPE → fp4 e8m0 round trip → index_k[row]: one kernel each (kernels/fused.py)
        latent = ops.compress_kv_chain(
            self.lat_pre[:1],
            w["compressor.norm.weight"],
            c.norm_eps,
            self.yarn_cos,
            self.yarn_sin,
            row_pos,
            row,
            self.latent[:1],
            st.compress_kv,
            self.nonfinite,
        )
        kp = ops.mm(latent, w["indexer.wk.weight"], out=self.k_pre[:1])
        ops.index_k_chain(
            kp,
            w["indexer.k_norm.weight"],
            c.norm_eps,
            self.yarn_cos,
            self.yarn_sin,
            row_pos,
            row,
            st.index_k,
            self.nonfinite,
        )


def _dense_rows(x: torch.Tensor) -> torch.Tensor:
    """x (checked `[m, dim]`) with unit column stride: a strided view (a column slice of a
    wider tensor, a transpose) is copied, as the CUDA decode GEMV reads rows contiguously;
    the values, and so the results, are the same."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _same_tensor(a, b: torch.Tensor | None) -> bool:
    """`a` is `b` or a view of the same memory with the same shape, dtype and device."""
    if b is None or not isinstance(a, torch.Tensor):
        return False
    return a is b or (
        a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
    )
