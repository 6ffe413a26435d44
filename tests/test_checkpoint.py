"""Checkpoint loading (attnv41.checkpoint) on small checkpoints written in the released
layout: the config round trip, fp8 dequantization bit for bit against an independent
decode of the shard bytes, every validation error naming its tensor, lazy one-tensor
reads, and a forward on the loaded weights."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from attnv41 import checkpoint as ckpt
from attnv41.checkpoint import (
    FP8_NAMES,
    CheckpointError,
    dequantize_fp8,
    load_layer,
    load_model,
    quantize_fp8,
    write_checkpoint,
)
from attnv41.config import AttnV41Cfg
from attnv41.runtime import RuntimeStack
from attnv41.weights import AttnV41LayerWeights, expected_tensors
from helpers import random_inputs, random_weights, small_cfg

SEED = 7


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    cfg = small_cfg()
    w = random_weights(cfg, SEED)
    root = write_checkpoint(tmp_path_factory.mktemp("ckpt") / "v41", cfg, w, shards=3, seed=SEED)
    return cfg, w, root


@pytest.fixture(scope="module")
def loaded(written):
    cfg, _, root = written
    return load_model(root, cfg=cfg, progress=False, weights="bf16")  # q_rank 16: FP8 cannot run it


# ---------------------------------------------------------------------------- independent decode
def _weight_map(root) -> dict[str, str]:
    return json.loads((root / ckpt.INDEX_FILE).read_text())["weight_map"]


def _raw(root, name: str) -> tuple[str, tuple[int, ...], bytes]:
    """(dtype code, shape, bytes) of one tensor, parsed from its shard file by hand."""
    data = (root / _weight_map(root)[name]).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    h = json.loads(data[8 : 8 + n])[name]
    b, e = h["data_offsets"]
    return h["dtype"], tuple(h["shape"]), data[8 + n + b : 8 + n + e]


def _e4m3_value(byte: int) -> float:
    """float8_e4m3fn by hand: sign, 4-bit exponent (bias 7), 3-bit mantissa, subnormals,
    S.1111.111 NaN, no infinities."""
    sign = -1.0 if byte >> 7 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 0x7
    if exp == 15 and man == 7:
        return float("nan")
    if exp == 0:
        return sign * (man / 8) * 2.0**-6
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


E4M3 = np.array([_e4m3_value(b) for b in range(256)], dtype=np.float64)


def _dequant_by_hand(q_bytes: np.ndarray, s_bytes: np.ndarray) -> np.ndarray:
    """float64 e4m3(q) · 2^(S − 127) per 32×32 block; exact."""
    out, inp = q_bytes.shape
    pow2 = np.ldexp(1.0, s_bytes.astype(np.int64) - 127)
    return E4M3[q_bytes] * np.repeat(np.repeat(pow2, 32, 0), 32, 1)[:out, :inp]


def _bf16_bits(exact: np.ndarray, what: str) -> np.ndarray:
    """The bf16 bit patterns of float64 values that bf16 holds exactly (asserted)."""
    f32 = exact.astype(np.float32)
    assert np.array_equal(f32.astype(np.float64), exact), f"{what}: not exact in fp32"
    bits = f32.view(np.uint32)
    assert not (bits & 0xFFFF).any(), f"{what}: not exact in bf16"
    return (bits >> 16).astype(np.uint16)


def _bits(t: torch.Tensor) -> np.ndarray:
    assert t.dtype == torch.bfloat16
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def _assert_layers_match_shards(cfg, w, root, layers):
    for i, lw in enumerate(layers):
        assert lw.role == cfg.roles[i]
        assert set(lw.state_dict()) == set(expected_tensors(cfg, cfg.roles[i])), f"layer {i} names"
        for rel, t in lw.state_dict().items():
            name = f"layers.{i}.{rel}"
            code, shape, data = _raw(root, name)
            assert tuple(t.shape) == shape, name
            if code == "F8_E4M3":
                scode, sshape, sdata = _raw(root, name.removesuffix(".weight") + ".scale")
                assert scode == "F8_E8M0", name
                q = np.frombuffer(data, np.uint8).reshape(shape)
                s = np.frombuffer(sdata, np.uint8).reshape(sshape)
                exact = _dequant_by_hand(q, s)
                mism = np.flatnonzero(_bits(t) != _bf16_bits(exact, name))
                assert mism.size == 0, f"{name}: {mism.size} elements differ from the hand decode, first {mism[0]}"
                # and the writer's quantization is sane: e4m3 keeps ~4 significant bits
                ref = w[i][rel.removeprefix("attn.")].double().numpy()
                err = np.abs(exact - ref).max() / np.abs(ref).max()
                assert err < 0.07, f"{name}: dequantized vs written weights, max rel err {err:.3g}"
            elif code == "BF16":
                disk = np.frombuffer(data, np.uint16).reshape(shape)
                got = _bits(t) if t.dtype == torch.bfloat16 else _bits(t.to(torch.bfloat16))
                if t.dtype == torch.float32:  # the ratio>=2 compressor, upcast exactly
                    assert torch.equal(t, t.to(torch.bfloat16).float()), name
                assert np.array_equal(got, disk), f"{name}: differs from the shard's bytes"
                written = w[i][rel.removeprefix("attn.")]
                assert torch.equal(t, written.to(torch.bfloat16).to(t.dtype)), f"{name}: differs from what was written"
            else:
                assert code == "F32" and t.dtype == torch.float32, name
                assert np.array_equal(t.numpy(), np.frombuffer(data, np.float32).reshape(shape)), name
                assert torch.equal(t, w[i][rel.removeprefix("attn.")]), name


# ---------------------------------------------------------------------------- layout and values
def test_layout_and_config_round_trip(written):
    cfg, _, root = written
    assert AttnV41Cfg.from_checkpoint(root, max_tokens=cfg.max_tokens, max_seq=cfg.max_seq) == cfg
    d = json.loads((root / "config.json").read_text())
    assert d["quantization_config"]["weight_block_size"] == [32, 32] and "quantization_config" not in d["text_config"]
    assert d["text_config"]["compress_ratios"] == list(cfg.compress_ratios) + [0, 0, 0]
    assert d["text_config"]["rope_scaling"]["rope_type"] == "yarn"
    wm = _weight_map(root)
    files = sorted(set(wm.values()))
    assert files == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert sorted(p.name for p in root.glob("*.safetensors")) == files
    index = json.loads((root / ckpt.INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == sum(len(_raw(root, n)[2]) for n in wm), (
        "metadata.total_size is the tensors' bytes"
    )
    layers_per_shard = [{n.split(".")[1] for n in wm if wm[n] == f} for f in files]
    assert all(len(s) >= 2 for s in layers_per_shard), layers_per_shard
    assert all(f"layers.{i}.attn_norm.weight" in wm for i in range(cfg.n_layers))
    assert _raw(root, "layers.1.attn.compressor.wkv.weight")[0] == "BF16"
    assert _raw(root, "layers.1.attn.indexer.wq_b.scale")[:2] == ("F8_E8M0", (2, 1))


def test_load_model_bit_exact_against_hand_decode(written, loaded):
    cfg, w, root = written
    assert len(loaded) == 6
    _assert_layers_match_shards(cfg, w, root, loaded)


def test_from_checkpoint_and_default_cfg(written, loaded):
    cfg, _, root = written
    for i in (0, 3, 5):
        lw = AttnV41LayerWeights.from_checkpoint(root, i, weights="bf16")  # cfg read from config.json
        assert lw.role == cfg.roles[i]
        assert lw.state_dict().keys() == loaded[i].state_dict().keys()
        for k, v in lw.state_dict().items():
            assert v.dtype == loaded[i][k].dtype and torch.equal(v, loaded[i][k]), f"layer {i} {k}"
    assert loaded[1]["compressor.wgate.weight"].dtype == torch.float32  # ratio 2 upcast
    assert loaded[3]["compressor.wkv.weight"].dtype == torch.bfloat16  # ratio 1 stays bf16


def test_reads_each_needed_tensor_once(written, monkeypatch):
    cfg, _, root = written
    reads: list[str] = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def keys(self):
            return self.f.keys()

        def get_slice(self, name):
            return self.f.get_slice(name)

        def get_tensor(self, name):
            reads.append(name)
            return self.f.get_tensor(name)

    real = ckpt.safe_open
    monkeypatch.setattr(ckpt, "safe_open", lambda *a, **k: Counting(real(*a, **k)))
    assert ckpt.checkpoint_weight_format(root) == "fp8" and not reads, "the format from headers alone"
    load_model(root, cfg=cfg, progress=False, weights="bf16")
    wm = _weight_map(root)
    needed = {n for n in wm if ".attn." in n}
    assert len(reads) == len(set(reads)), "a tensor was read twice"
    assert set(reads) == needed
    assert not any("attn_norm" in n for n in reads)


def test_forward_on_loaded_weights(written, loaded):
    cfg, _, _ = written
    rt = RuntimeStack(cfg, loaded)
    xs = random_inputs(cfg, 5, SEED + 1)
    outs = rt.step([x[:5] for x in xs], 0, keep=True)
    for i, out in enumerate(outs):
        assert out.shape == (5, cfg.dim) and not out.isnan().any(), f"layer {i} out has NaN"


@pytest.mark.parametrize(
    "kw, shards",
    [
        (dict(compress_ratios=(0,), kv_source_layers=(), index_source_layers=()), 2),
        (dict(compress_ratios=(2,), kv_source_layers=(0,), index_source_layers=(0,)), 2),
        (dict(compress_ratios=(1,), kv_source_layers=(0,), index_source_layers=(0,)), 5),
    ],
    ids=["swa_2_shards", "full_ratio2_2_shards", "full_ratio1_5_shards"],
)
def test_one_layer_split_across_shards(tmp_path, kw, shards):
    cfg = small_cfg(n_layers=1, candidate_source_layer=None, **kw)
    w = random_weights(cfg, 3)
    root = write_checkpoint(tmp_path, cfg, w, shards=shards)
    assert len({f for n, f in _weight_map(root).items() if n.startswith("layers.0.attn.")}) >= 2
    layers = load_model(root, progress=False, weights="bf16")
    _assert_layers_match_shards(cfg, w, root, layers)


def test_already_dequantized_checkpoint(tmp_path):
    """fp8 names stored bf16 without a scale are used as they are."""
    cfg = small_cfg()
    w = random_weights(cfg, 4)
    root = write_checkpoint(tmp_path, cfg, w, shards=2, fp8_names=())
    assert "quantization_config" not in json.loads((root / "config.json").read_text())
    assert not any(n.endswith(".scale") for n in _weight_map(root))
    assert ckpt.checkpoint_weight_format(root) == "bf16"
    layers = load_model(root, progress=False)  # its own format: bf16
    for i, lw in enumerate(layers):
        for name in FP8_NAMES:
            if name in w[i]:
                assert torch.equal(lw[name], w[i][name]), f"layer {i} {name}"


def test_model_prefix_accepted(written, tmp_path):
    cfg, w, root = written
    wm = _weight_map(root)
    for f in set(wm.values()):
        save_file({"model." + k: v for k, v in load_file(root / f).items()}, str(tmp_path / f))
    index = {"metadata": {}, "weight_map": {"model." + k: f for k, f in wm.items()}}
    (tmp_path / ckpt.INDEX_FILE).write_text(json.dumps(index))
    shutil.copy(root / "config.json", tmp_path / "config.json")
    assert ckpt.checkpoint_weight_format(tmp_path) == "fp8"
    layers = load_model(tmp_path, cfg=cfg, progress=False, weights="bf16")
    for a, b in zip(layers, load_model(root, cfg=cfg, progress=False, weights="bf16")):
        assert all(torch.equal(v, b[k]) for k, v in a.state_dict().items())


def test_progress_lines_without_tqdm(written, monkeypatch, capsys):
    cfg, _, root = written
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    load_model(root, cfg=cfg, progress=True, weights="bf16")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == cfg.n_layers and "6/6" in err[-1]


# ---------------------------------------------------------------------------- fp8 by itself
def test_dequantize_every_e4m3_code_and_scale_bits():
    """All 254 non-NaN e4m3 codes (subnormals, −0) under scales from 2^−124 to 2^119."""
    codes = np.array([b for b in range(256) if b & 0x7F != 0x7F], dtype=np.uint8)
    q_bytes = np.resize(codes, (64, 256))  # a 2×8 block grid
    s_bytes = np.array([[3, 60, 100, 126, 127, 128, 200, 246], [127, 1 + 127, 90, 150, 30, 220, 140, 110]], np.uint8)
    got = dequantize_fp8(torch.from_numpy(q_bytes).view(torch.float8_e4m3fn), torch.from_numpy(s_bytes))
    exact = _dequant_by_hand(q_bytes, s_bytes)
    assert np.array_equal(_bits(got), _bf16_bits(exact, "grid"))


def test_dequantize_smallest_scales():
    """Scale bytes 0 (2^−127, a subnormal fp32 factor), 1 and 2, on the codes whose products
    bf16 still holds exactly (exponent field >= 4)."""
    codes = np.array([b for b in range(256) if (b >> 3) & 0xF >= 4 and b & 0x7F != 0x7F], dtype=np.uint8)
    q_bytes = np.resize(codes, (32, 96))
    s_bytes = np.array([[0, 1, 2]], np.uint8)
    got = dequantize_fp8(torch.from_numpy(q_bytes).view(torch.float8_e4m3fn), torch.from_numpy(s_bytes))
    assert np.array_equal(_bits(got), _bf16_bits(_dequant_by_hand(q_bytes, s_bytes), "small scales"))


@pytest.mark.parametrize("shape", [(32, 32), (45, 70), (7, 301)], ids=["one_block", "partial_blocks", "odd"])
def test_quantize_scale_is_the_tight_power_of_two(shape):
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(shape, generator=gen) * torch.logspace(-30, 3, shape[1]).view(1, -1)
    # the first block's amax is exactly 448·2^−3: its scale must be 2^−3, not 2^−2
    w[:32, :32] = (torch.rand(w[:32, :32].shape, generator=gen) * 2 - 1) * 50
    w[0, 0] = -448 * 2.0**-3
    q, s = quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu
    assert s.view(torch.uint8)[0, 0].item() == 127 - 3
    assert q[0, 0].float().item() == -448
    rows, cols = s.shape
    for r in range(rows):
        for c in range(cols):
            blk = w[r * 32 : (r + 1) * 32, c * 32 : (c + 1) * 32].double()
            amax, byte = blk.abs().max().item(), s.view(torch.uint8)[r, c].item()
            scale = 2.0 ** (byte - 127)
            assert amax <= 448 * scale and (amax > 224 * scale or byte == 0), (r, c, amax, byte)
    assert not q.float().isnan().any()


# ---------------------------------------------------------------------------- errors
class _Editable:
    """A copy of a checkpoint whose index and shards a test rewrites."""

    def __init__(self, src, dst):
        shutil.copytree(src, dst)
        self.root = dst
        self.index = json.loads((dst / ckpt.INDEX_FILE).read_text())

    @property
    def wm(self) -> dict[str, str]:
        return self.index["weight_map"]

    def save_index(self):
        (self.root / ckpt.INDEX_FILE).write_text(json.dumps(self.index))

    def put(self, name, t, file=None):
        """Set (t a tensor) or delete (t None) one tensor in its shard (or `file`)."""
        file = file or self.wm[name]
        p = self.root / file
        d = {k: v.clone() for k, v in load_file(p).items()}
        if t is None:
            del d[name]
        else:
            d[name] = t
        save_file(d, str(p) + ".tmp")
        os.replace(str(p) + ".tmp", p)

    def get(self, name):
        return load_file(self.root / self.wm[name])[name]

    def drop(self, name):
        self.put(name, None)
        del self.wm[name]
        self.save_index()

    def add(self, name, t):
        self.wm[name] = next(iter(self.wm.values()))
        self.put(name, t)
        self.save_index()


def _nan_scale(e: _Editable):
    s = e.get("layers.3.attn.wq_b.scale").view(torch.uint8).clone()
    s[1, 0] = 0xFF
    e.put("layers.3.attn.wq_b.scale", s.view(torch.float8_e8m0fnu))


def _nan_weight(e: _Editable):
    q = e.get("layers.0.attn.wo_a.weight").view(torch.uint8).clone()
    q[2, 5] = 0xFF
    e.put("layers.0.attn.wo_a.weight", q.view(torch.float8_e4m3fn))


def _move_to_other_shard(e: _Editable):
    name = "layers.1.attn.q_norm.weight"
    e.wm[name] = next(f for f in sorted(set(e.wm.values())) if f != e.wm[name])
    e.save_index()


def _drop_family(e: _Editable, layer: int, family: str):
    for n in [n for n in e.wm if n.startswith(f"layers.{layer}.attn.{family}.")]:
        e.drop(n)


def _set_values(name: str, where: list[tuple[int, ...]], values: list[float]):
    def mutate(e: _Editable):
        t = e.get(name).clone()
        for idx, v in zip(where, values):
            t[idx] = v
        e.put(name, t)

    return mutate


def _big_scale(e: _Editable):
    """Scale byte 0xFE (2^127) on the block holding a weight >= 2 in magnitude: inf."""
    q = e.get("layers.1.attn.wq_b.weight").view(torch.uint8).clone()
    q[32:64, 0:32] = 0x38  # e4m3 1.0: 2^127 · 1 is finite
    q[40, 3] = 0x40  # e4m3 2.0: 2^128 is not
    e.put("layers.1.attn.wq_b.weight", q.view(torch.float8_e4m3fn))
    s = e.get("layers.1.attn.wq_b.scale").view(torch.uint8).clone()
    s[1, 0] = 0xFE
    e.put("layers.1.attn.wq_b.scale", s.view(torch.float8_e8m0fnu))


BF16 = torch.bfloat16
NAN, INF = float("nan"), float("inf")
BAD = {
    "missing_from_weight_map": (
        lambda e: (e.wm.pop("layers.1.attn.wkv.weight"), e.save_index()),
        r"layers\.1\.attn\.wkv\.weight: missing from weight_map",
    ),
    "absent_from_its_shard": (_move_to_other_shard, r"layers\.1\.attn\.q_norm\.weight: listed in weight_map"),
    "shape": (lambda e: e.put("layers.3.attn.attn_sink", torch.zeros(5)), r"layers\.3\.attn\.attn_sink\.shape"),
    "dtype_norm_fp32": (
        lambda e: e.put("layers.0.attn.q_norm.weight", torch.ones(16)),
        r"layers\.0\.attn\.q_norm\.weight\.dtype = torch\.float32",
    ),
    "dtype_sink_bf16": (
        lambda e: e.put("layers.4.attn.attn_sink", torch.zeros(4, dtype=BF16)),
        r"layers\.4\.attn\.attn_sink\.dtype",
    ),
    "dtype_bf16_with_scale": (
        lambda e: e.put("layers.0.attn.wq_a.weight", torch.zeros(16, 64, dtype=BF16)),
        r"layers\.0\.attn\.wq_a\.weight\.dtype",
    ),
    "dtype_e5m2": (
        lambda e: e.put("layers.2.attn.wo_b.weight", torch.zeros(64, 32).to(torch.float8_e5m2)),
        r"layers\.2\.attn\.wo_b\.weight\.dtype = torch\.float8_e5m2",
    ),
    "missing_scale": (
        lambda e: e.drop("layers.5.attn.indexer.wq_b.scale"),
        r"layers\.5\.attn\.indexer\.wq_b\.scale: missing",
    ),
    "misshapen_scale": (
        lambda e: e.put(
            "layers.1.attn.wo_a.scale", torch.full((3, 2), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        ),
        r"layers\.1\.attn\.wo_a\.scale\.shape = \(3, 2\); allowed: \(1, 2\)",
    ),
    "scale_dtype_uint8": (
        lambda e: e.put("layers.0.attn.wkv.scale", torch.full((1, 2), 127, dtype=torch.uint8)),
        r"layers\.0\.attn\.wkv\.scale\.dtype",
    ),
    "nan_scale": (_nan_scale, r"layers\.3\.attn\.wq_b\.scale: byte 0xFF \(NaN\) at block \[1, 0\]"),
    "nan_weight": (_nan_weight, r"layers\.0\.attn\.wo_a\.weight: NaN fp8 byte at \[2, 5\]"),
    "reuse_layer_has_compressor": (
        lambda e: e.add("layers.2.attn.compressor.wkv.weight", torch.zeros(32, 64, dtype=BF16)),
        r"layers\.2\.attn\.compressor\.wkv\.weight: present.*role mismatch",
    ),
    "full_layer_lacks_compressor": (
        lambda e: _drop_family(e, 1, "compressor"),
        r"layers\.1\.attn\.compressor\.norm\.weight: missing,.*role mismatch",
    ),
    "ratio1_layer_has_wgate": (
        lambda e: e.add("layers.3.attn.compressor.wgate.weight", torch.zeros(32, 64, dtype=BF16)),
        r"layers\.3\.attn\.compressor\.wgate\.weight: present.*role mismatch",
    ),
    "nan_inf_bf16_norm": (
        _set_values("layers.3.attn.q_norm.weight", [(5,), (9,)], [NAN, INF]),
        r"layers\.3\.attn\.q_norm\.weight: 2 non-finite values \(first at \[5\]\); allowed: finite",
    ),
    "inf_sink": (
        _set_values("layers.4.attn.attn_sink", [(2,)], [-INF]),
        r"layers\.4\.attn\.attn_sink: 1 non-finite value \(first at \[2\]\); allowed: finite",
    ),
    "nan_ratio2_compressor_bf16": (
        _set_values("layers.1.attn.compressor.wgate.weight", [(7, 11)], [NAN]),
        r"layers\.1\.attn\.compressor\.wgate\.weight: 1 non-finite value \(first at \[7, 11\]\)",
    ),
    "nan_indexer_key_proj": (
        _set_values("layers.3.attn.indexer.wk.weight", [(0, 1)], [NAN]),
        r"layers\.3\.attn\.indexer\.wk\.weight: 1 non-finite value \(first at \[0, 1\]\)",
    ),
    "scale_0xFE_overflows": (
        _big_scale,
        r"layers\.1\.attn\.wq_b\.weight: 1 non-finite value \(first at \[40, 3\]\); allowed: finite \(after "
        r"dequantization with scale byte 0xFE at block \[1, 0\] of layers\.1\.attn\.wq_b\.scale\)",
    ),
    "unexpected_tensor": (
        lambda e: e.add("layers.0.attn.extra.weight", torch.zeros(2, dtype=BF16)),
        r"layers\.0\.attn\.extra\.weight: unexpected tensor",
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_errors_name_the_tensor(written, tmp_path, case):
    cfg, _, root = written
    mutate, match = BAD[case]
    e = _Editable(root, tmp_path / "ck")
    mutate(e)
    with pytest.raises(CheckpointError, match=match):
        load_model(e.root, cfg=cfg, progress=False, weights="bf16")


def test_missing_shard_file_names_the_tensor(written, tmp_path):
    cfg, _, root = written
    e = _Editable(root, tmp_path / "ck")
    (e.root / e.wm["layers.0.attn.wq_a.weight"]).unlink()
    with pytest.raises(FileNotFoundError, match=r"layers\.0\.attn\.wq_a\.weight"):
        load_layer(e.root, 0, cfg=cfg, weights="bf16")


def test_role_mismatch_between_configs(tmp_path):
    """Layer 4 is a reuse layer in one schedule and a kv source in the other."""
    plain = small_cfg()
    more = small_cfg(kv_source_layers=(1, 3, 4), index_source_layers=(1, 3, 4, 5))
    assert plain.roles[4].name == "reuse" and more.roles[4].is_kv_source
    a = write_checkpoint(tmp_path / "plain", plain, random_weights(plain, 1), shards=3)
    b = write_checkpoint(tmp_path / "more", more, random_weights(more, 1), shards=3)
    # a cfg other than the checkpoint's own is refused first, naming the fields
    with pytest.raises(CheckpointError, match=r"cfg differs .*kv_source_layers=\[1, 3\] \(checkpoint: \[1, 3, 4\]\)"):
        load_layer(b, 4, cfg=plain)
    with pytest.raises(CheckpointError, match=r"cfg differs .*index_source_layers"):
        load_model(a, cfg=more, progress=False)
    # config.json itself contradicting the tensors: each file's config swapped for the other's
    ca, cb = (Path(a) / "config.json").read_text(), (Path(b) / "config.json").read_text()
    (Path(a) / "config.json").write_text(cb)
    (Path(b) / "config.json").write_text(ca)
    with pytest.raises(CheckpointError, match=r"layers\.4\.attn\.compressor\.\w+\.weight: present.*role mismatch"):
        load_layer(b, 4)
    with pytest.raises(CheckpointError, match=r"layers\.4\.attn\.compressor\.\w+\.weight: missing,.*role mismatch"):
        load_layer(a, 4)


def test_bad_quantization_config(written, tmp_path):
    cfg, _, root = written
    e = _Editable(root, tmp_path / "ck")
    d = json.loads((e.root / "config.json").read_text())
    d["quantization_config"]["weight_block_size"] = [128, 128]
    (e.root / "config.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match="weight_block_size"):
        load_layer(e.root, 0, cfg=cfg)


@pytest.mark.parametrize(
    "qc, match",
    [
        (["fp8"], r"quantization_config = \['fp8'\]; allowed: a JSON object"),
        (
            {"weight_block_size": 32},
            r"quantization_config weight_block_size = 32, scale_fmt = 'ue8m0'; allowed: \[32, 32\]",
        ),
    ],
    ids=["list", "int-block"],
)
def test_malformed_quantization_config_is_named(written, tmp_path, qc, match):
    """A quantization_config that is no object, or a block size that is no list: a
    CheckpointError naming the file and key (before: AttributeError / "'int' object is not
    iterable", a traceback from the CLI)."""
    cfg, _, root = written
    e = _Editable(root, tmp_path / "ck")
    d = json.loads((e.root / "config.json").read_text())
    d["quantization_config"] = qc
    (e.root / "config.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match=r"config\.json: " + match):
        load_layer(e.root, 0, cfg=cfg)


def test_scale_on_a_tensor_that_is_not_fp8_is_named_so(written, tmp_path):
    """A `.scale` beside a tensor the role has but that is not an FP8 linear (indexer.wk on
    an index source): named as a stray scale, not as a role mismatch."""
    cfg, _, root = written
    i = next(j for j, r in enumerate(cfg.roles) if r.is_index_source)
    e = _Editable(root, tmp_path / "ck")
    e.add(f"layers.{i}.attn.indexer.wk.scale", torch.zeros(1, 1, dtype=torch.uint8).view(torch.float8_e8m0fnu))
    msg = rf"layers\.{i}\.attn\.indexer\.wk\.scale: a scale for layers\.{i}\.attn\.indexer\.wk\.weight, which is not"
    with pytest.raises(CheckpointError, match=msg + r" stored in FP8; allowed: scales only on the FP8 linears"):
        load_layer(e.root, i, cfg=cfg)


def test_writer_rejects_bad_arguments(tmp_path):
    cfg = small_cfg()
    w = random_weights(cfg, 1)
    with pytest.raises(ValueError, match="fp8_names"):
        write_checkpoint(tmp_path, cfg, w, shards=2, fp8_names=("q_norm.weight",))
    with pytest.raises(ValueError, match="n_layers"):
        write_checkpoint(tmp_path, cfg, w[:5], shards=2)
    with pytest.raises(KeyError, match="wq_a"):
        write_checkpoint(tmp_path, cfg, [{k: v for k, v in x.items() if k != "wq_a.weight"} for x in w], shards=2)


# ---------------------------------------------------------------------------- issue 10: files and defaults
def _truncate(p):
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _corrupt_header(p):
    data = bytearray(p.read_bytes())
    data[8:16] = b"\x00garbage"  # the header's JSON starts at byte 8
    p.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _corrupt_header], ids=["truncated", "corrupted_header"])
