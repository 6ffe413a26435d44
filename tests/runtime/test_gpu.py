"""GPU tests (marked `gpu`, skipped without CUDA; run on the device machine).

Writes a JSON summary to `$ATTNV41_REPORT_DIR` when set."""

import json
import os
import time

import pytest

from attnv41.config import v41_flash
from attnv41.golden import GoldenFile, TraceRecorder, reference_impl, replay, runtime_impl
from attnv41.reference.layer import RefStack
from attnv41.runtime import RuntimeStack
from helpers import golden_path, random_inputs, random_weights

pytestmark = pytest.mark.gpu


def _save(name: str, data: dict) -> None:
    d = os.environ.get("ATTNV41_REPORT_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{name}.json"), "w") as f:
            json.dump(data, f, indent=1)


@pytest.mark.parametrize("impl", ["runtime", "reference"])
@pytest.mark.parametrize("variant", ["released", "intended"])
@pytest.mark.parametrize("name", ["tiny", "headdim"])
def test_golden_on_cuda(name, variant, impl):
    make = runtime_impl if impl == "runtime" else reference_impl
    rep = replay(GoldenFile(golden_path(name)), variant, make, device="cuda", impl_name=impl)
    _save(f"golden_{name}_{variant}_{impl}", {"ok": rep.ok, "worst": rep.worst(), "failures": rep.failures()})
    assert rep.n_compared > 0 and rep.n_skipped == 0
    assert rep.ok, "\n".join(rep.failures())


def test_flash_stack_runtime_vs_reference():
    """V4.1-Flash geometry (dim 5120, 64×512 heads, the 40-layer schedule), deterministic
    random weights scaled so activations are O(1), a 1,000-token prefill and 300 decode
    steps: the runtime (Triton + cuBLAS) against the reference, both on the GPU."""
    n, steps = 1000, 300
    cfg = v41_flash(max_tokens=1024, max_seq=n + steps + 8)
    w = random_weights(cfg, 4101, device="cuda")
    ref = RefStack(cfg, w, device="cuda")
    rt = RuntimeStack(cfg, w, device="cuda")
    rec = TraceRecorder(cfg)
    t0 = time.perf_counter()
    xs = random_inputs(cfg, n, 4102, device="cuda")
    for i in range(cfg.n_layers):
        rec.add(i, 0, n, ref.layer(i, xs[i], 0), rt.layer(i, xs[i], 0))
    for p in range(n, n + steps):
        xs = random_inputs(cfg, 1, 5000 + p, device="cuda")
        for i in range(cfg.n_layers):
            rec.add(i, p, 1, ref.layer(i, xs[i], p), rt.layer(i, xs[i], p))
    rep = rec.report
    excused = sum(c.excused for lr in rep.layers for c in lr.cmps)
    summary = {
        "ok": rep.ok,
        "worst": rep.worst(),
        "compared": rep.n_compared,
        "excused": excused,
        "failures": rep.failures()[:20],
        "seconds": time.perf_counter() - t0,
    }
    _save("flash_stack", summary)
    print("flash stack worst |err|/tol:", {k: round(v, 3) for k, v in rep.worst().items()}, "excused", excused)
    assert rep.ok, "\n".join(rep.failures()[:20])
