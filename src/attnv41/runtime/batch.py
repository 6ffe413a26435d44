"""Batched steps over many sequences: a pool of sequence slots with paged caches.

`SeqPool` (`runtime/pool.py`) holds every sequence's state: per layer a window ring per
slot, per ratio ≥ 2 kv source the compressor's group in progress per slot, and per kv
source a compressed-KV and an index-key pool of fixed-size blocks addressed through one
block table per ratio.

`BatchV41` runs one layer for all the tokens of a step: B sequences, each contributing
m_i ≥ 1 tokens at positions s_i … (a prefill from 0, a decode token, a continuation), all
in one `[T, dim]` input with the sequences' tokens contiguous and in order. `begin`
validates the step's metadata and allocates the blocks it needs, then `forward` runs
layers 0 … n_layers − 1 in order; after the last the slots' lengths advance.

Each token is computed as the single-sequence runtime computes it (`AttnV41.forward` of
its sequence alone with the same chunking): the same window layout (the released prefill
layout for a call from 0, the decode layout otherwise), the same selection, the same
rows; on the CPU the bytes are the same (tested). How:

- The projections, norms, RoPE and round trips run once over all T tokens (row-wise ops).
- A token's window rows are physical rows of the layer's ring tensor: positions before
  its sequence's call from the slot's ring, positions inside the call from the staging
  rows (the call's own kv), so a chunk never reads a ring slot it overwrote; the rings
  are written after the attention. A decode-only step (one token per sequence after
  position 0) writes each token's row straight into its ring row instead: the row it
  replaces (position p − W) is in no window of the step; no staging, no copy.
- Selections are physical rows of the pools (`row = table[slot, j // B]·B + j % B`, after
  the ring tensor's rows), so sparse attention reads the paged pools in place with the
  decode regime's kernel (`ops.sparse_attn_decode`).
- Index scores run for every token in one launch over the paged key pool
  (`ops.index_scores_paged`), then the fixed-width candidate mask and top-k (the decode
  step's exact kernels) over the step's widest visible count.
- The compressor pools every sequence's groups (its state plus its tokens) at once:
  index tensors built once per step on the host (`_compress_plan`), then a gather, one
  pooling launch and the fused row and key chains per kv source.

On CUDA the op table is `ops.TRITON_BATCH_OPS`: the projections (bf16, the compressor's
fp32, FP8 with their scales) on the tensor cores with one launch shape for every row count
(`kernels/tc_mm.py`), so a token's bits do not depend on the other tokens of the step (cuBLAS picks its algorithm by the row count); the other kernels are
batch-invariant as they are. `attnv41 check --batch` checks it on the golden files.

`rollback(slot, pos)` returns a slot to a position inside its last step when that step
was a continuation of 2..window tokens (a verify), as `AttnV41.rollback` does.

Continuation steps (every sequence 1..window tokens after position 0, not all of them
one: verify steps, decode tokens among them) run at fixed shapes from device metadata
(`_derive_cont`, `_compress_cont`: each token pools its group as it stands after the
step), with their undo data on the device (the ring rows they overwrite, the compressor
state before them and their own compressor rows); `rollback` restores from it. Eager
steps with a prompt (a call from 0) or a call longer than the window take the
host-planned path (`_compress_plan`, per-slot undo logs); `BatchGraphs`' second graph
kind runs every step that is not a decode step, those too, on the fixed-shape path. The
two paths give the same bytes (tested).

`kv_format="packed"` stores every cached row in V4.1's byte format (`attnv41.packed`:
window rows fp8_e8m0 528 B, compressed rows fp4_e4m3 288 B, index keys fp4_e8m0 68 B at
the Flash shapes; lossless, so every output and cache value is the bf16 form's, bit for
bit: tested on the CPU). The fused chains that make the rows write their packed bytes
(codes and the round trip's scales); the index-score and decode-attention kernels read
them in place, dequantizing as they load. Default "bf16".

Decode steps (one token per sequence) run as CUDA graphs through `BatchGraphs`
(runtime/batch_graphs.py): their metadata is derived on the device (`_derive_decode`).

`index_keys="released"` (attention-v41.md §9: the released code's Full layers score the
keys published last when a call completes none of their groups): which layer's keys a
sequence scores follows its own history, kept per slot (`keys_owner`, `_keys_plan`).
`BatchGraphs` uploads each token's owners with its metadata and scores every publishing
layer's keys with the others' rows masked (`_released_scores_dev`); `rollback` refuses it
(but for the no-op: each position at its slot's length).

Limits of this version: on CUDA a
prefill token runs the decode attention kernel and the batched projections (bits within
the golden tolerance of `AttnV41.forward`'s prefill, not equal).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..config import AttnV41Cfg
from ..kernels._triton import check_kernel_device
from ..reference import INDEX_KEY_MODES
from ..weights import AttnV41LayerWeights
from .attn import AttnV41, check_device
from .batch_parts import BatchParts
from .checks import not_an_int, released_owners
from .device import on_own_device
from .ops import TRITON_BATCH_OPS, Ops
from .pool import BatchStep, SeqPool, _failed_call, check_step_lists

__all__ = ["SeqPool", "BatchV41", "BatchStep"]


class BatchV41(BatchParts):
    """The runtime for batched steps over a `SeqPool` (module docstring)."""

    def __init__(
        self,
        cfg: AttnV41Cfg,
        device: torch.device | str = "cpu",
        n_slots: int = 8,
        block_rows: int = 64,
        blocks: dict[int, int] | None = None,
        ops=None,
        kv_format: str = "bf16",
        index_keys: str = "own",
    ):
        if index_keys not in INDEX_KEY_MODES:
            raise ValueError(f"index_keys = {index_keys!r}; allowed: {INDEX_KEY_MODES}")
        dev = check_device(device)
        if ops is None and dev.type == "cuda":
            ops = TRITON_BATCH_OPS  # batch-invariant projections
        triton_ops = ops == "triton" if isinstance(ops, str) else isinstance(ops, Ops) and ops.name.startswith("triton")
        if dev.type == "cuda" and triton_ops:  # before anything is allocated
            check_kernel_device(dev, "BatchV41", packed=kv_format == "packed")
        self.attn = AttnV41(cfg, device, index_keys="own", ops=ops)
        self.cfg, self.device, self.ops = cfg, self.attn.device, self.attn.ops
        self.pool = SeqPool(cfg, n_slots, self.attn.device, block_rows, blocks, kv_format)
        M = cfg.max_tokens
        self.sel_pub: dict[int, torch.Tensor] = {}  # per index source: logical top-k rows [T, index_topk]
        # Static wiring of what each ratio>0 layer reads (attention-v41.md §2, own index keys):
        # (the kv source whose rows it attends, the index keys it scores, the index source
        # whose selection it attends with), all the latest such layer of its ratio.
        self.wiring: dict[int, tuple[int, int | None, int]] = {}
        for i, role in enumerate(cfg.roles):
            r = role.ratio
            if r > 0:
                self.wiring[i] = (
                    _latest(cfg, i, lambda j, r=r: cfg.roles[j].is_kv_source and cfg.roles[j].ratio == r),
                    _latest(
                        cfg,
                        i,
                        lambda j, r=r: (
                            cfg.roles[j].is_kv_source and cfg.roles[j].is_index_source and cfg.roles[j].ratio == r
                        ),
                    )
                    if role.is_index_source
                    else None,
                    _latest(cfg, i, lambda j, r=r: cfg.roles[j].is_index_source and cfg.roles[j].ratio == r),
                )
        # the candidate source's mask [T, width] of this step, or its kept block ids [T, ≤ cand_blocks]
        # when the step was scored in tiles of tokens (`_select`); width: `_cand_width`
        self.cand_pub: torch.Tensor | None = None
        self.cand_ids: torch.Tensor | None = None  # its kept blocks ascending, for reindex layers (ops.compacts)
        self._cand_width = 0
        # index_keys="released" (attention-v41.md §9): per slot, the layer whose index keys
        # its sequence published last (None before any); `_keys_plan` follows it through a step
        self.index_keys = index_keys
        self.keys_owner: list[int | None] = [None] * n_slots
        # ... of which sequence (`SeqPool.seq_ids`): a slot's sequence given by `SeqPool.assume`
        # has no owner kept here (`_owner_at`)
        self.keys_seq: list[int | None] = [None] * n_slots
        # the index sources (rows of `BatchStep.owners_dev`) and the layers that publish keys
        self.index_sources = [i for i, r in enumerate(cfg.roles) if r.ratio > 0 and r.is_index_source]
        self.publishers = [i for i in self.index_sources if cfg.roles[i].is_kv_source]
        self.sel_buf = torch.empty(M, cfg.window + cfg.index_topk, dtype=torch.int32, device=self.device)
        self._step: BatchStep | None = None
        # Tracing (tests, `attnv41 check --batch`): with `trace_slot` set, every layer call
        # leaves `trace` = what that slot's sequence computed, in the single-sequence
        # runtime's encoding (`AttnV41Run`'s fields; see `_trace`).
        self.trace_slot: int | None = None
        self.trace: dict | None = None
        # rollback (`rollback`): per slot the undo log of its last step when that step was a
        # continuation of 2..window tokens; the step that last touched each slot
        self.undo: dict[int, dict] = {}
        self.last_step = [0] * n_slots
        self._steps = 0
        self._scores: dict = {}  # the traced slot's index scores of this layer
        self._cols = torch.arange(cfg.window, device=self.device)[None, :]
        self._rows = torch.arange(M, device=self.device)

    # ------------------------------------------------------------------ the step
    @on_own_device(lambda self: self.attn)
    def begin(self, slots, starts, lens, bucket: int | None = None) -> BatchStep:
        """Validate a step and allocate its blocks (all or nothing). slots: distinct pool
        slots; starts[i]: 0 (a new sequence in that slot) or the slot's length; lens[i] ≥ 1
        tokens; Σ lens ≤ max_tokens; starts[i] + lens[i] ≤ max_seq. bucket: None, or a
        context length ≥ every starts[i] + lens[i] (≤ max_seq): index sources then score
        `bucket // ratio` keys per token (masked past each token's visible ones; the same
        bits), so the step's shapes follow from (T, bucket) only: what a captured step
        needs."""
        self._check_begin(slots, starts, lens, bucket)
        plan = self._keys_plan(slots, starts, lens)  # released index keys (raises, nothing changed)
        return self._begin_checked(slots, starts, lens, bucket, plan)

    def cancel(self) -> None:
        """Drop the step `begin` returned last while none of its layers has run (an engine
        that gives up on a step before its first layer, e.g. when building its inputs
        failed): its slots may then be released, assumed or begun again. What `begin`
        already did stays done: a slot that began a new sequence (start 0) holds an empty
        one, every slot keeps the blocks it grew and its copies of blocks it shared with
        forked slots (`SeqPool.own_rows`), and the slots' undo logs from before the
        step are gone (rollback refuses them). No step, or a finished one: nothing to do.
        Refused once a layer ran (its rows are written; finish the step: the remaining
        layers)."""
        self._check_attn_live("cancel")
        st, n = self._step, self.cfg.n_layers
        if st is None or st.next_layer >= n:
            return
        if st.next_layer > 0:
            raise ValueError(
                f"cancel after layer {st.next_layer - 1} of the step ran; allowed: before its first layer "
                f"(run layers {st.next_layer}..{n - 1} to finish it)"
            )
        self.pool.in_step = frozenset()
        self._step = None

    def _begin_checked(self, slots, starts, lens, bucket, plan) -> BatchStep:
        """`begin` after its checks (`_check_begin`, `_keys_plan`'s plan): nothing here can fail."""
        # allocate and build the metadata
        self._allocate(slots, starts, lens)
        st = self._metadata(list(slots), list(starts), list(lens))
        st.bucket = bucket
        st.keys_plan = plan
        st.decode_only = all(s > 0 and m == 1 for s, m in zip(starts, lens))
        if st.decode_only:  # the own row in the ring, as a captured step lays it out
            self._derive_decode(st)
        elif self._is_cont(starts, lens):  # verify-sized calls: the fixed-shape path a captured step runs
            st.cont = True
            rows = torch.tensor(seq_rows(starts, lens, st.offsets), dtype=torch.int32)
            st.seq_start, st.seq_end, st.seq_off = rows.to(self.device).unbind(0)
            st.undo_ring, st.undo_state = self._undo_buffers(st.T)
            self._derive_cont(st)
        self._register(st)
        return st

    def _is_cont(self, starts, lens) -> bool:
        """Whether a step runs the fixed-shape continuation path: every sequence 1..window
        tokens at a position > 0, not all of them one token (that is a decode step)."""
        W = self.cfg.window
        return all(s > 0 and 1 <= m <= W for s, m in zip(starts, lens)) and any(m > 1 for m in lens)

    def _undo_buffers(self, T: int) -> tuple[dict, dict]:
        """A continuation step's undo buffers for T tokens (`BatchStep.undo_ring`, `undo_state`)."""
        pool = self.pool
        ring = {i: torch.empty(T, rg.shape[1], dtype=rg.dtype, device=self.device) for i, rg in enumerate(pool.ring)}
        state = {}
        for i, sa in pool.comp_a.items():
            r, D = sa.shape[1], sa.shape[2]
            f32 = dict(dtype=torch.float32, device=self.device)
            state[i] = tuple(torch.empty(T, r, D, **f32) for _ in range(2)) + tuple(
                torch.empty(T, D, **f32) for _ in range(2)
            )
        return ring, state

    def _check_begin(self, slots, starts, lens, bucket) -> None:
        """Everything `begin` refuses (it raises; nothing changes)."""
        c, pool = self.cfg, self.pool
        self._check_attn_live("begin")
        if self._step is not None and 0 < self._step.next_layer < c.n_layers:
            raise ValueError(
                f"begin during a step (layer {self._step.next_layer} runs next); allowed: after layer {c.n_layers - 1}"
            )
        check_step_lists(slots, starts, lens, at_least=1)
        for s in slots:
            pool._check_slot(s)
        for slot, s, m in zip(slots, starts, lens):
            if m < 1:
                raise ValueError(f"slot {slot}: lens = {m}; allowed: >= 1")
            if s != 0 and slot in pool.failed:
                raise ValueError(
                    f"slot {slot}: start = {s}, but {_failed_call(pool.failed[slot])} raised part-way and its caches "
                    f"hold part of it; allowed: start 0 (a new sequence), or pool.release / pool.assume first"
                )
            if s != 0 and pool.length[slot] == 0:
                raise ValueError(
                    f"slot {slot}: start = {s}, but the slot holds no sequence; allowed: 0 (a new sequence)"
                )
            if s != 0 and s != pool.length[slot]:
                raise ValueError(
                    f"slot {slot}: start = {s}; allowed: 0 (a new sequence) or {pool.length[slot]} (its next position)"
                )
            if s + m > c.max_seq:
                raise ValueError(f"slot {slot}: positions {s}..{s + m - 1}; allowed: 0..{c.max_seq - 1} (max_seq)")
        T = sum(lens)
        if T > c.max_tokens:
            raise ValueError(f"{T} tokens in the step; allowed: 1..{c.max_tokens} (max_tokens)")
        if bucket is not None:
            top = max(s + m for s, m in zip(starts, lens))
            if isinstance(bucket, bool) or not isinstance(bucket, int) or not top <= bucket <= c.max_seq:
                raise ValueError(
                    f"bucket = {bucket!r}; allowed: {top}..{c.max_seq} (the step's last position + 1 .. max_seq)"
                )
        for r, (need, free) in pool.blocks_needed(slots, starts, lens).items():
            if need > free:
                raise ValueError(
                    f"the step needs {need} more blocks of ratio {r}; allowed: at most the {free} free (it counts "
                    f"the blocks the step grows into and copies of blocks shared with forked slots that it writes "
                    f"into; release finished slots, or build the pool with more blocks)"
                )

    def _owner_at(self, slot: int, start: int) -> int | None:
        """With index_keys="released": the layer whose index keys the slot's sequence
        published last before position `start`. None at 0; for a sequence this runtime ran,
        the owner its last step left (`keys_owner`); for one given by `SeqPool.assume`
        (no history), the owner one call of its `start` tokens would leave: the last index
        source that is also a kv source and has a complete group by then."""
        if start == 0:
            return None
        if self.keys_seq[slot] == self.pool.seq_ids[slot]:
            return self.keys_owner[slot]
        done = [i for i in self.publishers if start // self.cfg.roles[i].ratio > 0]
        return done[-1] if done else None

    def _keys_plan(self, slots, starts, lens) -> tuple[dict[int, list], list] | None:
        """With index_keys="released": for each index source, per sequence of the step, the
        layer whose index keys it scores, as the released code decides for one sequence
        (`released_owners`, the single-sequence runtime's walk, from each slot's owner
        before the step, `_owner_at`). Returns (plan, the owners after the step), None in
        "own" mode. Refuses (nothing changes; the message names the slot) a layer that
        would score more keys than the last publisher holds: the released code reads
        unwritten rows there, which a paged pool does not have."""
        if self.index_keys == "own":
            return None
        walks = []
        for sl, s, m in zip(slots, starts, lens):
            try:
                walks.append(released_owners(self.cfg, self._owner_at(sl, s), s, m))
            except ValueError as e:
                raise ValueError(f"slot {sl}: {e}") from None
        plan = {i: [w[0][i] for w in walks] for i in walks[0][0]}
        return plan, [w[1] for w in walks]

    def _allocate(self, slots, starts, lens) -> None:
        """A checked step's blocks: a step begun before and not run (no layer) is dropped
        (it wrote nothing but its slots' blocks and bookkeeping); every new sequence returns
        its slot's old blocks, then the slots grow, so the blocks `_check_begin` counted as
        freed are free whatever the slots' order."""
        pool = self.pool
        if self._step is not None and self._step.next_layer == 0:
            pool.in_step = frozenset()
            self._step = None
        for slot, s in zip(slots, starts):
            if s == 0:
                pool.release(slot)
        for slot, s, m in zip(slots, starts, lens):
            if s > 0:  # blocks shared with forked slots that the step writes into: copies of its own
                pool.own_rows(slot, s, s + m)
            pool._grow(slot, s + m)

    def _check_attn_live(self, what: str) -> None:
        if self.attn._freed:
            raise RuntimeError(
                f"BatchV41.{what} after its runtime was freed (attn.free()); allowed: before that (build a new BatchV41)"
            )

    def _register(self, st: BatchStep) -> None:
        """The step becomes the current one: its id, the slots' last step, undo logs for
        its continuations of 2..window tokens (the others' logs dropped; a released or
        assumed sequence's log kept as its sequence id only, which `rollback` names)."""
        W = self.cfg.window
        for sl, u in list(self.undo.items()):  # logs of sequences released, assumed or forked into since: their
            if len(u) > 1 and u["seq"] != self.pool.seq_ids[sl]:  # copies go, rollback's refusal stays
                self.undo[sl] = {"seq": u["seq"]}
        self._step = st
        self.pool.in_step = frozenset(st.slots)
        st.next_layer = 0
        self._steps += 1
        st.id = self._steps
        st.logged = tuple(sl for sl, s, m in zip(st.slots, st.starts, st.lens) if s > 0 and 2 <= m <= W)
        for sl, s, m, o in zip(st.slots, st.starts, st.lens, st.offsets):
            self.last_step[sl] = st.id
            if sl in st.logged:
                u = {
                    "span": (s, s + m),
                    "step": st.id,
                    "seq": self.pool.seq_ids[sl],  # its sequence (`SeqPool.seq_ids`): the log dies with it
                    "done": False,
                    "ring": {},
                    "a": {},
                }
                if st.cont:  # the step's device undo buffers, valid while st.id is this step's
                    u["cont"] = (st, o)
                self.undo[sl] = u
            else:
                self.undo.pop(sl, None)

    def _finish(self, st: BatchStep) -> None:
        """After the step's last layer: the slots' lengths advance, its undo logs complete."""
        self.pool.in_step = frozenset()
        for slot, s, m in zip(st.slots, st.starts, st.lens):
            self.pool.length[slot] = s + m
        if st.keys_plan is not None:
            for slot, j in zip(st.slots, st.keys_plan[1]):
                self.keys_owner[slot] = j
                self.keys_seq[slot] = self.pool.seq_ids[slot]
        for sl in st.logged:
            self.undo[sl]["done"] = True

    def _abandon(self, st: BatchStep, layer: int | str) -> None:
        """A step whose layer raised (an out-of-memory error, an interrupt: every input
        was checked before `begin`): the runtime is free again (`begin`, `rollback`,
        `release` work) and the step's slots are marked `pool.failed`: their lengths stay,
        but layers before the failing one (and it, in part) wrote the step's rows, so
        such a slot takes only a new sequence (start 0) until it is released or assumed;
        its undo log is dropped (no rollback into a half-run step). The other slots are
        untouched."""
        self.pool.in_step = frozenset()
        self._step = None
        for sl in st.slots:
            self.pool.failed[sl] = (st.id, layer)
            self.undo.pop(sl, None)

    def _derive_decode(self, st: BatchStep) -> None:
        """A decode-only step's window selection and ring rows from its device `pos` and
        `tok_slot` (in place; capturable; eager decode-only steps too): decode layout,
        position p − W + 1 + c at its ring row, −1 before position 0. The last column is the
        token's own row, which the kv chain writes straight into the ring (`_layer`): the
        row it replaces holds position p − W, in no window of the step."""
        W = self.cfg.window
        p, sl = st.pos.long(), st.tok_slot.long()
        q = p[:, None] - (W - 1) + self._cols
        st.win_sel.copy_(torch.where(q < 0, -1, sl[:, None] * W + q.remainder(W)))
        st.ring_dst.copy_(sl * W + p.remainder(W))

    def _derive_cont(self, st: BatchStep) -> None:
        """A fixed-shape step's window selection and ring writes from its device metadata
        (in place; capturable), as `_metadata` builds them on the host: a call from 0 (a
        prompt) takes the released prefill layout (positions max(0, p − W + 1) + c, width
        min(m, W)), any other the decode layout (p − W + 1 + c, width W); positions of the
        call from the staging rows, earlier ones from the ring. After the attention the
        last min(m, W) tokens of each call go into their ring rows; an earlier token's
        "write" copies its staging row onto itself (a fixed shape, no effect)."""
        W = self.cfg.window
        T = st.T
        p, sl = st.pos.long(), st.tok_slot.long()
        s, e, off = st.seq_start.long(), st.seq_end.long(), st.seq_off.long()
        prefill = (s == 0)[:, None]
        first = p[:, None] - (W - 1)
        q = torch.where(prefill, first.clamp_min(0), first) + self._cols
        width = torch.where(s == 0, (e - s).clamp_max(W), W)
        present = (q >= 0) & (q <= p[:, None]) & (self._cols < width[:, None])
        ring_row = sl[:, None] * W + q.remainder(W)
        stage_row = self.pool.ring_rows + off[:, None] + (q - s[:, None])
        sel = torch.where(q >= s[:, None], stage_row, ring_row)
        st.win_sel.copy_(torch.where(present, sel, -1))
        st.win_width.copy_(width)
        rows = self._rows[:T]
        st.ring_dst.copy_(torch.where(p >= e - W, sl * W + p.remainder(W), self.pool.ring_rows + rows))
        st.ring_src.copy_(rows)

    def _metadata(self, slots, starts, lens) -> BatchStep:
        c, pool, dev = self.cfg, self.pool, self.device
        W = c.window
        offsets, t0 = [], 0
        for m in lens:
            offsets.append(t0)
            t0 += m
        T = t0
        pos = torch.cat([torch.arange(s, s + m, dtype=torch.int32) for s, m in zip(starts, lens)])
        tok_slot = torch.cat([torch.full((m,), sl, dtype=torch.int32) for sl, m in zip(slots, lens)])
        start = torch.cat([torch.full((m,), s, dtype=torch.int64) for s, m in zip(starts, lens)])
        off = torch.cat([torch.full((m,), o, dtype=torch.int64) for o, m in zip(offsets, lens)])
        mm = torch.cat([torch.full((m,), m, dtype=torch.int64) for m in lens])
        p = pos.long()[:, None]
        col = torch.arange(W, dtype=torch.int64)[None, :]
        prefill = (start == 0)[:, None]
        # released prefill layout: positions max(0, p−W+1) + c, −1 past p, width min(m, W);
        # decode layout: position p−W+1+c, −1 where negative, width W
        q = torch.where(prefill, (p - W + 1).clamp_min(0) + col, p - W + 1 + col)
        width = torch.where(prefill[:, 0], mm.clamp_max(W), torch.full_like(mm, W))
        present = (q >= 0) & (q <= p) & (col < width[:, None])
        in_call = q >= start[:, None]
        ring_row = tok_slot.long()[:, None] * W + q.remainder(W)
        stage_row = pool.ring_rows + off[:, None] + (q - start[:, None])
        win = torch.where(present, torch.where(in_call, stage_row, ring_row), -1).to(torch.int32)
        # ring writes after attention: the last min(m, W) tokens of each sequence
        keep = pos.long() >= (start + mm - W)
        idx = torch.arange(T)[keep]
        ring_dst = tok_slot.long()[keep] * W + pos.long()[keep].remainder(W)
        return BatchStep(
            slots,
            starts,
            lens,
            offsets,
            T,
            pos.to(dev),
            tok_slot.to(dev),
            win.to(dev),
            width.to(dev),
            ring_dst.to(dev),
            idx.to(dev),
        )

    @on_own_device(lambda self: self.attn)
    @torch.no_grad()
    def forward(
        self, w: AttnV41LayerWeights, x: torch.Tensor, step: BatchStep, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Layer `w.role.layer` (the step's next) for the step's T tokens (bf16 `[T, dim]`,
        sequences contiguous in `step` order). Returns `[T, dim]` bf16: `out` when given (a
        contiguous bf16 `[T, dim]` tensor of the caller's on the runtime's device, not
        sharing x's memory; the same bytes as without it), else a view valid until the next
        call. Runs without autograd (an inference runtime): an x or weights that require
        grad are read as plain tensors, the output has no history."""
        c, attn = self.cfg, self.attn
        attn._check_role(w)
        i = w.role.layer
        if not isinstance(step, BatchStep) or step is not self._step or step.next_layer != i:
            if self._step is None:
                want = "none (call begin)"
            elif self._step.next_layer >= c.n_layers:
                want = f"none (the last begin's step is complete: all {c.n_layers} layers ran; begin a new step)"
            else:
                want = f"layer {self._step.next_layer} of the last begin"
            got = f"a {type(step).__name__}" if not isinstance(step, BatchStep) else "a step"
            raise ValueError(f"layer {i} of {got}; allowed: {want}")
        m_x = attn._check_x(x)
        if m_x != step.T:
            raise ValueError(f"x has {m_x} rows; allowed: the step's {step.T} tokens")
        attn._check_weights(w)
        if out is not None:
            self._check_out(out, x, step.T)
        try:
            out = self._layer(w, x, step, out=out)
        except BaseException:
            self._abandon(step, i)
            raise
        if step.next_layer == c.n_layers:
            self._finish(step)
        return out

    def _check_out(self, out, x: torch.Tensor, T: int) -> None:
        """`forward`'s out: a contiguous bf16 `[T, dim]` tensor on the runtime's device,
        apart from x (ValueError naming the field)."""
        want = f"a contiguous bf16 [{T}, {self.cfg.dim}] tensor on {self.device}"
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"out is a {type(out).__name__}; allowed: None or {want}")
        got = f"{out.dtype} {list(out.shape)} on {out.device}" + ("" if out.is_contiguous() else ", not contiguous")
        if (
            out.dtype != torch.bfloat16
            or tuple(out.shape) != (T, self.cfg.dim)
            or out.device != self.device
            or not out.is_contiguous()
        ):
            raise ValueError(f"out is {got}; allowed: {want}")
        if out.numel() and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            raise ValueError(
                "out shares x's memory; allowed: a buffer of its own (x is read until the output is written)"
            )

    def _layer(self, w: AttnV41LayerWeights, x: torch.Tensor, step: BatchStep, out: torch.Tensor | None = None):
        """`forward`'s device work for checked arguments (capturable for a decode-only step
        with a bucket and no trace); `out`: where the output goes (default a buffer)."""
        c, ops, pool, attn = self.cfg, self.ops, self.pool, self.attn
        role = w.role
        i, r = role.layer, role.ratio
        T, W = step.T, c.window
        pos = step.pos
        cos, sin = attn._tables(r)
        ring = pool.ring[i]
        # captured decode-only steps under `decode.SIDE_STREAM`: the compressor and the window
        # row's chain on the second stream (joined in `_qkv`)
        side = attn._side_stream() if step.decode_only else None
        early = side is not None and role.is_kv_source and r >= 2
        if early:
            attn._beside(side, self._compress_decode, w, x, step)
        if step.decode_only:  # one token per sequence: its row straight into its ring row (`_derive_decode`)
            cq, q, kv, hw_done = attn._qkv(w, x, pos, cos, sin, T, ring, ring_slot=step.ring_dst, side=side)
        else:  # the step's window rows into the staging rows, copied into the ring after attention
            stage = ring[pool.ring_rows : pool.ring_rows + T]  # (packed there when the pool is)
            cq, q, kv, hw_done = attn._qkv(w, x, pos, cos, sin, T, stage, ring_slot=self._rows[:T])
        sel = step.win_sel  # a window-only layer attends its window rows
        comp = attn._empty_rows
        if r > 0:
            src, keys_layer, isrc = self.wiring[i]
            if role.is_kv_source and not early:  # (early: on the second stream above)
                if step.decode_only and r >= 2:
                    self._compress_decode(w, x, step)
                elif step.cont and r >= 2:
                    self._compress_cont(w, x, step)
                else:
                    self._compress(w, x, step)
            if role.is_index_source:
                self._select(w, cq, x, step, keys_layer, cos, sin, hw_done)
            # window rows, then from the token's window width its compressed rows' physical
            # pool rows (after the ring tensor's), −1 past them: one launch
            sel = ops.paged_selection(
                step.win_sel,
                step.win_width,
                self.sel_pub[isrc],
                pool.tables[r],
                step.tok_slot,
                pool.block_rows,
                ring.shape[0],
                self.sel_buf[:T],
            )
            comp = pool.compress_kv[src]
        width = attn._width(r)
        rot = (cos, sin, pos, attn.o_rot[:T])
        # packed pools: the kernel dequantizes the rows as it loads them (the same values)
        o = ops.sparse_attn_decode(
            q, ring, comp, sel[:, :width], ring.shape[0], w["attn_sink"], c.head_dim**-0.5, out=attn.o[:T], rot=rot
        )
        out = attn._output(w, o, pos, cos, sin, T, out=out, rotated=True)
        traced = self.trace_slot is not None and self.trace_slot in step.slots
        if traced:
            self._trace(w, step, q, kv, o, out, sel)
        if step.cont:  # the ring rows this step overwrites (`rollback`)
            torch.index_select(ring, 0, step.ring_dst, out=step.undo_ring[i])
        else:
            for sl in step.logged:  # the slot's ring before this step writes it
                self.undo[sl]["ring"][i] = ring[sl * W : (sl + 1) * W].clone()
        if not step.decode_only:
            ring.index_copy_(0, step.ring_dst, stage.index_select(0, step.ring_src))
        if (
            traced
            and step.starts[step.slots.index(self.trace_slot)] > 0
            and step.lens[step.slots.index(self.trace_slot)] == 1
        ):
            sl = self.trace_slot  # decode: the ring
            self.trace["kv_win"] = pool.window_rows(i, torch.arange(sl * W, (sl + 1) * W, device=self.device))
        step.next_layer += 1
        return out

    @on_own_device(lambda self: self.attn)
    def fork(self, src: int, dsts) -> None:
        """Continue slot `src`'s sequence in each slot of `dsts` too (parallel sampling,
        beam search, a prompt prefilled once for many requests): each dst drops what it
        held (as `pool.release`) and takes a copy of src's state: its window rings and
        compressor groups in progress are copied, its compressed-KV and index-key blocks
        shared (copy on write: a later step copies a shared block before it writes into
        it, `SeqPool.own_rows`; a fork takes no free block). From then on each slot is a
        sequence of its own: a step on any of them gives the bytes that slot would get had
        its sequence been run there from the start (and changes none of the others'); with
        released index keys each keeps src's owner. A dst cannot roll back into src's
        last step (its undo log stays with src). Not for a slot of a step begun and not
        finished (as `pool.release`); slots outside it may fork meanwhile (the step's own
        blocks were made its own by `begin`). All or nothing: a refused call raises and
        changes nothing. dsts: an int or a list of distinct slots, none of them src."""
        pool = self.pool
        self._check_attn_live("fork")
        pool._check_slot(src)
        if isinstance(dsts, int) and not isinstance(dsts, bool):
            dsts = [dsts]
        if not isinstance(dsts, (list, tuple)):
            raise TypeError(f"dsts is a {type(dsts).__name__}; allowed: a slot (int) or a list of slots")
        for d in dsts:
            pool._check_slot(d)
        if len(set(dsts)) != len(dsts):
            dup = sorted({d for d in dsts if list(dsts).count(d) > 1})
            raise ValueError(f"dsts {dup} appear twice; allowed: each slot at most once")
        if src in dsts:
            raise ValueError(f"dsts {list(dsts)} hold src = {src}; allowed: slots other than src")
        for sl in (src, *dsts):
            pool._check_idle(sl, "fork")
        if src in pool.failed:
            raise ValueError(
                f"fork of slot {src}: {_failed_call(pool.failed[src])} raised part-way and its caches hold part of "
                f"it; allowed: a slot whose last call finished"
            )
        if pool.length[src] == 0:
            raise ValueError(f"fork of slot {src}, which holds no sequence; allowed: a slot holding one (length >= 1)")
        # nothing below can fail but the device copies themselves
        known = self.keys_seq[src] == pool.seq_ids[src]  # released index keys: src's owner kept (`_owner_at`)
        owner = self.keys_owner[src] if known else None
        for d in dsts:
            pool.release(d)
            try:
                pool._share(src, d)
            except BaseException:  # a copy raised (out of memory, an interrupt): d holds part of src's state
                pool.failed[d] = (self.last_step[src], "fork")
                raise
            self.keys_owner[d] = owner
            self.keys_seq[d] = pool.seq_ids[d] if known else None
            self.undo[d] = {"seq": 0}  # no undo log: rollback names why (sequence ids start at 1)

    @on_own_device(lambda self: self.attn)
    def rollback(self, slot: int, pos: int) -> None:
        """Return a slot's sequence to position `pos` (its next step starts there), as
        `AttnV41.rollback` does for one sequence: allowed when the slot's last step was a
        continuation of 2..window tokens at s > 0 (draft tokens verified), for s ≤ pos ≤
        its length, again after a rollback; not during a step. Restores the slot's ring
        slots of positions ≥ pos and its compressor's group in progress; blocks stay
        allocated (rows past the new count are unread). Refused calls change nothing.
        `rollback_many` does it for many slots at once."""
        self.rollback_many([slot], [pos])

    @on_own_device(lambda self: self.attn)
    def rollback_many(self, slots, positions) -> None:
        """`rollback(slot, pos)` for every pair, all or nothing (each pair is checked
        before anything changes), with a few launches per layer for all the slots whose
        last step was a continuation step (`BatchStep.cont`: the undo buffers on the
        device), instead of a few per slot and layer: what an engine runs after verifying
        a batch's drafts."""
        c, pool = self.cfg, self.pool
        self._check_attn_live("rollback")
        for name, v in (("slots", slots), ("positions", positions)):
            if not isinstance(v, (list, tuple)):
                raise TypeError(f"{name} is a {type(v).__name__}; allowed: a list of ints")
        if len(slots) != len(positions):
            raise ValueError(f"{len(slots)} slots, {len(positions)} positions; allowed: the same count")
        for slot, pos in zip(slots, positions):
            pool._check_slot(slot)
            if isinstance(pos, bool) or not isinstance(pos, int):
                raise not_an_int("pos", pos)
        if len(set(slots)) != len(slots):
            dup = sorted({s for s in slots if list(slots).count(s) > 1})
            raise ValueError(f"slots {dup} appear twice; allowed: each slot at most once")
        if self._step is not None and 0 < self._step.next_layer < c.n_layers:
            raise ValueError(
                f"rollback during a step (layer {self._step.next_layer} runs next); allowed: between steps"
            )
        moved = [(slot, pos) for slot, pos in zip(slots, positions) if pos != pool.length[slot]]
        if self.index_keys != "own" and moved:  # which keys were published last would have to be undone too
            slot, pos = moved[0]
            raise ValueError(
                f"slot {slot}: rollback to {pos} with index_keys = {self.index_keys!r}; allowed: 'own', or "
                f"pos = {pool.length[slot]} (no change)"
            )
        todo = []
        for slot, pos in zip(slots, positions):
            end = pool.length[slot]
            if pos == end:
                continue
            if slot in pool.failed:
                raise ValueError(
                    f"slot {slot}: rollback to {pos}: {_failed_call(pool.failed[slot])} raised part-way; allowed: "
                    f"none (start a new sequence, or pool.release / pool.assume the slot)"
                )
            u = self.undo.get(slot)
            if u is not None and u["seq"] != pool.seq_ids[slot]:
                raise ValueError(
                    f"slot {slot}: rollback to {pos}: the slot was released, assumed or forked into after its last step, "
                    f"whose undo log went with that sequence; allowed: pos = {end} (no change)"
                )
            if u is None or not u["done"] or u["step"] != self.last_step[slot]:
                raise ValueError(
                    f"slot {slot}: rollback to {pos}: its last step kept no undo log; allowed: pos = {end} (no "
                    f"change), or a position inside its last step when that was a continuation of 2..{c.window} tokens"
                )
            s = u["span"][0]
            if not s <= pos <= end:
                raise ValueError(f"slot {slot}: pos = {pos}; allowed: {s}..{end} (inside its last continuation)")
            if "cont" in u and u["cont"][0].id != u["step"]:
                raise ValueError(
                    f"slot {slot}: rollback to {pos}: a later captured step of the same size reused its undo buffers "
                    f"(step {u['cont'][0].id}, this slot's {u['step']}); allowed: pos = {end}, or roll back before "
                    f"the next continuation step of {u['cont'][0].T} tokens"
                )
            todo.append((slot, pos, end, s, u))
        # nothing below can fail but the device work itself (out of memory, an interrupt):
        # then the slots' caches are restored in part, so they take only a new sequence
        try:
            by_step: dict[int, list] = {}
            for slot, pos, end, s, u in todo:
                if "cont" in u:
                    by_step.setdefault(id(u["cont"][0]), []).append((slot, pos, end, s, *u["cont"]))
                else:
                    self._rollback_logged(slot, pos, end, u)
            for group in by_step.values():
                self._rollback_cont(group)
        except BaseException:
            for slot, *_ in todo:
                pool.failed[slot] = (self.last_step[slot], "rollback")
                self.undo.pop(slot, None)
            raise
        for slot, pos, _end, _s, _u in todo:
            pool.length[slot] = pos

    def _rollback_logged(self, slot: int, pos: int, end: int, u: dict) -> None:
        """One slot's rollback from its per-slot undo log (a host-planned step)."""
        c, pool = self.cfg, self.pool
        W = c.window
        rows = slot * W + torch.remainder(torch.arange(pos, end, device=self.device), W)
        for i, ring in enumerate(pool.ring):
            ring.index_copy_(0, rows, u["ring"][i].index_select(0, rows - slot * W))
        for i, (a0, a, g) in u["a"].items():
            r = c.roles[i].ratio
            g0 = (pos // r) * r
            h = pos - g0
            pool.comp_a[i][slot, :h].copy_(a[g0 - a0 : pos - a0])
            pool.comp_g[i][slot, :h].copy_(g[g0 - a0 : pos - a0])
            pool.comp_g[i][slot, h:].fill_(float("-inf"))

    def _rollback_cont(self, group: list) -> None:
        """Rollbacks of slots whose last step was the continuation step `st` (each entry
        (slot, pos, end, s, st, o): the slot's tokens from step row o), from its device
        undo buffers, one gather-and-write per layer for them all: the ring rows of
        positions pos..end−1 get back what the step overwrote; the compressor's group in
        progress at pos is rebuilt from the state before the step (positions before s)
        and the step's own rows, the gate scores past it −∞."""
        c, pool = self.cfg, self.pool
        W = c.window
        st = group[0][4]
        dst, src = [], []
        for slot, pos, end, s, _st, o in group:
            dst += [slot * W + q % W for q in range(pos, end)]
            src += [o + q - s for q in range(pos, end)]

        def t(v):
            return torch.tensor(v, dtype=torch.int64, device=self.device)

        dst_t, src_t = t(dst), t(src)
        for i, ring in enumerate(pool.ring):
            ring.index_copy_(0, dst_t, st.undo_ring[i].index_select(0, src_t))
        for i, (pa, pg, sa, sg) in st.undo_state.items():
            r, D = c.roles[i].ratio, c.head_dim
            before, before_src, own, own_src, dead = [], [], [], [], []
            for slot, pos, _end, s, _st, o in group:
                g0 = (pos // r) * r
                for j in range(r):
                    q = g0 + j
                    if q >= pos:
                        dead.append(slot * r + j)
                    elif q >= s:
                        own.append(slot * r + j)
                        own_src.append(o + q - s)
                    else:
                        before.append(slot * r + j)
                        before_src.append(o * r + j)
            av, gv = pool.comp_a[i].view(-1, D), pool.comp_g[i].view(-1, D)
            if before:
                b, bs = t(before), t(before_src)
                av.index_copy_(0, b, pa.view(-1, D).index_select(0, bs))
                gv.index_copy_(0, b, pg.view(-1, D).index_select(0, bs))
            if own:
                b, bs = t(own), t(own_src)
                av.index_copy_(0, b, sa.index_select(0, bs))
                gv.index_copy_(0, b, sg.index_select(0, bs))
            if dead:
                gv.index_fill_(0, t(dead), float("-inf"))

    def _trace(self, w, step: BatchStep, q, kv, o, out, sel) -> None:
        """The traced slot's layer call in `AttnV41.forward`'s encoding: window rows (a
        prefill: its own rows; a continuation: the ring's earlier rows, then its own; a
        decode token: the ring after its write, filled in by the caller) and the
        selection as indices into them (compressed rows at `offset`), the top-k width
        k = min(index_topk, L); q, o, out; on kv sources the cache rows [:L], on index
        sources the scores and the key owner, on the candidate source the mask."""
        c, pool = self.cfg, self.pool
        i, r, W = w.role.layer, w.role.ratio, c.window
        b = step.slots.index(self.trace_slot)
        slot, s, m, o0 = step.slots[b], step.starts[b], step.lens[b], step.offsets[b]
        rows = slice(o0, o0 + m)
        p = torch.arange(s, s + m)[:, None]
        col = torch.arange(W)[None, :]
        if s == 0:
            wc, qpos = min(m, W), (p - W + 1).clamp_min(0) + col
            win_rows, enc = kv[rows].clone(), qpos
        else:
            wc, qpos = W, p - W + 1 + col
            base = max(0, s - W + 1)
            prev = torch.arange(base, s, device=self.device)
            before = pool.window_rows(i, slot * W + prev.remainder(W))
            win_rows = torch.cat([before, kv[rows]])
            enc = qpos.remainder(W) if m == 1 else qpos - base
        present = step.win_sel[rows].cpu() >= 0
        win = torch.where(present, enc, -1)[:, :wc].to(torch.int32)
        t = {"q": q[rows].clone(), "o": o[rows].clone(), "out": out[rows].clone(), "kv_win": win_rows}
        L = (s + m) // r if r else 0
        k = min(c.index_topk, L)
        offset = W if (s > 0 and m == 1) else win_rows.shape[0]
        comp = torch.empty(m, 0, dtype=torch.int32)
        if r > 0 and k > 0:
            logical = self.sel_pub[self.wiring[i][2]][rows, :k].cpu()
            comp = torch.where(logical >= 0, logical + offset, -1).to(torch.int32)
        t["sel"] = torch.cat([win, comp], dim=1)
        if w.role.is_kv_source:
            t["compress_kv"] = pool.cache_rows(i, slot, L)
            t["index_k"] = pool.cache_rows(i, slot, L, keys=True)
        if w.role.is_index_source and L > 0:
            t["index_score"] = self._scores.pop(i)
            plan = step.keys_plan
            t["index_k_owner"] = self.wiring[i][1] if plan is None else plan[0][i][b]
        if w.role.is_candidate_source and L > 0:
            t["candidates"] = self._candidates(o0, o0 + m, self._cand_width)[:, :L].clone()
        self.trace = t

    @on_own_device(lambda self: self.attn)
    @torch.no_grad()
    def step(self, weights, xs, slots, starts, lens, keep: bool = True, bucket: int | None = None) -> list:
        """`begin` and every layer in order; `xs[i]` is layer i's input. Returns each
        layer's output (cloned with `keep`). The step's metadata (`begin`'s checks), then
        every layer's weights and input are checked before `begin`: a refused step changes
        nothing (no slot released, no undo log dropped, no layer run). Runs without
        autograd (`forward`): inputs and weights that require grad are read as plain
        tensors, the outputs have no history."""
        self._check_begin(slots, starts, lens, bucket)
        plan = self._keys_plan(slots, starts, lens)
        self.check_layers(weights, xs, sum(lens))
        st = self._begin_checked(slots, starts, lens, bucket, plan)
        return [
            (lambda y: y.clone() if keep else y)(self.forward(weights[i], xs[i], st)) for i in range(self.cfg.n_layers)
        ]

    def check_layers(self, weights, xs, T: int | None) -> None:
        """What `step` checks before `begin`: n_layers weights (`AttnV41LayerWeights` of
        layers 0..n−1, built for this runtime's device) and n_layers inputs of T rows each
        (`forward`'s rules for x; T None: the rows are left to `begin`'s checks of lens)."""
        n, attn = self.cfg.n_layers, self.attn
        for name, v in (("weights", weights), ("xs", xs)):
            if isinstance(v, torch.Tensor) or not isinstance(v, Sequence) or len(v) != n:
                got = f"a {type(v).__name__}" + (f" of {len(v)}" if isinstance(v, Sequence) else "")
                raise ValueError(f"{name} is {got}; allowed: a sequence of n_layers = {n} (one per layer)")
        for i, (w, x) in enumerate(zip(weights, xs)):
            try:
                attn._check_role(w)
                if w.role.layer != i:
                    raise ValueError(f"weights of layer {w.role.layer}; allowed: layer {i}'s")
                attn._check_weights(w)
                m = attn._check_x(x)
            except (TypeError, ValueError) as e:
                raise type(e)(f"layer {i}: {e}") from None
            if T is not None and m != T:
                raise ValueError(f"xs[{i}] has {m} rows; allowed: the step's {T} tokens (sum of lens)")


def seq_rows(starts, lens, offsets) -> list[list[int]]:
    """A fixed-shape step's per-token sequence metadata (`BatchStep.seq_start`, `seq_end`,
    `seq_off`) as three host rows: each token's sequence's first position, end (first
    position after the call) and first row in the step."""
    rows: list[list[int]] = [[], [], []]
    for s, m, o in zip(starts, lens, offsets):
        for row, v in zip(rows, (s, s + m, o)):
            row += [v] * m
    return rows


def _latest(cfg: AttnV41Cfg, i: int, pred) -> int:
    """The latest layer j ≤ i with pred(j) (the static wiring of published state)."""
    for j in range(i, -1, -1):
        if pred(j):
            return j
    raise ValueError(f"layer {i}: no earlier layer publishes what it reads")
