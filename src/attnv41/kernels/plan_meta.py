"""The decode plan's metadata from the device position in one kernel (`runtime.plan`'s
`derive` on CUDA; twin: the torch ops of `DecodePlan.derive_torch`, the CPU path).

For each sequence b (one program) at position p = pos[b], and each compression ratio r_k
of the layer classes: meta[k, :, b] = ((p+1)//r, p//r, (p//r)·r, p mod r, (p+1) mod r = 0)
(visible rows, the row in progress, its RoPE position, the compressor slot, group
completion, int64), done[k, b] = the completion flag (bool); the window selection
sel0[b, j] = s if s ≤ p else −1 with s = (p + 1 + j) mod W, copied into the first W columns
of every index source's selection sel[n, b]. Integer arithmetic: exact, the twin's values.
"""

from __future__ import annotations

from ._triton import HAVE_TRITON, pdl_launch, require_triton, tl, triton

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait

__all__ = ["derive"]

if HAVE_TRITON:

    @triton.jit
    def _derive_kernel(
        pos_ptr,  # int32 [B]
        rs_ptr,  # int64 [R]
        meta_ptr,  # int64 [R, 5, B]
        done_ptr,  # bool [R, B]
        sel0_ptr,  # int32 [B, W]
        sel_ptr,  # int32 [NIX, B, SW]
        B,
        R,
        W,
        SW,
        NIX: tl.constexpr,
        R_P2: tl.constexpr,
        W_P2: tl.constexpr,
        PDL: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        b = tl.program_id(0)
        p = tl.load(pos_ptr + b).to(tl.int64)
        k = tl.arange(0, R_P2)
        k_ok = k < R
        r = tl.load(rs_ptr + k, mask=k_ok, other=1)
        row = p // r
        done = ((p + 1) % r) == 0
        base = meta_ptr + k * (5 * B) + b
        tl.store(base + 0 * B, (p + 1) // r, mask=k_ok)
        tl.store(base + 1 * B, row, mask=k_ok)
        tl.store(base + 2 * B, row * r, mask=k_ok)
        tl.store(base + 3 * B, p % r, mask=k_ok)
        tl.store(base + 4 * B, done.to(tl.int64), mask=k_ok)
        tl.store(done_ptr + k * B + b, done, mask=k_ok)
        j = tl.arange(0, W_P2)
        j_ok = j < W
        s = (p + 1 + j) % W
        v = tl.where(s <= p, s, -1).to(tl.int32)
        tl.store(sel0_ptr + b * W + j, v, mask=j_ok)
        for n in range(NIX):
            tl.store(sel_ptr + (n * B + b) * SW + j, v, mask=j_ok)


def derive(pos, rs, meta, done, sel0, sel) -> None:
    """Write meta, done, sel0 and sel[:, :, :W] from pos (module doc); CUDA, one launch,
    no host sync. Shapes: pos int32 [B], rs int64 [R, 1], meta int64 [R, 5, B], done bool
    [R, B, 1, 1], sel0 int32 [B, W], sel int32 [NIX, B, W + topk] (all contiguous)."""
    require_triton("plan derive", pos, rs, meta, done, sel0, sel)
    B, W = sel0.shape
    R = rs.shape[0]
    for name, t in (("pos", pos), ("rs", rs), ("meta", meta), ("done", done), ("sel0", sel0), ("sel", sel)):
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous; allowed: a contiguous tensor")
    if R == 0:
        return
    _derive_kernel[(B,)](
        pos, rs, meta, done, sel0, sel, B, R, W, sel.shape[2], NIX=sel.shape[0],
        R_P2=triton.next_power_of_2(R), W_P2=triton.next_power_of_2(W), num_warps=1, **pdl_launch(pos),
    )  # fmt: skip
