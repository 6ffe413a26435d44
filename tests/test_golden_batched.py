"""`attnv41 check --batch N [--prefill-chunk C]`: the golden sequence in one slot of
batched steps (BatchV41 over paged caches) beside N − 1 random sequences at other
positions and lengths passes the golden rules, and its bytes equal the batch-1 run."""

import pytest
import torch

from attnv41.cli import main
from attnv41.golden import GoldenFile, replay_batched
from attnv41.runtime.batch import BatchV41
from helpers import golden_path

CASES = [("tiny", 8, 64), ("tiny", 5, 3), ("headdim", 8, 64), ("headdim", 3, None), ("fp8", 8, 64)]


@pytest.mark.parametrize("name, batch, chunk", CASES, ids=[f"{n}-b{b}-c{c}" for n, b, c in CASES])
def test_batched_golden_passes_and_is_batch_invariant(name, batch, chunk):
    rep, n, bad = replay_batched(GoldenFile(golden_path(name)), batch=batch, chunk=chunk, seed=batch)
    assert rep.n_compared > 0 and rep.n_skipped == 0
    assert rep.ok, "\n".join(rep.failures())
    assert n > 0 and not bad, bad[:5]


@pytest.mark.parametrize("name", ["tiny", "fp8"])
def test_batched_golden_with_packed_caches(name):
    """Packed caches in the batch: the golden rules, and the golden slot's bytes equal to
    the batch-1 run over bf16 caches."""
    rep, n, bad = replay_batched(GoldenFile(golden_path(name)), batch=4, chunk=64, seed=4, kv_format="packed")
    assert rep.n_compared > 0 and rep.n_skipped == 0
    assert rep.ok, "\n".join(rep.failures())
    assert n > 0 and not bad, bad[:5]


@pytest.mark.parametrize("name, batch", [("tiny", 5), ("headdim", 3)])
def test_batched_golden_released_variant(name, batch):
    """index_keys="released" in the batch: the golden file's released variant (DeepSeek's
    code, whose Full layers score another layer's keys on steps that complete no group)
    passes with the golden sequence among others, bytes equal to the batch-1 run."""
    rep, n, bad = replay_batched(GoldenFile(golden_path(name)), batch=batch, seed=batch, variant="released")
    assert rep.n_compared > 0 and rep.n_skipped == 0
    assert rep.ok, "\n".join(rep.failures())
    assert n > 0 and not bad, bad[:5]


def test_released_keys_are_what_the_released_variant_checks():
    """Not vacuous: the batched runtime with own keys fails the released variant."""
    from attnv41 import golden as G

    g = GoldenFile(golden_path("tiny"))
    orig = G.INDEX_KEYS_FOR_VARIANT["released"]
    try:
        G.INDEX_KEYS_FOR_VARIANT["released"] = "own"
        rep, _, _ = replay_batched(g, batch=3, seed=3, variant="released")
    finally:
        G.INDEX_KEYS_FOR_VARIANT["released"] = orig
    assert not rep.ok


def test_a_wrong_window_row_is_caught(monkeypatch):
    """The check is not vacuous: one window column pointing at the wrong row fails it."""
    orig = BatchV41._metadata

    def shifted(self, *a):
        st = orig(self, *a)
        w = st.win_sel
        st.win_sel = torch.where(w > 0, w - 1, w)
        return st

    monkeypatch.setattr(BatchV41, "_metadata", shifted)
    rep, _, _ = replay_batched(GoldenFile(golden_path("tiny")), batch=4, chunk=5)
    assert not rep.ok


def test_check_cli_batch(capsys):
    assert main(["check", "--batch", "4", "--prefill-chunk", "5", "--golden", str(golden_path("tiny"))]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "batch 4, prefill in chunks of 5" in out and "0 differ" in out
    assert main(["check", "--batch", "0"]) == 2
    assert "--batch 0; allowed: 1.." in capsys.readouterr().err
    g = str(golden_path("tiny"))
    assert main(["check", "--batch", "100000", "--golden", g]) == 2  # more sequences than a step holds
    assert "--batch 100000; allowed: 1.." in capsys.readouterr().err
    assert main(["check", "--batch", "2", "--decode", "split", "--golden", g]) == 2
    assert "--decode split with --batch; allowed: --decode forward" in capsys.readouterr().err
    assert main(["check", "--batch", "2", "--golden", str(golden_path("tiny"))]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "variants released, intended, batched runtime, batch 2" in out and "0 differ" in out
    assert main(["check", "--kv-format", "packed", "--impl", "reference"]) == 2
    assert "--kv-format packed needs --impl runtime (or --batch)" in capsys.readouterr().err
    g = str(golden_path("tiny"))
    assert main(["check", "--batch", "3", "--kv-format", "packed", "--golden", g]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "batch 3, packed caches" in out and "(bf16 caches), 0 differ" in out


# The quick GPU tier keeps tiny (both cache formats) and fp8 with bf16 caches; headdim and
# fp8 with packed caches (30-70 s each on a fresh machine, 2026-12-03) run in the full tier.
_CUDA_CASES = [
    pytest.param(n, f, marks=[] if n == "tiny" or (n, f) == ("fp8", "bf16") else [pytest.mark.gpu_full], id=f"{n}-{f}")
    for n in ("tiny", "headdim", "fp8")
    for f in ("bf16", "packed")
]


@pytest.mark.gpu
@pytest.mark.parametrize("name, kv_format", _CUDA_CASES)
def test_batched_golden_on_cuda(name, kv_format):
    """On CUDA the golden rules hold and the golden slot's bytes equal the batch-1 run's
    (the batched runtime's kernels are batch-invariant: `ops.TRITON_BATCH_OPS`), with
    bf16 caches and with packed ones (against the batch-1 run's bf16 caches)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    rep, n, bad = replay_batched(GoldenFile(golden_path(name)), device="cuda", batch=8, chunk=64, kv_format=kv_format)
    print(f"{name} {kv_format}: batch invariance on CUDA: {n} traced tensors, {len(bad)} differ from the batch-1 run")
    assert rep.n_compared > 0 and rep.n_skipped == 0
    assert rep.ok, "\n".join(rep.failures())
    assert n > 0 and not bad, bad[:5]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny", "fp8"])
def test_batched_golden_released_on_cuda(name):
    """The released variant through the batched runtime on CUDA (one scoring launch per
    key owner in a step): the golden rules, bytes equal to the batch-1 run."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    rep, n, bad = replay_batched(GoldenFile(golden_path(name)), device="cuda", batch=6, seed=6, variant="released")
    assert rep.n_compared > 0 and rep.n_skipped == 0
    assert rep.ok, "\n".join(rep.failures())
    assert n > 0 and not bad, bad[:5]


@pytest.mark.gpu
def test_batched_fp8_golden_through_the_gluon_fp8_product(monkeypatch):
    """`tc_mm.FP8_GLUON` on (the development switch: the FP8 linears through the Gluon
    product, `kernels/tc_fp8.py`): the FP8 golden file through the batched runtime on CUDA
    passes the golden rules and the golden slot's bytes equal the batch-1 run (the switched
    kernels are batch-invariant too)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    from attnv41.kernels import tc_mm

    monkeypatch.setattr(tc_mm, "FP8_GLUON", {})
    rep, n, bad = replay_batched(GoldenFile(golden_path("fp8")), device="cuda", batch=8, chunk=64)
    assert rep.n_compared > 0 and rep.n_skipped == 0
    assert rep.ok, "\n".join(rep.failures())
    assert n > 0 and not bad, bad[:5]