def test_unreadable_shard_names_the_file(written, tmp_path, damage):
    cfg, _, root = written
    e = _Editable(root, tmp_path / "ck")
    shard = e.root / e.wm["layers.2.attn.wq_a.weight"]
    damage(shard)
    with pytest.raises(CheckpointError) as err:
        load_model(e.root, cfg=cfg, progress=False)
    msg = str(err.value)
    assert str(shard) in msg and "safetensors" in msg, msg


@pytest.mark.parametrize(
    "file, text",
    [
        (ckpt.INDEX_FILE, '{"weight_map": {'),
        (ckpt.INDEX_FILE, '"weight_map"'),
        (ckpt.INDEX_FILE, '{"weight_map": {"layers.0.attn.wq_a.weight": 3}}'),
        ("config.json", "{'text_config': 1}"),
    ],
    ids=["index_truncated", "index_not_an_object", "index_file_not_a_name", "config_single_quotes"],
)
def test_malformed_json_names_the_file(written, tmp_path, file, text):
    cfg, _, root = written
    e = _Editable(root, tmp_path / "ck")
    (e.root / file).write_text(text)
    for call in (lambda: load_model(e.root, cfg=cfg, progress=False), lambda: load_layer(e.root, 0, cfg=cfg)):
        with pytest.raises(CheckpointError) as err:
            call()
        assert str(e.root / file) in str(err.value), str(err.value)


