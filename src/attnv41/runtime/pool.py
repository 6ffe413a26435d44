"""`SeqPool`: every sequence's state for batched steps (`runtime/batch.py`), in slots.

Per layer a window ring per slot (one flat `[(slots + 1)·window + max_tokens, head_dim]`
tensor (the extra slot: the pad slot) whose last `max_tokens` rows stage the step's own
window rows), per ratio ≥ 2 kv source the compressor's group in progress per slot, and
per kv source a compressed-KV and an index-key pool of fixed-size blocks (`block_rows`
rows each) addressed through one block table per ratio (`tables[r]`, int32
`[slots, max_blocks]`, −1 where unallocated). Blocks are handed out from a free list as
sequences grow and returned when a slot is released or restarted. A block may be
shared by several slots' tables (`BatchV41.fork`: a sequence continued in several
slots, the prefix's blocks shared, not copied): `refs[r][block]` counts the slots holding
it, a block returns to the free list when the last one lets it go, and a step copies a
shared block into a block of its own before it writes a row there (copy on write,
`own_rows`; a step writes only rows of its own positions, so the rows every sharer reads
are the same bytes). `BatchStep`: one validated step's sequences and device metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import AttnV41Cfg
from ..packed import row_bytes, unpack
from ..state import check_kv_format
from .attn import check_device
from .checks import not_an_int

__all__ = ["SeqPool", "BatchStep"]


def _failed_call(rec: tuple[int, int | str]) -> str:
    """A `SeqPool.failed` record (step id, layer, "replay" or "rollback") in words."""
    sid, where = rec
    if where == "rollback":
        return f"the rollback after its step {sid}"
    if where == "fork":
        return "the fork into it"
    if where == "replay":
        return f"its step {sid} (a CUDA graph replay: the layer is not known)"
    return f"its step {sid} (in layer {where})"


def check_step_lists(slots, starts, lens, at_least: int) -> None:
    """The form of a step's three lists (`SeqPool.blocks_needed`, `BatchV41.begin`): lists
    of ints, one entry per sequence (at least `at_least`), each slot at most once. Raises
    TypeError / ValueError naming the value."""
    for name, v in (("slots", slots), ("starts", starts), ("lens", lens)):
        if not isinstance(v, (list, tuple)) or not all(isinstance(e, int) and not isinstance(e, bool) for e in v):
            raise TypeError(f"{name} = {v!r}; allowed: a list of ints")
    if not len(slots) == len(starts) == len(lens) or len(slots) < at_least:
        more = f", at least {at_least}" if at_least else ""
        raise ValueError(f"{len(slots)} slots, {len(starts)} starts, {len(lens)} lens; allowed: the same count{more}")
    if len(set(slots)) != len(slots):
        dup = sorted({sl for sl in slots if list(slots).count(sl) > 1})
        raise ValueError(f"slots {dup} appear twice in one step; allowed: each slot at most once")


class SeqPool:
    """Slots, rings, compressor states and paged caches for `n_slots` sequences (module
    docstring). `blocks`: blocks per ratio (default: enough for every slot at max_seq)."""

    def __init__(
        self,
        cfg: AttnV41Cfg,
        n_slots: int,
        device: torch.device | str = "cpu",
        block_rows: int = 64,
        blocks: dict[int, int] | None = None,
        kv_format: str = "bf16",
    ):
        check_kv_format(kv_format)
        if isinstance(n_slots, bool) or not isinstance(n_slots, int) or n_slots < 1:
            raise ValueError(f"n_slots = {n_slots!r}; allowed: an int >= 1")
        if isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1:
            raise ValueError(f"block_rows = {block_rows!r}; allowed: an int >= 1")
        dev = check_device(device)
        c = cfg
        self.cfg, self.n_slots, self.block_rows, self.device = cfg, n_slots, block_rows, dev
        W, D, B = c.window, c.head_dim, block_rows
        self.ratios = sorted({c.roles[i].ratio for i in c.kv_source_layers})
        self.max_blocks = {r: _cdiv(_cdiv(c.max_seq, r), B) for r in self.ratios}
        if blocks is not None and not isinstance(blocks, dict):
            raise TypeError(
                f"blocks = {blocks!r}; allowed: None (enough for every slot at max_seq) or a dict "
                f"{{ratio: block count}} over the kv sources' ratios {self.ratios}"
            )
        blocks = dict(blocks or {})
        for r in blocks:
            if r not in self.ratios:
                raise ValueError(f"blocks for ratio {r}; allowed: the kv sources' ratios {self.ratios}")
        # A step writes one pool row per token (its group's row, the pad tokens' the spare
        # block's), and the cache writes keep only a step's last `rows` writes: a pool
        # (with its spare block) must hold at least max_tokens rows, or a step's first
        # tokens' rows would be dropped. The default is never below that.
        least = _cdiv(c.max_tokens, B) - 1  # blocks besides the spare one
        self.n_blocks = {r: blocks.get(r, max(n_slots * self.max_blocks[r], least, 1)) for r in self.ratios}
        for r, n in self.n_blocks.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < max(least, 1):
                raise ValueError(
                    f"blocks[{r}] = {n!r}; allowed: an int >= {max(least, 1)} (with the spare block, at least "
                    f"max_tokens = {c.max_tokens} rows of {B}: a step writes a pool row per token)"
                )
        # One more slot than the caller's: the pad slot (`pad_slot` = n_slots), where the
        # padding tokens of a captured step's batch-size bucket compute (`BatchGraphs`);
        # its table points every entry at one spare block per ratio (the last), so the pad
        # tokens' reads and writes never touch a sequence's memory. Nothing reads its results.
        S1 = n_slots + 1
        self.pad_slot, self.state_slots = n_slots, S1
        self.tables = {r: torch.full((S1, self.max_blocks[r]), -1, dtype=torch.int32, device=dev) for r in self.ratios}
        for r in self.ratios:
            self.tables[r][n_slots].fill_(self.n_blocks[r])  # the spare block
        self.blocks_of: dict[int, list[list[int]]] = {r: [[] for _ in range(n_slots)] for r in self.ratios}
        self.free_blocks: dict[int, list[int]] = {r: list(range(self.n_blocks[r]))[::-1] for r in self.ratios}
        # per ratio and block: how many slots' tables hold it (0: free; > 1: shared by forks)
        self.refs: dict[int, list[int]] = {r: [0] * self.n_blocks[r] for r in self.ratios}
        self.length = [0] * n_slots  # tokens each slot holds (its next position)
        # per slot a number unique to the sequence it holds, new whenever one starts there
        # (`release`, `assume`; a step from position 0 releases first): what a `BatchV41`
        # undo log records, so that it dies with its sequence
        self.seq_ids = [0] * n_slots
        self._seq_count = 0
        self.in_step: frozenset[int] = frozenset()  # the slots of a step begun and not finished (`BatchV41`)
        # slots whose step raised inside a layer (`BatchV41._abandon`) or whose rollback raised part-way:
        # slot -> (step id, layer or "rollback"); their caches hold part of that work, so they take
        # only a new sequence (start 0) until release/assume
        self.failed: dict[int, tuple[int, int | str]] = {}
        bf = dict(dtype=torch.bfloat16, device=dev)
        # kv_format "packed": every cached row in V4.1's byte format (attnv41.packed): window
        # rows fp8_e8m0, compressed rows fp4_e4m3, index keys fp4_e8m0 (uint8 rows)
        self.kv_format, self.packed = kv_format, kv_format == "packed"
        u8 = dict(dtype=torch.uint8, device=dev)
        wd = row_bytes("fp8_e8m0", D) if self.packed else D
        cd = row_bytes("fp4_e4m3", D) if self.packed else D
        kd = row_bytes("fp4_e8m0", c.index_head_dim) if self.packed else c.index_head_dim
        st = u8 if self.packed else bf
        self.ring_rows = S1 * W  # the staging rows follow
        self.ring = [torch.zeros(S1 * W + c.max_tokens, wd, **st) for _ in range(c.n_layers)]
        self.comp_a: dict[int, torch.Tensor] = {}
        self.comp_g: dict[int, torch.Tensor] = {}
        self.compress_kv: dict[int, torch.Tensor] = {}
        self.index_k: dict[int, torch.Tensor] = {}
        for i in c.kv_source_layers:
            r = c.roles[i].ratio
            self.compress_kv[i] = torch.zeros((self.n_blocks[r] + 1) * B, cd, **st)
            self.index_k[i] = torch.zeros((self.n_blocks[r] + 1) * B, kd, **st)
            if r >= 2:
                self.comp_a[i] = torch.zeros(S1, r, D, dtype=torch.float32, device=dev)
                self.comp_g[i] = torch.full((S1, r, D), float("-inf"), dtype=torch.float32, device=dev)

    def blocks_for(self, r: int, length: int) -> int:
        """Blocks of ratio r a sequence of `length` tokens needs: ⌈length / r⌉ rows (its
        complete groups and the one in progress)."""
        return _cdiv(_cdiv(length, r), self.block_rows)

    def _grow(self, slot: int, length: int) -> None:
        """Allocate the slot's blocks up to `length` tokens (checked by the caller)."""
        for r in self.ratios:
            mine = self.blocks_of[r][slot]
            while len(mine) < self.blocks_for(r, length):
                blk = self.free_blocks[r].pop()
                self.refs[r][blk] = 1
                self.tables[r][slot, len(mine)] = blk
                mine.append(blk)

    def _write_blocks(self, r: int, start: int, end: int) -> range:
        """The block numbers (in a slot's table) a call of positions start..end−1 may write
        rows into: its compressed rows ⌊start/r⌋ … ⌊(end−1)/r⌋ (a decode token writes its
        group's row)."""
        return range((start // r) // self.block_rows, self.blocks_for(r, end))

    def blocks_needed(self, slots, starts, lens) -> dict[int, tuple[int, int]]:
        """Per ratio (blocks a step takes, blocks it may take): what `BatchV41`'s allocation
        would do, simulated in its order: every slot starting a new sequence (start 0)
        lets its blocks go (freeing those no other slot holds), then every continued slot
        takes a copy of each shared block it writes into (`own_rows`) and grows. A scheduler
        may ask before it begins a step; `BatchV41.begin` checks the step's other rules."""
        check_step_lists(slots, starts, lens, at_least=0)
        for slot, s, m in zip(slots, starts, lens):
            self._check_slot(slot)
            if s not in (0, self.length[slot]):
                raise ValueError(
                    f"slot {slot}: start = {s}; allowed: 0 (a new sequence) or {self.length[slot]} (its next position)"
                )
            if s < 0 or m < 1 or s + m > self.cfg.max_seq:
                raise ValueError(
                    f"slot {slot}: start {s}, {m} tokens; allowed: start >= 0, tokens >= 1, start + tokens <= "
                    f"{self.cfg.max_seq} (max_seq)"
                )
        out = {}
        for r in self.ratios:
            refs = {}  # simulated counts of the blocks touched

            def ref(b, refs=refs, r=r):
                return refs.get(b, self.refs[r][b])

            freed = 0
            for slot, s in zip(slots, starts):
                if s == 0:
                    for b in self.blocks_of[r][slot]:
                        refs[b] = ref(b) - 1
                        freed += refs[b] == 0
            need = 0
            for slot, s, m in zip(slots, starts, lens):
                have = 0 if s == 0 else len(self.blocks_of[r][slot])
                need += max(0, self.blocks_for(r, s + m) - have)
                if s == 0:
                    continue
                mine = self.blocks_of[r][slot]
                for j in self._write_blocks(r, s, s + m):
                    if j < len(mine) and ref(mine[j]) > 1:
                        refs[mine[j]] = ref(mine[j]) - 1
                        need += 1
            out[r] = (need, len(self.free_blocks[r]) + freed)
        return out

    def own_rows(self, slot: int, start: int, end: int) -> None:
        """Before a call of positions start..end−1 writes its rows: every block it may write
        into (`_write_blocks`) that another slot also holds is copied into a free block
        (the rows of every kv source of that ratio: compressed KV and index keys), which
        replaces it in this slot's table (free blocks counted by the caller,
        `blocks_needed`)."""
        B = self.block_rows
        for r in self.ratios:
            mine = self.blocks_of[r][slot]
            for j in self._write_blocks(r, start, end):
                if j >= len(mine) or self.refs[r][mine[j]] == 1:
                    continue
                old, new = mine[j], self.free_blocks[r][-1]  # the copies first: the books change after
                for i in self.compress_kv:
                    if self.cfg.roles[i].ratio == r:
                        for pool in (self.compress_kv[i], self.index_k[i]):
                            pool[new * B : (new + 1) * B].copy_(pool[old * B : (old + 1) * B])
                self.free_blocks[r].pop()
                self.refs[r][old] -= 1
                self.refs[r][new] = 1
                self.tables[r][slot, j] = new
                mine[j] = new

    def _share(self, src: int, dst: int) -> None:
        """dst (released: it holds nothing) continues src's sequence: its table holds src's
        blocks (shared: `refs`), its rings, compressor groups in progress and length are
        copies of src's. A new sequence in dst (`seq_ids`). The device copies run first: if
        one raises, the host's books still say dst holds nothing (its table is rewritten
        before any read: `release`, `_grow`)."""
        W = self.cfg.window
        for r in self.ratios:
            self.tables[r][dst].copy_(self.tables[r][src])
        for ring in self.ring:
            ring[dst * W : (dst + 1) * W].copy_(ring[src * W : (src + 1) * W])
        for i in self.comp_a:
            self.comp_a[i][dst].copy_(self.comp_a[i][src])
            self.comp_g[i][dst].copy_(self.comp_g[i][src])
        for r in self.ratios:
            self.blocks_of[r][dst] = list(self.blocks_of[r][src])
            for b in self.blocks_of[r][dst]:
                self.refs[r][b] += 1
        self.length[dst] = self.length[src]
        self.failed.pop(dst, None)
        self._new_sequence(dst)

    def assume(self, slot: int, length: int) -> None:
        """Give a slot a sequence of `length` tokens without running it (benchmarks,
        tests): the blocks its caches need are allocated, the contents are whatever the
        pools hold. The next step of the slot starts at `length`. A new sequence: the old
        one's undo log is gone (`BatchV41.rollback` refuses)."""
        self._check_slot(slot)
        self._check_idle(slot, "assume")
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.cfg.max_seq:
            raise ValueError(f"length = {length!r}; allowed: 0..{self.cfg.max_seq}")
        for r in self.ratios:
            n, have = self.blocks_for(r, length), len(self.blocks_of[r][slot])
            if n - have > len(self.free_blocks[r]):
                raise ValueError(
                    f"slot {slot}: {n} blocks of ratio {r} for {length} tokens; allowed: at most "
                    f"{len(self.free_blocks[r]) + have}"
                )
        self._grow(slot, length)
        self.length[slot] = length
        self.failed.pop(slot, None)
        self._new_sequence(slot)

    def _new_sequence(self, slot: int) -> None:
        """A new sequence in the slot (`seq_ids`): undo logs of the old one are dead."""
        self._seq_count += 1
        self.seq_ids[slot] = self._seq_count

    def _check_idle(self, slot: int, what: str) -> None:
        if slot in self.in_step:
            raise ValueError(
                f"{what}(slot {slot}) while a step of slots {sorted(self.in_step)} runs; allowed: between steps "
                f"(after the step's last layer; a step begun and not run: BatchV41.cancel() first)"
            )

    def release(self, slot: int) -> None:
        """Forget the slot's sequence and return its blocks to the free list (those no other
        slot holds: blocks shared by a fork stay with the others) (not while a step of the slot runs);
        a slot whose step failed (`failed`) takes any step again. The sequence's undo log
        goes with it (`BatchV41.rollback` refuses). Releasing a slot that holds no sequence is
        allowed (an engine may release on every finish path): it has no blocks to return."""
        self._check_slot(slot)
        self._check_idle(slot, "release")
        for r in self.ratios:
            for b in self.blocks_of[r][slot]:
                self.refs[r][b] -= 1
            self.free_blocks[r].extend(b for b in reversed(self.blocks_of[r][slot]) if self.refs[r][b] == 0)
            self.blocks_of[r][slot] = []
            self.tables[r][slot].fill_(-1)
        for i in self.comp_g:  # no group in progress
            self.comp_a[i][slot].zero_()
            self.comp_g[i][slot].fill_(float("-inf"))
        self.length[slot] = 0
        self.failed.pop(slot, None)
        self._new_sequence(slot)

    def _check_slot(self, slot) -> None:
        if isinstance(slot, bool) or not isinstance(slot, int):
            raise not_an_int("slot", slot, f"0..{self.n_slots - 1}")
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"slot = {slot!r}; allowed: 0..{self.n_slots - 1}")

    def physical(self, r: int, slots: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Physical pool rows of logical rows `rows` (int, ≥ 0, or −1 kept) of `slots`."""
        B = self.block_rows
        j = rows.long().clamp_min(0)
        blk = self.tables[r][slots.long(), j // B].long()
        return torch.where(rows >= 0, blk * B + j % B, -1)

    def cache_rows(self, layer: int, slot: int, n: int, keys: bool = False) -> torch.Tensor:
        """A kv source's first n cache rows of a slot, in logical order (a gather), bf16
        (packed rows unpacked: the same values)."""
        r = self.cfg.roles[layer].ratio
        rows = torch.arange(n, device=self.device)
        phys = self.physical(r, torch.full_like(rows, slot), rows)
        got = (self.index_k if keys else self.compress_kv)[layer][phys]
        if not self.packed:
            return got
        if keys:
            return unpack(got, "fp4_e8m0", self.cfg.index_head_dim)
        return unpack(got, "fp4_e4m3", self.cfg.head_dim)

    def window_rows(self, layer: int, rows: torch.Tensor) -> torch.Tensor:
        """Rows of layer's ring tensor (slots' rings, then the staging rows), bf16."""
        got = self.ring[layer][rows]
        return unpack(got, "fp8_e8m0", self.cfg.head_dim) if self.packed else got


@dataclass
class BatchStep:
    """One validated step: the sequences (slot, first position, token count) and the
    device metadata derived from them once (positions, window selections, ring writes)."""

    slots: list[int]
    starts: list[int]
    lens: list[int]
    offsets: list[int]  # first token of each sequence in the step's [T] rows
    T: int
    pos: torch.Tensor  # int32 [T]
    tok_slot: torch.Tensor  # int32 [T]
    win_sel: torch.Tensor  # int32 [T, window]: physical ring rows, −1 absent, columns as the regime lays them
    win_width: torch.Tensor  # int64 [T]: where the compressed part starts (min(m, W) for a prefill, else W)
    ring_dst: torch.Tensor  # int64: ring rows written after attention (decode-only: by the kv chain)
    ring_src: torch.Tensor  # int64: the step rows written there (unused by decode-only steps)
    next_layer: int = 0
    logged: tuple[int, ...] = ()  # slots whose call is a continuation of 2..window tokens (undo logs kept)
    id: int = 0
    bucket: int | None = None  # index widths bucket // ratio (fixed shapes), else the widest visible count
    decode_only: bool = False  # every sequence one token after position 0: the fixed-shape compressor
    keys_plan: tuple | None = None  # released index keys: (per index source the owner per sequence, owners after)
    # released index keys in a captured step (`BatchGraphs`): int32 [index sources, T], per
    # index source (in layer order) the layer whose keys each token scores, on the device
    owners_dev: torch.Tensor | None = None
    # A fixed-shape step (eager: every sequence 1..window tokens after position 0, not all
    # one, i.e. verify calls and decode tokens; in `BatchGraphs` every step that is not a
    # decode step) runs from device metadata (`_derive_cont`, `_compress_cont`): per token
    # its sequence's first position, end (first position after the call) and first row in
    # the step, int32 [T]
    cont: bool = False
    seq_start: torch.Tensor | None = None
    seq_end: torch.Tensor | None = None
    seq_off: torch.Tensor | None = None
    # ... and its undo data on the device (what `rollback` restores): per layer the ring rows
    # the step overwrote [T, row]; per ratio ≥ 2 kv source the compressor state of each
    # token's slot before the step [T, r, D] (values, gates) and the step's own rows [T, D]
    undo_ring: dict | None = None
    undo_state: dict | None = None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
