"""Suite-wide setup: TRITON_INTERPRET without a GPU, the CI hypothesis profile, skipping `gpu` tests without CUDA."""

from __future__ import annotations

import os

import pytest
import torch

# Kernel tests run on CUDA when present, else on Triton's CPU interpreter. The variable
# must be set before any kernel module is imported (triton.jit reads it then).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import settings  # noqa: E402

INTERPRETER_HOOKS = ("_patch_lang", "_LangPatchScope", "GridExecutor", "InterpretedFunction")


def _patch_interpreter_once_per_launch() -> bool:
    """Triton's CPU interpreter re-patches `triton.language` (an `inspect.getmembers` walk
    over the language's modules) on every call of a `@triton.jit` helper inside a kernel,
    once per call per program: a third of a GEMV test's time (cProfile, Triton 3.6). The
    repeats do nothing new: a launch patches the kernel module's language modules first and
    restores them when it ends, and a helper's repeat sets the same stateless replacements
    again (already-patched members are no longer builtins, so most are skipped) and is never
    restored. Here a helper's call patches only language modules this launch has not patched
    yet, so each launch patches each module once; what every call computes is unchanged.
    Returns False, changing nothing, where the interpreter lacks the hooks this relies on
    (`tests/test_interpreter_patch.py` then fails, naming them)."""
    import inspect

    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    if not all(hasattr(interp, h) for h in INTERPRETER_HOOKS):
        return False
    patch_lang, grid_call = interp._patch_lang, interp.GridExecutor.__call__
    patched: list[set] = []  # per running launch: ids of the language modules patched

    def once(fn):
        mods = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}
        if patched and mods <= patched[-1]:
            return interp._LangPatchScope()  # nothing new to patch, nothing to restore
        scope = patch_lang(fn)
        if patched:
            patched[-1] |= mods
        return scope

    def launch(self, *args, **kwargs):
        patched.append(set())
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    interp._patch_lang = once
    interp.GridExecutor.__call__ = launch
    return True


INTERPRETER_PATCHED = os.environ.get("TRITON_INTERPRET") == "1" and _patch_interpreter_once_per_launch()

# Under pytest-xdist (`bin/test -n auto --dist loadfile`, what CI runs) each worker computes
# on one thread: the workers share the machine's cores instead of oversubscribing them.
if os.environ.get("PYTEST_XDIST_WORKER"):
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