def test_malformed_config_json_with_default_cfg(written, tmp_path):
    _, _, root = written
    e = _Editable(root, tmp_path / "ck")
    (e.root / "config.json").write_text('{"text_config": {"hidden_size": 64,')
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        load_model(e.root, progress=False)


def test_dequantize_rejects_overflow():
    q = torch.full((32, 64), 1.5).to(torch.float8_e4m3fn)  # 1.5 · 2^127 is finite in bf16
    q[0, 33] = 2.0
    q[3, 40] = -448.0
    s = torch.tensor([[127, 0xFE]], dtype=torch.uint8)
    with pytest.raises(CheckpointError, match=r"w: 2 non-finite values \(first at \[0, 33\]\).*0xFE at block \[0, 1\]"):
        dequantize_fp8(q, s, name="w")
    s[0, 1] = 0xFD  # 2^126 · 1.5 is finite, 2^126 · 448 is not
    with pytest.raises(CheckpointError, match=r"w: 1 non-finite value \(first at \[3, 40\]\).*0xFD at block \[0, 1\]"):
        dequantize_fp8(q, s, name="w")
    q[3, 40] = 1.0
    assert torch.isfinite(dequantize_fp8(q, s, name="w").float()).all()


def test_default_cfg_fits_a_small_checkpoint(tmp_path):
    """max_position_embeddings < 8192: load_model/load_layer/from_checkpoint with default
    arguments used to fail on max_seq = 8192, a value nobody passed."""
    cfg = small_cfg(max_position_embeddings=512, max_seq=512, max_tokens=64)
    w = random_weights(cfg, 9)
    root = write_checkpoint(tmp_path / "ck", cfg, w, shards=2)
    got = AttnV41Cfg.from_checkpoint(root)
    assert (got.max_seq, got.max_tokens) == (512, 512)
    assert got == cfg.replace(max_tokens=512)
    layers = load_model(root, progress=False, weights="bf16")
    assert [lw.role for lw in layers] == list(cfg.roles)
    lw = load_layer(root, 3, weights="bf16")
    assert all(torch.equal(v, layers[3][k]) for k, v in lw.state_dict().items())
    assert AttnV41LayerWeights.from_checkpoint(root, 5, weights="bf16").role == cfg.roles[5]
    with pytest.raises(ValueError, match=r"AttnV41Cfg\.max_seq = 1024; allowed: .*max_position_embeddings \(512\)"):
        AttnV41Cfg.from_checkpoint(root, max_seq=1024)


