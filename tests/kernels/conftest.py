"""Kernel tests run on CUDA when present, else on Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is imported, so this conftest sets it when
no GPU is visible (unless the caller already chose)."""

import os

import pytest

try:
    import torch

    _cuda = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _cuda = False
if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton", reason="Triton is not installed")

DEVICE = "cuda" if _cuda else "cpu"


@pytest.fixture
def device():
    return DEVICE
