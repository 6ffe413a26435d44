"""Triton import guard: `HAVE_TRITON`, and `triton`/`tl` (None without Triton)."""

from __future__ import annotations

import os

try:  # Triton is optional: the package and its CPU paths work without it.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None
    tl = None
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "triton", "tl", "interpreting", "require_triton"]


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
