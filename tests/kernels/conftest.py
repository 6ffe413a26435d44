"""Kernel tests: on CUDA when present, else on Triton's CPU interpreter (tests/conftest.py
sets TRITON_INTERPRET=1 before anything imports triton). Skipped when Triton is absent."""

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device():
    return DEVICE