# ---------------------------------------------------------------------------- weights="fp8"
@pytest.fixture(scope="module")
def written_fp8(tmp_path_factory):
    # FP8 linears need in-dims in whole 32-column blocks; o_rank 32: wo_a's blocks within its groups
    cfg = small_cfg(q_rank=32, o_rank=32)
    w = random_weights(cfg, SEED + 1)
    root = write_checkpoint(tmp_path_factory.mktemp("ckpt8") / "v41", cfg, w, shards=4, seed=SEED)
    return cfg, w, root


@pytest.mark.parametrize("device_arg", ["cpu", None], ids=["load_model", "from_checkpoint"])
def test_fp8_round_trip_keeps_bytes(written_fp8, device_arg):
    """weights='fp8' keeps each FP8 linear's e4m3 bytes and e8m0 scale bytes exactly as the
    writer stored them (compared with the raw shard bytes), wo_a's too with wo_a='fp8' (run as
    its exact bf16, and by default); with wo_a='bf16' wo_a is dequantized."""
    cfg, w, root = written_fp8
    if device_arg is None:
        layers = [load_layer(root, i, cfg=cfg, weights="fp8", wo_a="fp8") for i in range(cfg.n_layers)]
    else:
        layers = load_model(root, cfg=cfg, device=device_arg, progress=False, weights="fp8", wo_a="fp8")
    default = AttnV41LayerWeights.from_checkpoint(root, 0, cfg=cfg, weights="fp8")
    q, s = quantize_fp8(w[0]["wo_a.weight"])
    assert torch.equal(default["wo_a.weight"].view(torch.uint8), q.view(torch.uint8)), "wo_a: its bytes by default"
    assert torch.equal(default["wo_a.scale"].view(torch.uint8), s.view(torch.uint8)), "wo_a.scale by default"
    deq = load_layer(root, 0, cfg=cfg, weights="fp8", wo_a="bf16")
    assert deq.get("wo_a.scale") is None and torch.equal(deq["wo_a.weight"], dequantize_fp8(q, s)), "wo_a='bf16'"
    with pytest.raises(ValueError, match=r"wo_a = 'fp4'; allowed: \('bf16', 'fp8'\)"):
        load_layer(root, 0, cfg=cfg, weights="fp8", wo_a="fp4")
    for i, lw in enumerate(layers):
        assert lw.format == "fp8", f"layer {i}"
        sd = lw.state_dict()
        assert set(sd) == set(expected_tensors(cfg, cfg.roles[i], "fp8")) | {"attn.wo_a.scale"}, f"layer {i}: names"
        for rel in ("wq_a", "wq_b", "wkv", "wo_b", "indexer.wq_b", "wo_a"):
            if f"attn.{rel}.weight" not in sd:
                continue
            for suffix, code in ((".weight", "F8_E4M3"), (".scale", "F8_E8M0")):
                t = sd[f"attn.{rel}{suffix}"]
                dtype, shape, data = _raw(root, f"layers.{i}.attn.{rel}{suffix}")
                assert (dtype, shape) == (code, tuple(t.shape)), f"layer {i} {rel}{suffix}"
                assert t.contiguous().view(torch.uint8).numpy().tobytes() == data, f"layer {i} {rel}{suffix}: bytes"
            q, s = quantize_fp8(w[i][f"{rel}.weight"])
            assert torch.equal(sd[f"attn.{rel}.weight"].view(torch.uint8), q.view(torch.uint8)), f"layer {i} {rel}"


