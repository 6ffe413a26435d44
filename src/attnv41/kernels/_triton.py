"""Triton import guard: `HAVE_TRITON`, and `triton`/`tl` (None without Triton)."""

from __future__ import annotations

import os

import torch

try:  # Triton is optional: the package and its CPU paths work without it.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None
    tl = None
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "triton", "tl", "interpreting", "require_triton", "bf16_out_like"]


def interpreting() -> bool:
    """Whether Triton runs kernels on the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def require_triton(op: str, *tensors) -> None:
    """Raise a clear error unless a Triton launch of `op` on these tensors can run."""
    if not HAVE_TRITON:
        raise RuntimeError(f"{op}: Triton is not installed")
    for t in tensors:
        if t.device.type != "cuda" and not interpreting():
            raise RuntimeError(f"{op}: tensor on {t.device}; allowed: a CUDA tensor, or set TRITON_INTERPRET=1")


def bf16_out_like(x, out):
    """`out` checked to fit x (shape, bf16, device, contiguous last dim), or a new tensor
    like x when None. ValueError names the field and the allowed value."""
    if out is None:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"out = {type(out).__name__}; allowed: None or a torch.Tensor")
    if tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out.shape = {tuple(out.shape)}; allowed: {tuple(x.shape)} (the shape of x)")
    if out.dtype != torch.bfloat16:
        raise ValueError(f"out.dtype = {out.dtype}; allowed: torch.bfloat16")
    if out.device != x.device:
        raise ValueError(f"out.device = {out.device}; allowed: {x.device} (the device of x)")
    if out.shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(f"out.stride(-1) = {out.stride(-1)}; allowed: 1 (contiguous last dim)")
    return out
