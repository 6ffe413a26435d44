"""Kernel tests: on CUDA when present, else on Triton's CPU interpreter (tests/conftest.py
sets TRITON_INTERPRET=1 before anything imports triton). Skipped when Triton is absent."""

import os
from pathlib import Path

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


def pytest_collection_modifyitems(config, items):
    """On CUDA these tests run on the GPU: marked `gpu` there, so that the GPU tiers
    (`-m "gpu and not gpu_full"`, `-m gpu`) include every kernel. Not the offline sm_90
    compile tests (`test_*_sass.py`): they use no GPU and run wherever Triton is (CI)."""
    if DEVICE != "cuda":
        return
    here = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath))
        # the *_sass.py tests compile for sm_90 offline (no GPU used): CI runs them, the GPU tiers need not
        if path.is_relative_to(here) and not path.name.endswith("_sass.py"):
            item.add_marker(pytest.mark.gpu)
