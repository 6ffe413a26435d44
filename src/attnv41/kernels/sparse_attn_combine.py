"""The second stage of the decode regime's sparse attention (`kernels.sparse_attn_split`,
whose module doc gives the order and the contract): the fused loop's recurrence over a
token's 64-entry blocks on the stored logits, for one slice of heads and columns, in two
forms with the same bits, and their shared pieces.

- `_pv_combine_kernel`: the loop itself, block by block.
- `_pv_blocks_kernel`: each block's dot(bf16(p), R) in its own program, the recurrence in
  the last program of a slice to arrive.
- `_gather_ptrs` (the selection's row pointers, also read by the logits kernel),
  `_load_rows` (the rows themselves, bf16 or V4.1's packed formats dequantized in place
  by `kernels.packed_rows`),
  `_row_sum` (Σp as a fixed pairwise tree), `_opaque` (keeps the loop's dot in a fresh
  accumulator), `_combine_epilogue` (sink, o, the inverse RoPE of o's tail).
"""

from __future__ import annotations

from ._triton import HAVE_TRITON, tl, triton

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait, round_bf16
    from .packed_rows import fp4_rows_bf16, fp8_e8m0_rows

if HAVE_TRITON:

    @triton.jit
    def _gather_ptrs(win_ptr, comp_ptr, sel_ptr, t, kk, K, offset, n_comp, stride_st, stride_sk, stride_wn, stride_cn):
        """One block's selection entries kk [BLOCK_K] of token t → (present, ok, win row base
        pointers, comp row base pointers), all [BLOCK_K]; past K reads as absent (−1)."""
        idx = tl.load(sel_ptr + t * stride_st + kk.to(tl.int64) * stride_sk, mask=kk < K, other=-1).to(tl.int64)
        present = idx >= 0
        from_win = present & (idx < offset)
        crow = idx - offset
        from_comp = present & (idx >= offset) & (crow < n_comp)
        w_base = win_ptr + tl.where(from_win, idx, 0) * stride_wn
        c_base = comp_ptr + tl.where(from_comp, crow, 0) * stride_cn
        return present, from_win, from_win | from_comp, w_base, c_base

    @triton.jit
    def _load_rows(
        w_base, c_base, from_win, ok, cols64, cm, stride_wd, stride_cd, D, c0,
        C: tl.constexpr, PACKED: tl.constexpr, WORDS: tl.constexpr,
    ):  # fmt: skip
        """[BLOCK_K, C] bf16: columns `cols64` (c0 … c0 + C − 1, masked by cm past D) of the
        selected rows (window rows where from_win, else compressed rows; 0 where not ok).
        PACKED: the rows are V4.1's byte formats (attnv41.packed), dequantized here
        (`kernels.packed_rows`: fp8_e8m0 window rows, fp4_e4m3 compressed rows, WORDS as
        `fp4_words_mode` of comp); exact, so the bf16 values of the unpacked rows. A block of
        entries all from one source (the selection's window entries come first, its
        compressed ones after) dequantizes only that source's format."""
        if PACKED:
            from_comp = ok & ~from_win
            n_win = tl.sum(from_win.to(tl.int32), axis=0)
            n_comp = tl.sum(from_comp.to(tl.int32), axis=0)
            if n_comp == 0:
                rows = fp8_e8m0_rows(w_base, from_win, c0, D, C).to(tl.bfloat16)
            elif n_win == 0:
                rows = fp4_rows_bf16(c_base, from_comp, c0, D, C, 16, False, WORDS)
            else:
                wv = fp8_e8m0_rows(w_base, from_win, c0, D, C).to(tl.bfloat16)
                cv = fp4_rows_bf16(c_base, from_comp, c0, D, C, 16, False, WORDS)
                rows = tl.where(from_win[:, None], wv, cv)
            return rows
        else:
            ptrs = tl.where(
                from_win[:, None],
                w_base[:, None] + cols64[None, :] * stride_wd,
                c_base[:, None] + cols64[None, :] * stride_cd,
            )
            return tl.load(ptrs, mask=ok[:, None] & cm[None, :], other=0.0)

    @triton.jit
    def _opaque(x):
        """x itself through an inline-asm move: no pattern rewrite can see through it."""
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)

    @triton.jit
    def _block_max(bm_ptr, row, H, offs_h64, mask_h, RS: tl.constexpr):
        """[BLOCK_HC] block `row`'s logit maxima per head, from the logits kernel's maxima
        (`bm_ptr` fp32 [m, KB · RS, H]: one per RS sub-block of rows): their max, exact."""
        if RS == 1:
            bm = tl.load(bm_ptr + row * H + offs_h64, mask=mask_h, other=float("-inf"))
        else:
            rs = tl.arange(0, RS)
            v = tl.load(
                bm_ptr + (row * RS + rs[None, :]) * H + offs_h64[:, None], mask=mask_h[:, None], other=float("-inf")
            )
            bm = tl.max(v, axis=1)
        return bm

    @triton.jit
    def _row_sum(p, R: tl.constexpr, C: tl.constexpr, LOG2_C: tl.constexpr):
        """[R, C] → [R]: Σ over each row as a fixed pairwise tree (entries 2j, 2j+1 → j,
        log2(C) levels; each level a sum over an axis of 2, one commutative add). Its bits
        do not depend on the register layout, so the two combines give the same Σp (a
        plain `tl.sum` follows the layout, which differs between them)."""
        for lvl in tl.static_range(LOG2_C):
            p = tl.sum(tl.reshape(p, (R, C >> (lvl + 1), 2)), axis=2)
        return tl.reshape(p, (R,))

    @triton.jit
    def _block_operands(
        win_ptr, comp_ptr, sel_ptr, s_ptr, bm_ptr, t, kb, K_BLOCKS, H, D, K, offset, n_comp, offs_h64, offs_k,
        offs_v64, mask_h, mask_v, c0, stride_wn, stride_wd, stride_cn, stride_cd, stride_st, stride_sk,
        BLOCK_DV: tl.constexpr, BLOCK_K: tl.constexpr, PACKED: tl.constexpr, WORDS: tl.constexpr,
        RS: tl.constexpr,
    ):  # fmt: skip
        """Block kb of token t for a combine's slice (heads offs_h64, columns offs_v64 from
        c0): its maxima bm [BLOCK_HC], logits s [BLOCK_HC, BLOCK_K] fp32 (absent →
        −inf) and rows [BLOCK_K, BLOCK_DV] bf16 (absent → 0)."""
        row = t * K_BLOCKS + kb
        bm = _block_max(bm_ptr, row, H, offs_h64, mask_h, RS)
        s = tl.load(
            s_ptr + (row * H + offs_h64[:, None]) * BLOCK_K + offs_k[None, :], mask=mask_h[:, None], other=float("-inf")
        )
        present, from_win, ok, w_base, c_base = _gather_ptrs(
            win_ptr, comp_ptr, sel_ptr, t, kb * BLOCK_K + offs_k, K, offset, n_comp, stride_st, stride_sk, stride_wn,
            stride_cn,
        )  # fmt: skip
        rows = _load_rows(
            w_base, c_base, from_win, ok, offs_v64, mask_v, stride_wd, stride_cd, D, c0,
            BLOCK_DV, PACKED, WORDS,
        )  # fmt: skip
        return bm, s, rows

    @triton.jit
    def _pv_combine_kernel(
        win_ptr,
        comp_ptr,
        sel_ptr,
        s_ptr,  # fp32 [m, KB, H, BLOCK_K]
        bm_ptr,  # fp32 [m, KB · RS, H]: the logits' maxima per sub-block of BLOCK_K / RS rows
        sink_ptr,
        out_ptr,
        rot_ptr,  # bf16 [m, H, D]: o with its rope tail inversely rotated (ROT only)
        cos_ptr,
        sin_ptr,
        pos_ptr,
        H,
        D,
        K,
        offset,
        n_comp,
        stride_wn,
        stride_wd,
        stride_cn,
        stride_cd,
        stride_st,
        stride_sk,
        stride_ot,
        stride_oh,
        stride_od,
        stride_rt,
        stride_rh,
        stride_cos,
        stride_sin,
        ROT: tl.constexpr,
        HALF: tl.constexpr,
        BLOCK_HC: tl.constexpr,
        BLOCK_DV: tl.constexpr,
        BLOCK_K: tl.constexpr,
        LOG2_K: tl.constexpr,
        K_BLOCKS: tl.constexpr,
        DOT_FP32: tl.constexpr,
        PACKED: tl.constexpr,
        WORDS: tl.constexpr,
        RS: tl.constexpr = 1,
        PDL: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        t = tl.program_id(0).to(tl.int64)

        # [BLOCK_HC] heads, [BLOCK_DV] columns of this program's slice, [BLOCK_K] entries
        offs_h = tl.program_id(1) * BLOCK_HC + tl.arange(0, BLOCK_HC)
        offs_v = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
        offs_k = tl.arange(0, BLOCK_K)
        mask_h = offs_h < H
        mask_v = offs_v < D
        offs_h64 = offs_h.to(tl.int64)
        offs_v64 = offs_v.to(tl.int64)

        c0 = tl.program_id(2) * BLOCK_DV
        # the fused loop over the blocks, on the stored logits: mx, den [BLOCK_HC], acc [BLOCK_HC, BLOCK_DV] fp32
        mx = tl.full([BLOCK_HC], float("-inf"), tl.float32)
        den = tl.zeros([BLOCK_HC], dtype=tl.float32)
        acc = tl.zeros([BLOCK_HC, BLOCK_DV], dtype=tl.float32)
        for kb in range(0, K_BLOCKS):
            bm, s, rows = _block_operands(
                win_ptr, comp_ptr, sel_ptr, s_ptr, bm_ptr, t, kb, K_BLOCKS, H, D, K, offset, n_comp, offs_h64, offs_k,
                offs_v64, mask_h, mask_v, c0, stride_wn, stride_wd, stride_cn, stride_cd, stride_st, stride_sk,
                BLOCK_DV, BLOCK_K, PACKED, WORDS, RS,
            )  # fmt: skip
            # the running max is the max of the block maxima so far (exact), as in the fused loop
            new = tl.maximum(mx, bm)
            base = tl.where(new == float("-inf"), 0.0, new)
            alpha = tl.exp(mx - base)
            p = tl.exp(s - base[:, None])
            den = den * alpha + _row_sum(p, BLOCK_HC, BLOCK_K, LOG2_K)
            p_bf16 = round_bf16(p)
            if DOT_FP32:  # interpreter only: its tl.dot multiplies bf16 bit patterns as integers
                pv = tl.dot(p_bf16.to(tl.float32), rows.to(tl.float32), input_precision="ieee")
            else:
                # a fresh accumulator, as the block-parallel combine's: Triton folds
                # `acc·α + dot(p, R)` into dot(p, R, acc·α) (the products summed onto the
                # running sum, other bits), and an opaque copy of the product blocks that
                pv = _opaque(tl.dot(p_bf16, rows))
            acc = acc * alpha[:, None] + pv
            mx = new

        _combine_epilogue(
            mx, den, acc, sink_ptr, out_ptr, rot_ptr, cos_ptr, sin_ptr, pos_ptr, t, offs_h64, offs_v64, mask_h,
            mask_v, D, tl.program_id(2) * BLOCK_DV, stride_ot, stride_oh, stride_od, stride_rt, stride_rh,
            stride_cos, stride_sin, ROT=ROT, HALF=HALF, BLOCK_DV=BLOCK_DV,
        )  # fmt: skip

    @triton.jit
    def _combine_epilogue(
        mx, den, acc, sink_ptr, out_ptr, rot_ptr, cos_ptr, sin_ptr, pos_ptr, t, offs_h64, offs_v64, mask_h, mask_v,
        D, lo, stride_ot, stride_oh, stride_od, stride_rt, stride_rh, stride_cos, stride_sin,
        ROT: tl.constexpr, HALF: tl.constexpr, BLOCK_DV: tl.constexpr,
    ):  # fmt: skip
        """Both combines' epilogue for one (token, head block, D slice starting at column
        lo): the sink joins the sum last (no key present → den = 1, acc = 0, o = 0), o =
        bf16(acc / den) stored, and with ROT the inverse RoPE of o's last 2·HALF values
        (`rope.apply_rope(o, inverse=True)`'s math: pair (a, b) → (a·c + b·s, b·c − a·s) in
        fp32, products rounded before the sums) written to rot, the leading values copied.
        The pairs are split out of the o tile in registers (columns 2k, 2k+1 of the slice:
        lo and D − 2·HALF even, checked by the wrapper), rotated where they lie in the
        tail, joined back, and rot stored as one tile."""
        # sink: [BLOCK_HC] fp32
        sink = tl.load(sink_ptr + offs_h64, mask=mask_h, other=0.0)
        none = mx == float("-inf")
        den = tl.where(none, 1.0, den + tl.exp(sink - tl.where(none, sink, mx)))
        o = round_bf16(tl.math.div_rn(acc, den[:, None]))
        o_ptrs = out_ptr + t * stride_ot + offs_h64[:, None] * stride_oh + offs_v64[None, :] * stride_od
        om = mask_h[:, None] & mask_v[None, :]
        tl.store(o_ptrs, o, mask=om)
        if ROT:
            # [BLOCK_HC, BLOCK_DV/2] the slice's pairs (a, b) = columns lo+2i, lo+2i+1
            a, b = tl.split(tl.reshape(o.to(tl.float32), (o.shape[0], BLOCK_DV // 2, 2)))
            # [BLOCK_DV/2] pair i's rope pair k (tail: k = (lo + 2i − lead)/2 in 0 … HALF−1)
            col = lo + 2 * tl.arange(0, BLOCK_DV // 2)
            lead = D - 2 * HALF
            tail = (col >= lead) & (col < D)
            k = tl.where(tail, (col - lead) // 2, 0)
            p = tl.load(pos_ptr + t).to(tl.int64)
            c = tl.load(cos_ptr + p * stride_cos + k, mask=tail, other=1.0)
            sn = -tl.load(sin_ptr + p * stride_sin + k, mask=tail, other=0.0)
            re = a * c[None, :] - b * sn[None, :]
            im = a * sn[None, :] + b * c[None, :]
            re = tl.where(tail[None, :], round_bf16(re).to(tl.float32), a)
            im = tl.where(tail[None, :], round_bf16(im).to(tl.float32), b)
            r = tl.reshape(tl.join(re, im), (o.shape[0], BLOCK_DV)).to(tl.bfloat16)
            r_ptrs = rot_ptr + t * stride_rt + offs_h64[:, None] * stride_rh + offs_v64[None, :]
            tl.store(r_ptrs, r, mask=om)

    @triton.jit
    def _pv_blocks_kernel(
        win_ptr,
        comp_ptr,
        sel_ptr,
        s_ptr,  # fp32 [m, KB, H, BLOCK_K]
        bm_ptr,  # fp32 [m, KB · RS, H]
        pv_ptr,  # fp32 [m, KB, H, D]: each block's weighted rows
        lock_ptr,  # int32 [m, head blocks, D slices] arrival counters (zero between calls)
        sink_ptr,
        out_ptr,
        rot_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        H,
        D,
        K,
        offset,
        n_comp,
        stride_wn,
        stride_wd,
        stride_cn,
        stride_cd,
        stride_st,
        stride_sk,
        stride_ot,
        stride_oh,
        stride_od,
        stride_rt,
        stride_rh,
        stride_cos,
        stride_sin,
        ROT: tl.constexpr,
        HALF: tl.constexpr,
        BLOCK_HC: tl.constexpr,
        BLOCK_DV: tl.constexpr,
        BLOCK_K: tl.constexpr,
        LOG2_K: tl.constexpr,
        K_BLOCKS: tl.constexpr,
        KB_P2: tl.constexpr,
        DOT_FP32: tl.constexpr,
        PACKED: tl.constexpr,
        WORDS: tl.constexpr,
        RS: tl.constexpr = 1,
        PDL: tl.constexpr = False,
        EARLY: tl.constexpr = False,
        RELEASE: tl.constexpr = False,
    ):
        """Grid (m, blocks, head blocks × D slices). Each program: one block's weighted rows
        pv = dot(bf16(exp(s − base)), R) for its slice, base the running max at that block
        (the max of the block maxima so far: exact, so the fused loop's value bit for bit),
        stored; the last program of a (token, head block, slice) to arrive runs the fused
        loop's recurrence over the stored pv (den = den·α + Σp, acc = acc·α + pv) and the
        epilogue. The blocks' gathers and dots run in parallel instead of in sequence.

        EARLY (with PDL, launched after a logits kernel with LATE_RELEASE): the block's rows
        are gathered before the wait for the logits kernel. Everything they depend on (the
        selection, the caches) was written by kernels that finished before the logits
        kernel released this one; the logits, maxima and workspace are touched only after
        the wait. The same loads and arithmetic: the same bits.

        RELEASE (the `counter_release` tune key): the arrival counter's add with release
        semantics only (acq_rel puts an L1 invalidation after the atomic in every program,
        sm_90 SASS), the acquire in the last program alone (its value feeds the loads' mask,
        so it is not dropped), a relaxed reset; as `gemv._SPLIT_FORM = "release"`. The same
        loads and arithmetic: the same bits."""
        pdl_release(PDL)
        if not EARLY:
            pdl_wait(PDL)
        t = tl.program_id(0).to(tl.int64)
        kb = tl.program_id(1)
        n_dv = tl.cdiv(D, BLOCK_DV)
        hc = tl.program_id(2) // n_dv
        dv = tl.program_id(2) % n_dv

        # [BLOCK_HC] heads, [BLOCK_DV] columns of this program's slice, [BLOCK_K] entries
        offs_h = hc * BLOCK_HC + tl.arange(0, BLOCK_HC)
        offs_v = dv * BLOCK_DV + tl.arange(0, BLOCK_DV)
        offs_k = tl.arange(0, BLOCK_K)
        mask_h = offs_h < H
        mask_v = offs_v < D
        offs_h64 = offs_h.to(tl.int64)
        offs_v64 = offs_v.to(tl.int64)
        # rows: [BLOCK_K, BLOCK_DV] bf16 (absent → 0); with EARLY gathered while the logits kernel runs
        _, from_win, ok, w_base, c_base = _gather_ptrs(
            win_ptr, comp_ptr, sel_ptr, t, kb * BLOCK_K + offs_k, K, offset, n_comp, stride_st, stride_sk,
            stride_wn, stride_cn,
        )  # fmt: skip
        rows = _load_rows(
            w_base, c_base, from_win, ok, offs_v64, mask_v, stride_wd, stride_cd, D, dv * BLOCK_DV,
            BLOCK_DV, PACKED, WORDS,
        )  # fmt: skip
        if EARLY:
            pdl_wait(PDL)

        # base: [BLOCK_HC] the running max at block kb = max of the block maxima 0..kb
        if RS == 1:
            kbs = tl.arange(0, KB_P2)
            bms = tl.load(
                bm_ptr + (t * K_BLOCKS + kbs)[None, :] * H + offs_h64[:, None],
                mask=mask_h[:, None] & (kbs <= kb)[None, :],
                other=float("-inf"),
            )
        else:  # the sub-blocks' maxima of blocks 0..kb
            j = tl.arange(0, KB_P2 * RS)
            bms = tl.load(
                bm_ptr + (t * K_BLOCKS * RS + j)[None, :] * H + offs_h64[:, None],
                mask=mask_h[:, None] & (j < (kb + 1) * RS)[None, :],
                other=float("-inf"),
            )
        run = tl.max(bms, axis=1)
        base = tl.where(run == float("-inf"), 0.0, run)
        row = t * K_BLOCKS + kb
        # s: [BLOCK_HC, BLOCK_K] this block's logits
        s = tl.load(
            s_ptr + (row * H + offs_h64[:, None]) * BLOCK_K + offs_k[None, :], mask=mask_h[:, None], other=float("-inf")
        )
        p_bf16 = round_bf16(tl.exp(s - base[:, None]))
        if DOT_FP32:  # interpreter only: its tl.dot multiplies bf16 bit patterns as integers
            pv = tl.dot(p_bf16.to(tl.float32), rows.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p_bf16, rows)
        # [BLOCK_HC, BLOCK_DV] this block's pv, for the combine
        pv_blk = pv_ptr + (row * H + offs_h64[:, None]) * D + offs_v64[None, :]
        tl.store(pv_blk, pv, mask=mask_h[:, None] & mask_v[None, :])
        tl.debug_barrier()  # every thread's pv stored before the release below
        lock = lock_ptr + t * tl.num_programs(2) + tl.program_id(2)
        if RELEASE:
            arrived = tl.atomic_add(lock, 1, sem="release", scope="gpu")
        else:
            arrived = tl.atomic_add(lock, 1, sem="acq_rel", scope="gpu")
        if arrived == K_BLOCKS - 1:  # the last block of this slice: the recurrence, in block order
            if RELEASE:  # the acquire: every block's release seen before the loads below
                mask_h = mask_h & (tl.atomic_add(lock, 0, sem="acquire", scope="gpu") == K_BLOCKS)
            mx = tl.full([BLOCK_HC], float("-inf"), tl.float32)
            den = tl.zeros([BLOCK_HC], dtype=tl.float32)
            acc = tl.zeros([BLOCK_HC, BLOCK_DV], dtype=tl.float32)
            for b in tl.static_range(K_BLOCKS):
                rb = t * K_BLOCKS + b
                bm = _block_max(bm_ptr, rb, H, offs_h64, mask_h, RS)
                sb = tl.load(
                    s_ptr + (rb * H + offs_h64[:, None]) * BLOCK_K + offs_k[None, :],
                    mask=mask_h[:, None],
                    other=float("-inf"),
                )
                pvb = tl.load(
                    pv_ptr + (rb * H + offs_h64[:, None]) * D + offs_v64[None, :],
                    mask=mask_h[:, None] & mask_v[None, :],
                    other=0.0,
                    cache_modifier=".cg",
                )
                new = tl.maximum(mx, bm)
                nb = tl.where(new == float("-inf"), 0.0, new)
                alpha = tl.exp(mx - nb)
                den = den * alpha + _row_sum(tl.exp(sb - nb[:, None]), BLOCK_HC, BLOCK_K, LOG2_K)
                acc = acc * alpha[:, None] + pvb
                mx = new
            _combine_epilogue(
                mx, den, acc, sink_ptr, out_ptr, rot_ptr, cos_ptr, sin_ptr, pos_ptr, t, offs_h64, offs_v64, mask_h,
                mask_v, D, dv * BLOCK_DV, stride_ot, stride_oh, stride_od, stride_rt, stride_rh, stride_cos, stride_sin,
                ROT=ROT, HALF=HALF, BLOCK_DV=BLOCK_DV,
            )  # fmt: skip
            if RELEASE:
                tl.atomic_xchg(lock, 0, sem="relaxed", scope="gpu")
            else:
                tl.atomic_xchg(lock, 0)
