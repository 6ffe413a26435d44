"""A test-side speed-up of Triton's CPU interpreter, applied by `conftest.py` under
`TRITON_INTERPRET=1` (CI: no GPU); nothing under `src/` uses it and CUDA runs never see it.

The interpreter re-patches `triton.language` (an `inspect.getmembers` walk over the
language's modules) at every call of a `@triton.jit` helper inside a kernel, once per call
per program: a third of a GEMV test's time (cProfile, Triton 3.6). The repeats do nothing
new: a launch patches the kernel module's language modules first and restores them when it
ends, and a helper's repeat sets the same stateless replacements again (already-patched
members are no longer builtins, so most are skipped) and is never restored. `apply` makes a
helper's call patch only language modules its launch has not patched yet, so each launch
patches each module once; what every call computes is unchanged
(`tests/test_interpreter_patch.py`)."""

from __future__ import annotations

import inspect

HOOKS = ("_patch_lang", "_LangPatchScope", "GridExecutor", "InterpretedFunction")
applied = False


def apply() -> bool:
    """Install the patch once per process (later calls do nothing); False, changing nothing,
    where Triton is missing or its interpreter lacks `HOOKS` (the test then names them)."""
    global applied
    if applied:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    if not all(hasattr(interp, h) for h in HOOKS):
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
    applied = True
    return True
