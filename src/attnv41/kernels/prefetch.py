"""Weights streamed into L2 ahead of the kernel that reads them: `l2_prefetch(tensors)`.

A decode step at batch 1 alternates kernels that stream weights (the GEMVs: bound by
DRAM) with kernels that read little and wait on latency (the attention, the norms and
chains, the index scores): during the latter DRAM is mostly idle. `l2_prefetch` launched
before such a kernel asks L2 for the bytes of the weights the next GEMVs read
(`cp.async.bulk.prefetch.L2.global`, sm_90: fire and forget, nothing read into registers,
nothing waits for it), so they arrive while the latency-bound kernel runs and the GEMV
then reads them from L2.

It changes no value anywhere: a prefetch moves bytes into the cache, not into any tensor.
So no result depends on it (the bits of every kernel are those without it); it is a
performance hint, and a no-op where it cannot run (`l2_prefetch_noop`: the CPU, the
interpreter, GPUs before sm_90).

Launch: one program per `_CHUNK` bytes of each tensor, one warp; thread t asks for its
`_CHUNK / 32` bytes (16-byte aligned and sized, as the instruction requires; a tensor's
unaligned head and tail, under 16 bytes each, are left out). Under programmatic dependent
launch it releases the next kernel first, issues its prefetches, then waits for the
previous kernel like every kernel (`_triton.pdl_wait`), so the stream's order holds for the
kernels around it. Capturable (no host sync, no allocation).
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON, interpreting, pdl_launch, tl, triton

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait

__all__ = ["l2_prefetch", "l2_prefetch_noop", "prefetch_plan"]

_CHUNK = 1 << 18  # bytes per program (8 KB per thread)
_MAX_TENSORS = 4


def prefetch_plan(tensors, max_bytes: int | None = None) -> list[tuple[int, int]]:
    """[(first byte address, bytes)] that `l2_prefetch` asks for: each tensor's storage span
    (contiguous tensors only), its start rounded up and its length down to 16 bytes, the
    total cut at `max_bytes` (the first bytes first: the order in which a GEMV's first
    programs read them)."""
    spans, left = [], max_bytes
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or not t.is_contiguous():
            got = type(t).__name__ if not isinstance(t, torch.Tensor) else f"a non-contiguous {tuple(t.shape)} tensor"
            raise ValueError(f"l2_prefetch: {got}; allowed: contiguous tensors")
        a0 = t.data_ptr()
        a = (a0 + 15) // 16 * 16
        n = (a0 + t.numel() * t.element_size() - a) // 16 * 16
        if left is not None:
            n = min(n, left // 16 * 16)
            left -= n
        if n > 0:
            spans.append((a, n))
    return spans


def l2_prefetch_noop(tensors, max_bytes: int | None = None) -> None:
    """`l2_prefetch` where it cannot run: nothing (a hint changes no value)."""
    return None


if HAVE_TRITON:

    @triton.jit
    def _bulk_prefetch(addrs, sizes):
        """One `cp.async.bulk.prefetch.L2.global` per element (size 0: none)."""
        tl.inline_asm_elementwise(
            "{\n.reg .pred p;\nsetp.ne.u32 p, $2, 0;\n@p cp.async.bulk.prefetch.L2.global [$1], $2;\nmov.u32 $0, 0;\n}",
            "=r,l,r",
            [addrs, sizes],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )

    @triton.jit
    def _l2_prefetch_kernel(
        base_ptr,  # uint8 view of the first tensor: addresses are offsets from it
        offs,  # tuple: byte offset of span i from base_ptr (16-byte aligned)
        sizes,  # tuple: bytes of span i (a multiple of 16)
        starts,  # tuple, len + 1: first program of span i
        CHUNK: tl.constexpr,
        PDL: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pid = tl.program_id(0)
        SUB: tl.constexpr = CHUNK // 32
        t = tl.arange(0, 32)
        for i in tl.static_range(len(offs)):
            if (pid >= starts[i]) & (pid < starts[i + 1]):
                rel = (pid - starts[i]).to(tl.int64) * CHUNK + t.to(tl.int64) * SUB  # [32] bytes into span i
                n = tl.minimum(tl.maximum(sizes[i] - rel, 0), SUB).to(tl.int32)
                _bulk_prefetch(base_ptr + offs[i] + rel, n)
        pdl_wait(PDL)


def l2_prefetch(tensors, max_bytes: int | None = None) -> None:
    """Ask L2 for the bytes of `tensors` (up to `_MAX_TENSORS` contiguous CUDA tensors, None
    entries skipped; at most `max_bytes` in all, the first ones first): one launch, which
    returns at once (the bytes arrive while the next kernels run). Changes no value (module
    doc). A no-op on the CPU, under the interpreter and before sm_90."""
    ts = [t for t in tensors if t is not None]
    if len(ts) > _MAX_TENSORS:
        raise ValueError(f"l2_prefetch: {len(ts)} tensors; allowed: at most {_MAX_TENSORS}")
    if not HAVE_TRITON or interpreting() or not ts:
        return None
    dev = ts[0].device
    if dev.type != "cuda" or torch.cuda.get_device_capability(dev)[0] < 9:
        return None
    spans = prefetch_plan(ts, max_bytes)
    if not spans:
        return None
    base = ts[0].view(-1).view(torch.uint8)  # byte addressing
    b0 = base.data_ptr()
    starts = [0]
    for _, n in spans:
        starts.append(starts[-1] + -(-n // _CHUNK))
    offs = tuple(a - b0 for a, _ in spans)
    _l2_prefetch_kernel[(starts[-1],)](
        base, offs, tuple(n for _, n in spans), tuple(starts), CHUNK=_CHUNK, num_warps=1, **pdl_launch(base)
    )
    return None
