"""Kernel tests: on CUDA when present, else on Triton's CPU interpreter (tests/conftest.py
sets TRITON_INTERPRET=1 before anything imports triton). Skipped when Triton is absent."""

import os

import pytest
import torch

try:
    import triton  # noqa: F401
except ImportError:
    if os.environ.get("CI"):  # CI installs Triton: its absence there is a broken setup, not a skip
        raise
    pytest.skip("Triton is not installed", allow_module_level=True)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device():
    return DEVICE