def test_fp8_and_bf16_loads_run(written_fp8):
    """Both formats of one checkpoint run; they differ (activations are quantized in FP8)."""
    cfg, _, root = written_fp8
    x = random_inputs(cfg, 6, 2)
    outs = {}
    for fmt in ("bf16", "fp8"):
        rt = RuntimeStack(cfg, load_model(root, cfg=cfg, progress=False, weights=fmt))
        outs[fmt] = rt.step(x, 0, keep=True)
        assert all(torch.isfinite(o.float()).all() for o in outs[fmt]), fmt
    assert not torch.equal(outs["bf16"][0], outs["fp8"][0]), "out L0: fp8 load equals the bf16 load"


def test_fp8_load_refuses_dequantized_linear(tmp_path):
    cfg = small_cfg(q_rank=32)
    w = random_weights(cfg, 4)
    root = write_checkpoint(tmp_path, cfg, w, shards=2, fp8_names=[n for n in FP8_NAMES if n != "wkv.weight"])
    load_model(root, cfg=cfg, progress=False, weights="bf16")  # fine (the default refuses the mix)
    with pytest.raises(CheckpointError, match=r"layers\.0\.attn\.wkv\.weight\.dtype = torch\.bfloat16 without a"):
        load_model(root, cfg=cfg, progress=False, weights="fp8")


