"""The reference against DeepSeek's released outputs: both golden files, both variants,
every regime and layer, through the same comparison code as `attnv41 check`."""

import pytest

from attnv41.golden import GoldenFile, bundled_golden_path, replay
from helpers import golden_path

_cache: dict = {}


def _report(name, variant):
    key = (name, variant)
    if key not in _cache:
        _cache[key] = replay(GoldenFile(golden_path(name)), variant)
    return _cache[key]


@pytest.mark.parametrize("variant", ["released", "intended"])
@pytest.mark.parametrize("name", ["tiny", "headdim"])
def test_reference_matches_golden(name, variant):
    rep = _report(name, variant)
    assert rep.n_compared > 0
    assert rep.ok, "\n".join(rep.failures())
    # every layer of every regime was compared, nothing listed by the README was absent
    g = GoldenFile(golden_path(name))
    assert len(rep.layers) == len(g.regimes) * g.cfg.n_layers
    assert rep.n_skipped == 0


@pytest.mark.parametrize("name", ["tiny"])
def test_tiny_is_bit_exact(name):
    """On the tiny file the reference reproduces every stored tensor bit for bit."""
    for variant in ("released", "intended"):
        rep = _report(name, variant)
        worst = rep.worst()
        assert all(v == 0.0 for v in worst.values()), worst
        assert not any(c.excused for lr in rep.layers for c in lr.cmps)


def test_variants_differ_where_the_flaw_bites():
    """Released: a ratio-2 Full layer at an even decode position scores against L3's keys."""
    g = GoldenFile(golden_path("tiny"))
    assert g.get("released", "decode14", 1, "index_k_owner").item() == 3
    assert g.get("intended", "decode14", 1, "index_k_owner").item() == 1
    from attnv41.reference.layer import RefStack

    for mode, owner in (("released", 3), ("own", 1)):
        stack = RefStack(g.cfg, [g.weights(i) for i in range(6)], index_keys=mode)
        for reg in g.regimes[:3]:  # prefill, decode13, decode14
            traces = [stack.layer(i, g.get("released", reg["name"], i, "x"), reg["start_pos"]) for i in range(6)]
        assert traces[1].index_k_owner == owner


def test_bundled_copy_equals_shared_tiny():
    assert bundled_golden_path().read_bytes() == golden_path("tiny").read_bytes()
