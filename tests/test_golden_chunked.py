"""A golden file's prefill run in chunks (the first from position 0, the others as
continuations), reassembled in the one-shot encoding and compared with the file's
prefill by the same rules; then its decode steps. The intended variant (own index keys)
passes at every chunk size; the released variant only where every chunk completes a
group of each Full layer (attention-v41.md §9: otherwise the layer scores another
layer's keys, as the released decode does)."""

import pytest

from attnv41.cli import main
from attnv41.golden import IMPLS, GoldenFile, replay
from helpers import golden_path

CASES = [
    ("tiny", "runtime", 1),
    ("tiny", "runtime", 3),
    ("tiny", "runtime", 8),
    ("tiny", "runtime", 13),
    ("tiny", "reference", 4),
    ("headdim", "runtime", 50),
    ("headdim", "runtime", 128),
    ("fp8", "runtime", 64),
]


@pytest.mark.parametrize("name, impl, chunk", CASES, ids=[f"{n}-{i}-{c}" for n, i, c in CASES])
def test_chunked_prefill_passes_the_golden_file(name, impl, chunk):
    rep = replay(GoldenFile(golden_path(name)), "intended", IMPLS[impl], impl_name=impl, prefill_chunk=chunk)
    assert rep.n_compared > 0 and rep.n_skipped == 0
    assert rep.ok, "\n".join(rep.failures())


def test_released_variant_follows_the_flaw_when_a_chunk_completes_no_group():
    """13 tokens in chunks of 3: the last chunk (position 12) completes no ratio-2 group,
    so released L1 scores L3's keys: the file's one-shot prefill is not what it gives.
    In chunks of 5 every chunk completes a group: it passes."""
    g = GoldenFile(golden_path("tiny"))
    ok = replay(g, "released", IMPLS["runtime"], impl_name="runtime", prefill_chunk=5)
    assert ok.ok, "\n".join(ok.failures())
    bad = replay(g, "released", IMPLS["runtime"], impl_name="runtime", prefill_chunk=3)
    assert not bad.ok
    assert {f.split(":")[0] for f in bad.failures()} == {"prefill L1"}


def test_check_cli_prefill_chunk(capsys):
    assert main(["check", "--impl", "runtime", "--prefill-chunk", "4", "--golden", str(golden_path("tiny"))]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "prefill in chunks of 4" in out and "variants intended" in out
    assert main(["check", "--prefill-chunk", "0"]) == 2
    assert "--prefill-chunk 0; allowed: >= 1" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, chunk",
    [
        ("tiny", 3),
        pytest.param("headdim", 50, marks=pytest.mark.gpu_full),
        pytest.param("headdim", 200, marks=pytest.mark.gpu_full),
    ],
)
def test_chunked_prefill_passes_the_golden_file_on_cuda(name, chunk):
    """The continuation path's kernels on CUDA (the decode attention over context rows,
    the compressor from a group in progress) against the external oracle."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    rep = replay(
        GoldenFile(golden_path(name)),
        "intended",
        IMPLS["runtime"],
        device="cuda",
        impl_name="runtime",
        prefill_chunk=chunk,
    )
    assert rep.n_compared > 0 and rep.n_skipped == 0
    assert rep.ok, "\n".join(rep.failures())