def test_weights_arg_checked(written_fp8):
    _, _, root = written_fp8
    with pytest.raises(ValueError, match=r"weights = 'fp4'; allowed: \('bf16', 'fp8'\) or None"):
        load_model(root, progress=False, weights="fp4")
    with pytest.raises(ValueError, match=r"weights = 'e4m3'; allowed"):
        load_layer(root, 0, weights="e4m3")


def test_default_format_is_the_checkpoints_own(written_fp8):
    """weights=None (the default): an FP8 checkpoint loads as "fp8", bytes kept, as with
    weights="fp8"; "bf16" is still there on request."""
    cfg, _, root = written_fp8
    assert ckpt.checkpoint_weight_format(root) == "fp8"
    auto = load_model(root, cfg=cfg, progress=False)
    explicit = load_model(root, cfg=cfg, progress=False, weights="fp8")
    for i, (a, b) in enumerate(zip(auto, explicit)):
        assert a.format == "fp8", f"layer {i}"
        assert a.state_dict().keys() == b.state_dict().keys(), f"layer {i}: names"
        for k, v in a.state_dict().items():
            assert v.dtype == b[k].dtype and torch.equal(v.view(torch.uint8), b[k].view(torch.uint8)), f"L{i} {k}"
    assert load_layer(root, 5, cfg=cfg).format == "fp8"
    assert {lw.format for lw in load_model(root, cfg=cfg, progress=False, weights="bf16")} == {"bf16"}


