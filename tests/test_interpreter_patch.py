"""The CPU interpreter's patch (`tests/interp_patch.py`, applied by `conftest.py`): a
launch patches `triton.language` once per module, not once per helper call per program,
computes what it computed before, and restores the language when it ends."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's CPU interpreter only (no CUDA)"
)

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter as interp  # noqa: E402

import interp_patch  # noqa: E402


@triton.jit
def _twice(v):
    return v * 2


@triton.jit
def _add_pair(a, b):
    return a + b


@triton.jit
def _helpers_kernel(x_ptr, out_ptr, N: tl.constexpr):
    pid = tl.program_id(0)
    v = tl.load(x_ptr + pid * N + tl.arange(0, N))
    for _ in range(3):  # helpers called several times per program
        v = _twice(v) - v
    w = _twice(v)
    total = tl.sum(w, axis=0)  # triton.language's own jit helpers (tl.core in their globals)
    top = tl.max(w, axis=0)
    red = tl.reduce(w, 0, _add_pair)
    tl.store(out_ptr + pid * 3 + tl.arange(0, 2), tl.where(tl.arange(0, 2) == 0, total, top))
    tl.store(out_ptr + pid * 3 + 2, red)


def _run(programs: int, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(-50, 50, (programs, n), dtype=torch.int32, generator=torch.Generator().manual_seed(programs))
    out = torch.empty(programs, 3, dtype=torch.int32)
    _helpers_kernel[(programs,)](x, out, N=n)
    return x, out


def test_patch_is_applied():
    missing = [h for h in interp_patch.HOOKS if not hasattr(interp, h)]
    assert not missing, f"Triton {triton.__version__}'s interpreter lacks {missing}: update tests/interp_patch.py"
    assert interp_patch.applied and interp_patch.apply(), "conftest.py did not apply the patch"
    once = interp._patch_lang
    assert once.__name__ == "once" and interp.GridExecutor.__call__.__name__ == "launch"
    wrapped = [c.cell_contents for c in once.__closure__ if callable(c.cell_contents)]
    assert [f.__name__ for f in wrapped] == ["_patch_lang"], "patched twice (one wrapper around another)"


@pytest.mark.parametrize("programs", [1, 5])
def test_launch_with_helpers_computes_the_same(programs):
    x, out = _run(programs)
    w = x.long() * 2
    want = torch.stack([w.sum(1), w.amax(1), w.sum(1)], 1).to(torch.int32)
    assert torch.equal(out, want)
    assert tl.core.is_builtin(tl.arange) and tl.core.is_builtin(tl.load), "the launch left the language patched"


def test_language_patched_once_per_module_not_per_call(monkeypatch):
    calls = []
    walk = interp._patch_builtin
    monkeypatch.setattr(interp, "_patch_builtin", lambda pkg, *a: (calls.append(pkg), walk(pkg, *a))[1])
    _run(1)  # the first launch ever patches less (later ones also walk modules left patched)
    counts = []
    for programs in (1, 6):
        calls.clear()
        _run(programs)
        counts.append(len(calls))
    # every program calls this module's helpers and triton.language's own: without the
    # patch each call walks the language again (Triton 3.6: 29 walks at 1 program, 172 at 6)
    assert counts[0] == counts[1] and 1 <= counts[0] <= 12, counts
