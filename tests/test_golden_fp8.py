"""The reference against `v41_fp8` (FP8 weights, the released checkpoint path; golden
README section v41_fp8): both variants replayed through `attnv41 check`'s code, the
file's aliases and reduced storage, and that the bf16 math cannot pass it."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from attnv41.cli import main
from attnv41.compare import KINDS
from attnv41.golden import IMPLS, GoldenFile, GoldenFormatError, reference_impl, replay, runtime_impl
from attnv41.reference.fp8 import dequant_weight
from attnv41.reference.layer import RefStack, project
from helpers import golden_dir

_cache: dict = {}


def _path():
    p = golden_dir() / "v41_fp8.safetensors"
    if not p.is_file():
        pytest.skip(f"golden file {p} not found (set ATTNV41_GOLDEN_DIR to the folder holding v41_fp8.safetensors)")
    return p


def _report(variant):
    if variant not in _cache:
        _cache[variant] = replay(GoldenFile(_path()), variant)
    return _cache[variant]


@pytest.mark.parametrize("variant", ["released", "intended"])
def test_reference_matches_fp8_golden(variant):
    rep = _report(variant)
    g = GoldenFile(_path())
    assert g.weights_dtype == "fp8"
    assert rep.n_compared > 0
    assert rep.n_failed == 0, "\n".join(rep.failures())
    assert rep.ok, "\n".join(rep.failures())
    assert len(rep.layers) == len(g.regimes) * g.cfg.n_layers
    assert rep.n_skipped == 0
    compared = {c.name for lr in rep.layers for c in lr.cmps}
    assert compared == set(KINDS), f"kinds never compared: {set(KINDS) - compared}"


def test_cli_check_passes(capsys):
    rc = main(["check", "--golden", str(_path()), "--impl", "reference", "--variant", "both"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "PASS" in out and " 0 failed" in out


def _dequantized_impl(cfg, weights, index_keys, device):
    """The reference with every FP8 weight dequantized: plain bf16 GEMMs on raw activations."""
    plain = []
    for w in weights:
        w = dict(w)
        for k in [k for k in w if k.endswith(".scale")]:
            base = k.removesuffix(".scale")
            w[f"{base}.weight"] = dequant_weight(w[f"{base}.weight"], w.pop(k))
        plain.append(w)
    return RefStack(cfg, plain, device=device, index_keys=index_keys)


_dequantized_impl.weights_dtypes = ("bf16", "fp8")


def test_bf16_math_fails_the_fp8_file():
    """README: a plain bf16 GEMM with the dequantized weights is not this math (≈6.5 % RMS at L0)."""
    rep = replay(GoldenFile(_path()), "released", _dequantized_impl, impl_name="dequantized")
    assert rep.n_failed > 0
    assert any(
        lr.layer == 0 and lr.regime == "prefill" and not c.ok and c.name == "q" for lr in rep.layers for c in lr.cmps
    )


@pytest.mark.parametrize("variant", ["released", "intended"])
@pytest.mark.parametrize("impl", ["runtime", "runtime-split"])
def test_runtime_matches_fp8_golden(impl, variant):
    """The CPU runtime runs the FP8 weights the released way (ops.fp8_mm): forward and the
    split decode step both pass the file."""
    g = GoldenFile(_path())
    rep = replay(g, variant, IMPLS[impl], impl_name=impl)
    assert rep.n_compared > 0
    assert rep.n_failed == 0, "\n".join(rep.failures())
    assert rep.ok, "\n".join(rep.failures())
    assert rep.nonfinite == 0
    if impl == "runtime":
        assert rep.n_skipped == 0


@pytest.mark.parametrize("decode", ["forward", "split"])
def test_cli_check_runtime_passes(decode, capsys):
    argv = ["check", "--golden", str(_path()), "--impl", "runtime", "--variant", "both", "--decode", decode]
    rc = main(argv)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "PASS" in out and " 0 failed" in out


def test_weight_aliases_and_dtypes():
    g = GoldenFile(_path())
    w0, w1, w3, w5 = (g.weights(i) for i in (0, 1, 3, 5))
    for name in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b"):
        assert w3[f"{name}.weight"].dtype == torch.float8_e4m3fn
        assert w3[f"{name}.scale"].dtype == torch.float8_e8m0fnu
        assert torch.equal(w3[f"{name}.weight"].view(torch.uint8), w0[f"{name}.weight"].view(torch.uint8)), name
    for w in (w3, w5):
        assert torch.equal(w["indexer.wq_b.weight"].view(torch.uint8), w1["indexer.wq_b.weight"].view(torch.uint8))
        assert torch.equal(w["indexer.wq_b.scale"].view(torch.uint8), w1["indexer.wq_b.scale"].view(torch.uint8))
    assert torch.equal(w3["compressor.wkv.weight"], w1["compressor.wkv.weight"])
    assert not torch.equal(w3["q_norm.weight"], w0["q_norm.weight"]), "norms are drawn per layer"
    # scales decode to powers of two with the stored shape [out/32, in/32]
    assert tuple(w0["wq_b.scale"].shape) == (w0["wq_b.weight"].shape[0] // 32, w0["wq_b.weight"].shape[1] // 32)


def test_reduced_storage_is_derived_as_the_readme_says():
    g = GoldenFile(_path())
    rows = g.prefill_rows
    assert rows.tolist() == [0, 33, 127, 128, 160]
    assert torch.equal(g.kv_win_rows("prefill", rows), rows)
    assert g.kv_win_rows("decode163", rows).tolist() == [163 % g.cfg.window]
    sel1 = g.get("released", "prefill", 1, "sel")
    assert torch.equal(g.get("released", "prefill", 2, "sel"), sel1)
    assert torch.equal(g.get("released", "prefill", 0, "sel"), sel1[:, :128])
    assert torch.equal(g.get("released", "prefill", 4, "sel"), g.get("released", "prefill", 3, "sel"))
    last = g.get("released", "decode164", 3, "compress_kv")
    assert torch.equal(g.get("released", "decode162", 3, "compress_kv"), last[:163])
    assert g.get("released", "prefill", 1, "index_k").shape[0] == 161 // 2


def _edited_copy(tmp_path, edit) -> str:
    with safe_open(str(_path()), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(tensors)
    p = tmp_path / "fp8_edited.safetensors"
    save_file(tensors, str(p), metadata=meta)
    return str(p)


@pytest.mark.parametrize(
    "key", ["released/decode163/L0/kv_win", "released/prefill/L2/kv_win"], ids=["decode_slot", "prefill"]
)
def test_reduced_kv_win_is_checked_on_its_rows(tmp_path, key):
    """A stored kv_win row whose largest element is doubled (more than one fp8 step) fails:
    the reduced rows are compared against the matching rows of ours."""

    def edit(t):
        row = 0 if "decode" in key else 2  # prefill row index 2 of rows/prefill = chunk row 127
        v = t[key].clone()
        j = int(v[row].float().abs().argmax())
        v[row, j] = v[row, j] * 2
        t[key] = v

    rep = replay(GoldenFile(_edited_copy(tmp_path, edit)), "released")
    bad = [(lr.regime, lr.layer, c.name) for lr in rep.layers for c in lr.cmps if not c.ok]
    parts = key.split("/")
    assert (parts[1], int(parts[2][1:]), "kv_win") in bad, bad


def test_fp8_weight_records_are_checked():
    w = {"wq_a.weight": torch.ones(32, 64).to(torch.float8_e4m3fn)}
    with pytest.raises(ValueError, match="wq_a.weight is float8_e4m3fn without wq_a.scale"):
        project(w, "wq_a", torch.ones(1, 64, dtype=torch.bfloat16))
    w2 = {"indexer.wk.weight": torch.ones(32, 64).bfloat16(), "indexer.wk.scale": torch.zeros(1, 2, dtype=torch.uint8)}
    with pytest.raises(ValueError, match=r"indexer.wk.scale given; allowed"):
        project(w2, "indexer.wk", torch.ones(1, 64, dtype=torch.bfloat16))
    g = GoldenFile(_path())
    ws = [g.weights(i) for i in range(g.cfg.n_layers)]
    ws[2] = dict(ws[2], **{"kv_norm.scale": torch.zeros(1, dtype=torch.uint8)})
    with pytest.raises(ValueError, match=r"layer 2: weight 'kv_norm.scale'; allowed scales"):
        RefStack(g.cfg, ws)


def test_impl_without_fp8_refuses_fp8_file():
    """An implementation that does not declare "fp8" in `weights_dtypes` is refused."""

    def bf16_only(cfg, weights, index_keys, device):
        return RefStack(cfg, weights, device=device, index_keys=index_keys)

    with pytest.raises(GoldenFormatError, match=r"weights_dtype = 'fp8', which impl 'bf16-only' does not run"):
        replay(GoldenFile(_path()), "released", bf16_only, impl_name="bf16-only")
    assert "fp8" in reference_impl.weights_dtypes and "fp8" in runtime_impl.weights_dtypes