def test_partly_fp8_checkpoint_has_no_format_of_its_own(tmp_path):
    """One FP8 linear stored dequantized (no scale), the others FP8: loading it as either
    format would run part of the model in the other math without a word (before
    2026-12-04 the default silently took bf16 for every layer), so the default refuses,
    naming one tensor of each kind; `weights="bf16"` loads it, dequantizing the rest."""
    cfg = small_cfg(q_rank=32)
    root = write_checkpoint(tmp_path, cfg, random_weights(cfg, 4), shards=2, fp8_names=set(FP8_NAMES) - {"wq_b.weight"})
    msg = (
        r"layers\.0\.attn\.wq_b\.weight is not stored float8_e4m3fn with its scale, but "
        r"layers\.0\.attn\.w\S+\.weight is: .* two formats.*allowed: weights='bf16'"
    )
    with pytest.raises(CheckpointError, match=msg):
        ckpt.checkpoint_weight_format(root)
    with pytest.raises(CheckpointError, match=msg):
        load_model(root, cfg=cfg, progress=False)
    with pytest.raises(CheckpointError, match=msg):
        load_layer(root, 3, cfg=cfg)
    assert {lw.format for lw in load_model(root, cfg=cfg, progress=False, weights="bf16")} == {"bf16"}


def test_tensors_past_n_layers_do_not_set_the_format(tmp_path):
    """A tensor of a layer past n_layers (a draft stage's) stored otherwise does not move an
    FP8 checkpoint's own format (before, any such tensor made every layer load bf16)."""
    cfg = small_cfg(q_rank=32)
    root = write_checkpoint(tmp_path, cfg, random_weights(cfg, 4), shards=1)
    idx = json.loads((root / "model.safetensors.index.json").read_text())
    extra = {f"layers.{cfg.n_layers}.attn.wq_a.weight": torch.zeros(4, 32, dtype=torch.bfloat16)}
    save_file(extra, str(root / "extra.safetensors"), metadata={"format": "pt"})
    idx["weight_map"].update(dict.fromkeys(extra, "extra.safetensors"))
    (root / "model.safetensors.index.json").write_text(json.dumps(idx))
    assert ckpt.checkpoint_weight_format(root) == "fp8"
    assert {lw.format for lw in load_model(root, cfg=cfg, progress=False)} == {"fp8"}


def test_default_fp8_load_of_an_in_dim_not_in_fp8_blocks(written):
    """An FP8 checkpoint whose wq_b in-dim (q_rank 16) is not a multiple of 32 cannot run
    the released FP8 linear: its default load names the tensor and the way out; bf16 works."""
    cfg, _, root = written
    assert ckpt.checkpoint_weight_format(root) == "fp8"
    msg = r"layers\.0\.attn\.wq_b\.weight\.shape = \(128, 16\); allowed with weights='fp8': in .* weights='bf16'"
    with pytest.raises(CheckpointError, match=msg):
        load_model(root, cfg=cfg, progress=False)
    with pytest.raises(CheckpointError, match=msg):
        load_layer(root, 0, cfg=cfg, weights="fp8")
    assert load_layer(root, 0, cfg=cfg, weights="bf16").format == "bf16"
