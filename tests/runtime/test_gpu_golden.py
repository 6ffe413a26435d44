"""GPU tests of the golden files (marked `gpu`, skipped without CUDA; run on the device
machine; the quick tier): the runtime (forward and the decode split) and the reference on
CUDA against the golden files, and the files' inputs through the runtime with every layer
call stage-checked. Apart from tests/runtime/test_gpu.py (the Flash-geometry runs) so that
pytest-xdist's per-file distribution runs the two in different workers.

Adds to `$ATTNV41_REPORT_DIR/gpu_report.json` when set (`helpers.save_gpu_report`)."""

import pytest

from attnv41.golden import IMPLS, INDEX_KEYS_FOR_VARIANT, GoldenFile, replay
from helpers import golden_path, save_gpu_report, stage_run

pytestmark = pytest.mark.gpu


# The reference on CUDA over the headdim file (about 70 s per variant on a fresh machine,
# 2026-12-03) runs in the full tier only; the quick tier keeps it on tiny.
_GOLDEN_CASES = [
    pytest.param(n, v, i, marks=[pytest.mark.gpu_full] if (n, i) == ("headdim", "reference") else [], id=f"{n}-{v}-{i}")
    for n in ("tiny", "headdim")
    for v in ("released", "intended")
    for i in ("runtime", "runtime-split", "reference")
]


@pytest.mark.parametrize("name, variant, impl", _GOLDEN_CASES)
def test_golden_on_cuda(name, variant, impl):
    """Runtime (forward, and the decode split with CUDA graphs) and reference on CUDA
    against the golden files. The split path's captured layers expose only out and ring:
    their q, o and sel count as skipped."""
    rep = replay(GoldenFile(golden_path(name)), variant, IMPLS[impl], device="cuda", impl_name=impl)
    save_gpu_report(
        f"golden_{name}_{variant}_{impl}",
        {"ok": rep.ok, "compared": rep.n_compared, "skipped": rep.n_skipped, "worst": rep.worst()}
        | {"failures": rep.failures()},
    )
    assert rep.n_compared > 0
    if impl != "runtime-split":
        assert rep.n_skipped == 0
    assert rep.ok, "\n".join(rep.failures())


@pytest.mark.parametrize("variant", ["released", "intended"])
@pytest.mark.parametrize("name", ["tiny", pytest.param("headdim", marks=pytest.mark.gpu_full)])
def test_golden_inputs_stage_checked(name, variant):
    """The golden files' inputs through the runtime on CUDA; every o and out value
    compared with the reference stage on our own inputs, nothing excused."""
    g = GoldenFile(golden_path(name))
    weights = [{k: v.cuda() for k, v in g.weights(i).items()} for i in range(g.cfg.n_layers)]
    inputs = [
        (int(r["start_pos"]), [g.get(variant, r["name"], i, "x").cuda() for i in range(g.cfg.n_layers)])
        for r in g.regimes
    ]
    tally = stage_run(g.cfg, weights, inputs, index_keys=INDEX_KEYS_FOR_VARIANT[variant])
    save_gpu_report(f"stages_golden_{name}_{variant}", tally.summary())
    assert tally.ok, "\n".join(tally.failures[:20])
    assert sum(tally.excused.values()) == 0 and all(v > 0 for v in tally.values.values()), tally.summary()
