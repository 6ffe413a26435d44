"""Suite-wide setup: TRITON_INTERPRET without a GPU, the CI hypothesis profile, skipping `gpu` tests without CUDA."""

from __future__ import annotations

import os

# Under pytest-xdist (`bin/test -n auto --dist loadfile`, what CI runs) each worker computes
# on one thread: the workers share the machine's cores instead of oversubscribing them.
# numpy's OpenBLAS (the interpreter's dots) reads its thread count when loaded, which
# importing torch does: so before that import.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# Kernel tests run on CUDA when present, else on Triton's CPU interpreter. The variable
# must be set before any kernel module is imported (triton.jit reads it then).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import settings  # noqa: E402

# Triton's interpreter re-walks triton.language at every helper call: once per launch here
# (`tests/interp_patch.py`: what each call computes is unchanged).
if os.environ.get("TRITON_INTERPRET") == "1":
    import interp_patch  # noqa: E402  (tests/ is on the path: pyproject's `pythonpath`)

    interp_patch.apply()

if os.environ.get("PYTEST_XDIST_WORKER"):  # (torch's own threads: see the top)
    torch.set_num_threads(1)

# CI runs a fixed set of examples (derandomized) so that a red run is reproducible;
# local runs explore fresh examples each time.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need CUDA: skipped, with the reason, where there is none."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
