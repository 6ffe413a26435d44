"""Loading attention weights from a checkpoint in the released DeepSeek-V4.1 layout.

The layout (../shared/spec/checkpoint-v41.md): a nested `config.json`,
`model.safetensors.index.json` (`"weight_map"`: tensor name → shard file) and shards
`model-000NN-of-000MM.safetensors`. Layer i's attention tensors are named
`layers.{i}.attn.<...>` (no `model.` prefix; an index whose names all carry `model.`
is accepted too). Every name is resolved through `weight_map`; shards are opened lazily
with `safe_open` and read one tensor at a time, never whole. `layers.{i}.attn_norm.weight`
and everything outside `layers.{i}.attn.` are not read.

On-disk dtypes (the spec's table): `wq_a`, `wq_b`, `wkv`, `wo_a`, `wo_b` and
`indexer.wq_b` are float8_e4m3fn with a block scale `<name without .weight>.scale`
(float8_e8m0fnu, `[ceil(out/32), ceil(in/32)]`); `attn_sink` is fp32; everything else
(norms, `compressor.wkv`/`wgate`, `indexer.wk`, `indexer.weights_proj`) is bf16.
Choice: one of the fp8 names stored bf16 WITHOUT a `.scale` is accepted as a checkpoint
already dequantized and used as is; bf16 with a `.scale`, or fp8 without one, is an error.

Dequantization: `W[n, k] = e4m3(q[n, k]) · 2^(S[n // 32, k // 32] − 127)` with S the raw
scale byte, computed in fp32 (exact) and rounded to bf16 (exact for scales >= 2^−124).
A scale byte 0xFF (NaN), and a product that overflows to ±inf, are rejected. The result
goes through `AttnV41LayerWeights.from_state_dict`, which upcasts the ratio>=2 compressor
to fp32 and rejects NaN/±inf in every tensor (bf16 norms and projections, the fp32 sink).

Weight formats (`weights=`, `WEIGHT_FORMATS`; default None = the checkpoint's own,
`checkpoint_weight_format`): "fp8" keeps the e4m3 bytes and the e8m0 scales as stored for
`FP8_LINEARS` (`wq_a`, `wq_b`, `wkv`, `wo_b`, `indexer.wq_b`: the runtime runs them in the
released FP8 math), after the same checks (a dequantization that would be non-finite is
rejected too), and keeps `wo_a`'s bytes too, run as their exact bf16 (`wo_a="fp8"`, the
default; `wo_a="bf16"` dequantizes it as the released conversion does: `weights.py`); "bf16"
dequantizes every fp8 weight as above. A checkpoint is "fp8" when every FP8 linear of
every attention layer (0..n_layers−1) is stored float8_e4m3fn with its `.scale`, "bf16"
when none is (already dequantized); one only partly in FP8 has no format of its own and
raises unless `weights=` is given. With "fp8", one of those linears stored bf16 without a
scale is an error (its FP8 bytes are gone), and so is one whose in-dim is not a multiple
of 32 (the released FP8 linear quantizes its input per 32 columns).

Every validation failure raises `CheckpointError` (a `ValueError`) naming the tensor:
missing (from `weight_map` or from its shard), shape, dtype, scale missing or misshapen,
NaN scale, non-finite values, and a role that does not match the config's layer lists;
a malformed JSON file (`config.json`, the index) or an unreadable shard (truncated,
corrupted header) raises it naming the file.

`write_checkpoint` writes a small checkpoint in exactly this layout, for tests.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .config import AttnV41Cfg, LayerRole, _read_json
from .tp import check_tp, shard_weights
from .weights import (
    FP8_LINEARS,
    WEIGHT_FORMATS,
    WO_A_FORMATS,
    AttnV41LayerWeights,
    NonFiniteWeightError,
    describe_nonfinite,
    expected_tensors,
)

__all__ = [
    "BLOCK",
    "FP8_NAMES",
    "CheckpointError",
    "checkpoint_weight_format",
    "dequantize_fp8",
    "load_layer",
    "load_model",
    "quantize_fp8",
    "write_checkpoint",
]

INDEX_FILE = "model.safetensors.index.json"
BLOCK = 32  # fp8 scale block edge (quantization_config.weight_block_size)
# Names (relative to `attn.`) stored float8_e4m3fn with a block scale in the release.
FP8_NAMES = ("wq_a.weight", "wq_b.weight", "wkv.weight", "wo_a.weight", "wo_b.weight", "indexer.wq_b.weight")
_FP8 = frozenset("attn." + n for n in FP8_NAMES)
_ST_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I32": torch.int32,
    "I64": torch.int64,
}
_LAYER_NAME = re.compile(r"^(model\.)?layers\.(\d+)\.(attn\..+)$")
_ROLE_FAMILIES = ("attn.compressor.", "attn.indexer.")


class CheckpointError(ValueError):
    """A checkpoint that does not match the spec or the config; the message names the tensor."""


def _scale_name(rel: str) -> str:
    return rel.removesuffix(".weight") + ".scale"


def _disk_dtype(rel: str) -> torch.dtype:
    """The released checkpoint's dtype of a name relative to the layer (`attn.…`)."""
    if rel in _FP8:
        return torch.float8_e4m3fn
    return torch.float32 if rel == "attn.attn_sink" else torch.bfloat16


def _describe(role: LayerRole) -> str:
    return (
        f"{role.name} (compress ratio {role.ratio}, kv source {role.is_kv_source}, index source {role.is_index_source})"
    )


# ---------------------------------------------------------------------------- fp8 blocks
def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, name: str = "weight") -> torch.Tensor:
    """bf16 `W[n, k] = e4m3(q[n, k]) · 2^(S[n // 32, k // 32] − 127)` on `q`'s device.

    q: float8_e4m3fn [out, in]; scale: float8_e8m0fnu (or its raw uint8 bytes)
    [ceil(out/32), ceil(in/32)]. Exact in fp32; the bf16 rounding is exact for scales
    >= 2^−124. Raises `CheckpointError` naming `name` on a misshapen scale, a scale byte
    0xFF (NaN, with its block index), a NaN weight byte, or a result holding ±inf (a
    large scale byte, e.g. 0xFE = 2^127, times a weight >= 2).
    """
    out, inp = q.shape
    grid = (math.ceil(out / BLOCK), math.ceil(inp / BLOCK))
    if tuple(scale.shape) != grid:
        raise CheckpointError(
            f"{_scale_name(name)}.shape = {tuple(scale.shape)}; allowed: {grid} for {name} {[out, inp]}"
        )
    s = scale.to(q.device).view(torch.uint8)
    bad = (s == 0xFF).nonzero()
    if bad.numel():
        r, c = bad[0].tolist()
        raise CheckpointError(
            f"{_scale_name(name)}: byte 0xFF (NaN) at block [{r}, {c}] (rows {r * BLOCK}.., cols {c * BLOCK}..) "
            f"of {name}; allowed: 0x00..0xFE"
        )
    nan = ((q.view(torch.uint8) & 0x7F) == 0x7F).nonzero()
    if nan.numel():
        raise CheckpointError(f"{name}: NaN fp8 byte at {nan[0].tolist()}")
    # 2^(S−127) built from its fp32 bits: exponent field S for S >= 1, the subnormal 2^−127 for S = 0.
    bits = torch.where(s == 0, 0x00400000, s.to(torch.int32) << 23)
    pow2 = bits.view(torch.float32)
    pow2 = pow2.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:out, :inp]
    w = (q.float() * pow2).to(torch.bfloat16)
    # Large scale bytes (0xFE = 2^127) overflow to ±inf: the weight is unusable.
    detail = describe_nonfinite(w)
    if detail is not None:
        r, c = (~torch.isfinite(w)).nonzero()[0].tolist()
        raise CheckpointError(
            f"{name}: {detail} (after dequantization with scale byte 0x{int(s[r // BLOCK, c // BLOCK]):02X} "
            f"at block [{r // BLOCK}, {c // BLOCK}] of {_scale_name(name)})"
        )
    return w


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-quantize `w` [out, in] the released way: per 32×32 block the power-of-two
    scale s = 2^ceil(log2(amax/448)) (s = 1 for an all-zero block, clamped to 2^−127..2^127),
    q = e4m3(w / s). Returns (q float8_e4m3fn [out, in], scale float8_e8m0fnu
    [ceil(out/32), ceil(in/32)] holding the byte log2(s) + 127)."""
    out, inp = w.shape
    R, C = math.ceil(out / BLOCK), math.ceil(inp / BLOCK)
    pad = torch.zeros(R * BLOCK, C * BLOCK, dtype=torch.float64, device=w.device)
    pad[:out, :inp] = w.double()
    amax = pad.view(R, BLOCK, C, BLOCK).abs().amax(dim=(1, 3))
    # frexp: amax/448 ≈ m·2^e with m in [0.5, 1), so the smallest e' with 448·2^e' >= amax is
    # e or e−1; decide exactly (the division rounds, 448·2^(e−1) does not).
    _, e = torch.frexp(amax / 448)
    e = torch.where(torch.ldexp(torch.full_like(amax, 448.0), e - 1) >= amax, e - 1, e)
    e = torch.where(amax == 0, torch.zeros_like(e), e).clamp(-127, 127)
    s = torch.ldexp(torch.ones_like(amax), e)
    q = (pad / s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1))[:out, :inp]
    scale = (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return q.float().to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


# ---------------------------------------------------------------------------- reading
class _Checkpoint:
    """A checkpoint directory's index and its shards, opened on first use."""

    def __init__(self, path: str | Path):
        self.root = Path(path)
        self.index_path = self.root / INDEX_FILE
        if not self.index_path.is_file():
            raise FileNotFoundError(f"{self.root}: no {INDEX_FILE}")
        wm = _read_json(self.index_path).get("weight_map")
        if not isinstance(wm, dict):
            raise CheckpointError(f"{self.index_path}: no 'weight_map' object")
        bad = next((k for k, f in wm.items() if not isinstance(f, str)), None)
        if bad is not None:
            raise CheckpointError(f"{self.index_path}: weight_map[{bad!r}] = {wm[bad]!r}; allowed: a shard file name")
        self.weight_map: dict[str, str] = wm
        _check_quantization_config(self.root / "config.json")
        plain = any(k.startswith("layers.") for k in wm)
        self.prefix = "" if plain or not any(k.startswith("model.layers.") for k in wm) else "model."
        # layer → names present under `layers.{i}.attn.`, relative to the layer
        self.layers: dict[int, set[str]] = {}
        for k in wm:
            m = _LAYER_NAME.match(k)
            if m and (m.group(1) or "") == self.prefix:
                self.layers.setdefault(int(m.group(2)), set()).add(m.group(3))
        self._stack = ExitStack()
        self._open: dict[str, tuple[object, set[str]]] = {}

    def __enter__(self) -> _Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def name(self, layer: int, rel: str) -> str:
        return f"{self.prefix}layers.{layer}.{rel}"

    def _shard(self, name: str):
        file = self.weight_map[name]
        if file not in self._open:
            p = self.root / file
            if not p.is_file():
                raise FileNotFoundError(f"{name}: weight_map names shard {file}, which does not exist in {self.root}")
            try:
                f = self._stack.enter_context(safe_open(str(p), framework="pt", device="cpu"))
            except SafetensorError as e:
                raise CheckpointError(f"{p}: not a readable safetensors file ({e}); it holds {name}") from e
            self._open[file] = (f, set(f.keys()))
        f, keys = self._open[file]
        if name not in keys:
            raise CheckpointError(f"{name}: listed in weight_map under {file}, but absent from that shard")
        return f

    def header(self, name: str) -> tuple[torch.dtype | str, tuple[int, ...]]:
        """(dtype, shape) from the shard's header, without reading the data."""
        f = self._shard(name)
        try:
            sl = f.get_slice(name)
            code = sl.get_dtype()
        except SafetensorError as e:
            raise CheckpointError(f"{name}: unreadable header in {self.root / self.weight_map[name]} ({e})") from e
        return _ST_DTYPES.get(code, code), tuple(sl.get_shape())

    def read(self, name: str) -> torch.Tensor:
        f = self._shard(name)
        try:
            return f.get_tensor(name)
        except SafetensorError as e:
            raise CheckpointError(f"{name}: unreadable data in {self.root / self.weight_map[name]} ({e})") from e


def _check_quantization_config(path: Path) -> None:
    if not path.is_file():
        return
    d = _read_json(path)
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: a JSON {type(d).__name__}; allowed: a JSON object")
    qc = d.get("quantization_config")
    if not qc:
        return
    if not isinstance(qc, dict):
        raise CheckpointError(f"{path}: quantization_config = {qc!r}; allowed: a JSON object")
    block = qc.get("weight_block_size", [BLOCK, BLOCK])
    fmt = qc.get("scale_fmt", "ue8m0")
    if not isinstance(block, list) or block != [BLOCK, BLOCK] or fmt != "ue8m0":
        raise CheckpointError(
            f"{path}: quantization_config weight_block_size = {block}, scale_fmt = {fmt!r}; allowed: [32, 32], 'ue8m0'"
        )


def _check_role(ck: _Checkpoint, i: int, role: LayerRole, spec: Mapping[str, object]) -> None:
    """Compare the compressor/indexer names the checkpoint holds for layer i with the role."""
    present = ck.layers.get(i, set())
    allowed = set(spec) | {_scale_name(k) for k in spec if k in _FP8}
    for rel in sorted(present - allowed):
        weight = rel.removesuffix(".scale") + ".weight"
        if rel.endswith(".scale") and weight in spec:  # the role has the tensor: its scale is what is wrong
            raise CheckpointError(
                f"{ck.name(i, rel)}: a scale for {ck.name(i, weight)}, which is not stored in FP8; allowed: scales "
                f"only on the FP8 linears ({', '.join(sorted(n.removeprefix('attn.') for n in _FP8))})"
            )
        if rel.startswith(_ROLE_FAMILIES):
            raise CheckpointError(
                f"{ck.name(i, rel)}: present in the checkpoint, but the config makes layer {i} "
                f"{_describe(role)}, which has no such tensor (role mismatch: check compress_ratios, "
                f"kv_source_layers, index_source_layers)"
            )
        raise CheckpointError(f"{ck.name(i, rel)}: unexpected tensor for layer {i}, {_describe(role)}")
    for rel in sorted(set(spec) - present):
        family = next((f for f in _ROLE_FAMILIES if rel.startswith(f)), None)
        if family and not any(p.startswith(family) for p in present):
            raise CheckpointError(
                f"{ck.name(i, rel)}: missing, and the checkpoint has no {family}* tensors for layer {i}, "
                f"but the config makes it {_describe(role)} (role mismatch: check compress_ratios, "
                f"kv_source_layers, index_source_layers)"
            )


_KEEP_FP8 = frozenset(f"attn.{n}.weight" for n in FP8_LINEARS)


def _load_layer(
    ck: _Checkpoint, cfg: AttnV41Cfg, i: int, device: torch.device | str, weights: str = "bf16", wo_a: str = "fp8"
) -> AttnV41LayerWeights:
    role = cfg.role(i)
    spec = expected_tensors(cfg, role)
    _check_role(ck, i, role, spec)
    present = ck.layers.get(i, set())
    tensors: dict[str, torch.Tensor] = {}
    for rel, (shape, _) in spec.items():
        name = ck.name(i, rel)
        if rel not in present:
            raise CheckpointError(f"{name}: missing from weight_map ({ck.index_path}); layer {i} is {_describe(role)}")
        dtype, got = ck.header(name)
        want = _disk_dtype(rel)
        has_scale = _scale_name(rel) in present
        # wo_a kept as stored too where its scale blocks lie within the groups (weights.py module doc)
        wo_a_whole = rel == "attn.wo_a.weight" and not (cfg.o_rank % BLOCK or cfg.group_width % BLOCK)
        keep = weights == "fp8" and (rel in _KEEP_FP8 or (wo_a == "fp8" and wo_a_whole))
        if rel in _FP8 and dtype == torch.bfloat16 and not has_scale:
            if keep:
                raise CheckpointError(
                    f"{name}.dtype = {dtype} without a .scale (already dequantized); allowed with weights='fp8': "
                    "torch.float8_e4m3fn with its .scale (load with weights='bf16')"
                )
            want = torch.bfloat16  # a checkpoint already dequantized
        if keep and shape[1] % BLOCK:
            raise CheckpointError(
                f"{name}.shape = {got}; allowed with weights='fp8': in (dim 1) a multiple of {BLOCK} (the FP8 "
                f"linear quantizes its input per {BLOCK} columns); load with weights='bf16'"
            )
        if dtype != want:
            allowed = f"{want}" if rel not in _FP8 else f"{want} with a .scale, or torch.bfloat16 without one"
            raise CheckpointError(f"{name}.dtype = {dtype}; allowed: {allowed}")
        if got != shape:
            raise CheckpointError(f"{name}.shape = {got}; allowed: {shape}")
        if want != torch.float8_e4m3fn:
            tensors[rel] = ck.read(name)
            continue
        sname = ck.name(i, _scale_name(rel))
        if not has_scale:
            raise CheckpointError(f"{sname}: missing from weight_map; {name} is float8_e4m3fn and needs its scale")
        sdtype, sshape = ck.header(sname)
        grid = tuple(math.ceil(n / BLOCK) for n in shape)
        if sdtype != torch.float8_e8m0fnu:
            raise CheckpointError(f"{sname}.dtype = {sdtype}; allowed: torch.float8_e8m0fnu")
        if sshape != grid:
            raise CheckpointError(f"{sname}.shape = {sshape}; allowed: {grid} for {name} {list(shape)}")
        q = ck.read(name).to(device)
        scale = ck.read(sname)
        w = dequantize_fp8(q, scale, name=name)  # every check of the bytes, for both formats
        if keep:
            tensors[rel], tensors[_scale_name(rel)] = q, scale.to(device)
        else:
            tensors[rel] = w
    try:
        return AttnV41LayerWeights.from_state_dict(role, tensors, cfg=cfg, device=device, wo_a=wo_a)
    except NonFiniteWeightError as e:  # NaN or ±inf in a bf16/fp32 tensor as stored
        raise CheckpointError(f"{ck.name(i, e.key)}: {e.detail}") from e


def _stored_format(ck: _Checkpoint, n_layers: int) -> str:
    """The format of the FP8 linears of layers 0..n_layers−1 (headers only, no data read):
    "fp8" when each is stored float8_e4m3fn with its scale, "bf16" when none is (a
    checkpoint already dequantized). Both in one checkpoint raise `CheckpointError` naming
    one of each: loading it as either would silently run part of the model in the other
    math, so the caller chooses (`weights=`). Tensors of later layers (the draft stages)
    do not count."""
    first: dict[bool, str] = {}
    for i in sorted(k for k in ck.layers if k < n_layers):
        present = ck.layers[i]
        for rel in sorted(_KEEP_FP8 & present):
            name = ck.name(i, rel)
            fp8 = _scale_name(rel) in present and ck.header(name)[0] == torch.float8_e4m3fn
            first.setdefault(fp8, name)
    if len(first) == 2:
        raise CheckpointError(
            f"{first[False]} is not stored float8_e4m3fn with its scale, but {first[True]} is: the checkpoint's FP8 "
            "linears are in two formats, so it has no one format of its own; allowed: weights='bf16' (every FP8 "
            "linear dequantized, the stored bf16 ones used as they are), or a checkpoint in one format"
        )
    return "fp8" if first.get(True) else "bf16"


def checkpoint_weight_format(path: str | Path, cfg: AttnV41Cfg | None = None) -> str:
    """The checkpoint's own weight format, what `load_layer`/`load_model` load by default:
    "fp8" when every FP8 linear (`FP8_LINEARS`) of attention layers 0..n_layers−1 is stored
    float8_e4m3fn with its `.scale`, "bf16" when none is; a mix raises `CheckpointError`
    (`_stored_format`). `cfg` (default `AttnV41Cfg.from_checkpoint(path)`) gives n_layers.
    Reads the config, the index and the shard headers only."""
    n_layers = (AttnV41Cfg.from_checkpoint(path) if cfg is None else cfg).n_layers
    with _Checkpoint(path) as ck:
        return _stored_format(ck, n_layers)


def _check_weights_arg(weights: str | None, wo_a: str = "fp8") -> None:
    if weights is not None and weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights = {weights!r}; allowed: {WEIGHT_FORMATS} or None (the checkpoint's own)")
    if wo_a not in WO_A_FORMATS:
        raise ValueError(f"wo_a = {wo_a!r}; allowed: {WO_A_FORMATS}")


def _check_cfg(path: str | Path, cfg: AttnV41Cfg) -> AttnV41Cfg:
    """`cfg` if it is the checkpoint's own config (`AttnV41Cfg.from_checkpoint(path)`) with
    its `max_seq` and `max_tokens`; else CheckpointError naming the fields that differ (a
    window, top-k or layer count other than the model's would load and run silently)."""
    if not isinstance(cfg, AttnV41Cfg):
        raise TypeError(f"cfg is a {type(cfg).__name__}; allowed: AttnV41Cfg or None (the checkpoint's)")
    ref = AttnV41Cfg.from_checkpoint(path, max_seq=cfg.max_seq, max_tokens=cfg.max_tokens)
    if ref != cfg:
        a, b = cfg.to_dict(), ref.to_dict()
        diff = [f"{k}={a[k]!r} (checkpoint: {b[k]!r})" for k in a if a[k] != b[k]]
        raise CheckpointError(
            f"{path}: cfg differs from the checkpoint's config in {', '.join(diff)}; allowed: "
            "AttnV41Cfg.from_checkpoint(path, max_seq=..., max_tokens=...) (only those two may be chosen)"
        )
    return cfg


def load_layer(
    path: str | Path,
    layer: int,
    cfg: AttnV41Cfg | None = None,
    device: torch.device | str = "cpu",
    weights: str | None = None,
    wo_a: str = "fp8",
    tp_rank: int = 0,
    tp_size: int = 1,
) -> AttnV41LayerWeights:
    """Layer `layer`'s attention weights from a checkpoint directory on `device`, in the
    format `weights` ("bf16": dequantized to the runtime dtypes; "fp8": the FP8 linears'
    e4m3 bytes and e8m0 scales as stored, see the module doc; None: the checkpoint's own,
    `checkpoint_weight_format`); with "fp8", wo_a's bytes are kept too (`wo_a="fp8"`, the
    default; "bf16": its exact dequantization)
    (`AttnV41LayerWeights.from_state_dict`). `cfg` defaults to
    `AttnV41Cfg.from_checkpoint(path)`, whose `max_seq` (min(8192,
    max_position_embeddings)) and `max_tokens` (min(4096, max_seq)) fit the checkpoint.
    `tp_rank`, `tp_size`: only that rank's share (`attnv41.tp.shard_weights`; its geometry
    `attnv41.tp.tp_config(cfg, tp_size)`), the layer read on the CPU and sliced there."""
    _check_weights_arg(weights, wo_a)
    cfg = AttnV41Cfg.from_checkpoint(path) if cfg is None else _check_cfg(path, cfg)
    with _Checkpoint(path) as ck:
        fmt = weights or _stored_format(ck, cfg.n_layers)
        _check_tp_args(cfg, fmt, tp_rank, tp_size)
        return _load_sharded(ck, cfg, layer, device, fmt, wo_a, tp_rank, tp_size)


def _check_tp_args(cfg: AttnV41Cfg, fmt: str, tp_rank, tp_size) -> None:
    """`load_layer`'s and `load_model`'s tp arguments, before anything is read."""
    check_tp(cfg, tp_size, tp_rank, fp8=fmt == "fp8")


def _load_sharded(ck, cfg: AttnV41Cfg, i: int, device, fmt: str, wo_a: str, tp_rank: int, tp_size: int):
    if tp_size == 1:
        return _load_layer(ck, cfg, i, device, fmt, wo_a)
    return shard_weights(_load_layer(ck, cfg, i, "cpu", fmt, wo_a), cfg, tp_rank, tp_size, device=device)


def load_model(
    path: str | Path,
    cfg: AttnV41Cfg | None = None,
    device: torch.device | str = "cpu",
    progress: bool = True,
    weights: str | None = None,
    wo_a: str = "fp8",
    tp_rank: int = 0,
    tp_size: int = 1,
) -> list[AttnV41LayerWeights]:
    """Every attention layer (0..n_layers−1) of a checkpoint, as `load_layer` does (same
    default `cfg`, same `weights` formats and default, same `tp_rank`/`tp_size` shares),
    with a progress bar (tqdm when importable, else one stderr line per layer)."""
    _check_weights_arg(weights, wo_a)
    cfg = AttnV41Cfg.from_checkpoint(path) if cfg is None else _check_cfg(path, cfg)
    out = []
    bar = None
    if progress:
        try:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.n_layers, desc="attnv41 attention layers", unit="layer")
        except ImportError:
            pass
    try:
        with _Checkpoint(path) as ck:
            weights = weights or _stored_format(ck, cfg.n_layers)
            _check_tp_args(cfg, weights, tp_rank, tp_size)
            for i in range(cfg.n_layers):
                out.append(_load_sharded(ck, cfg, i, device, weights, wo_a, tp_rank, tp_size))
                if bar is not None:
                    bar.update(1)
                elif progress:
                    print(f"attnv41: loaded layer {i + 1}/{cfg.n_layers} ({cfg.roles[i].name})", file=sys.stderr)
    finally:
        if bar is not None:
            bar.close()
    return out


# ---------------------------------------------------------------------------- writing (tests)
def _hf_config(cfg: AttnV41Cfg, quantized: bool) -> dict:
    text = {
        "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "head_dim": cfg.head_dim,
        "qk_rope_head_dim": cfg.rope_dim,
        "q_lora_rank": cfg.q_rank,
        "o_lora_rank": cfg.o_rank,
        "o_groups": cfg.groups,
        "sliding_window": cfg.window,
        # The released list also covers the 3 draft stages after the backbone.
        "compress_ratios": list(cfg.compress_ratios) + [0, 0, 0],
        "kv_source_layer_ids": list(cfg.kv_source_layers),
        "index_source_layer_ids": list(cfg.index_source_layers),
        "candidate_source_layer_id": cfg.candidate_source_layer,
        "candidate_topk_blocks": cfg.cand_blocks,
        "candidate_block_size": cfg.cand_block,
        "index_n_heads": cfg.index_heads,
        "index_head_dim": cfg.index_head_dim,
        "index_topk": cfg.index_topk,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "compress_rope_theta": cfg.compress_rope_theta,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": cfg.rope_factor,
            "original_max_position_embeddings": cfg.original_seq_len,
            "beta_fast": cfg.beta_fast,
            "beta_slow": cfg.beta_slow,
        },
        "max_position_embeddings": cfg.max_position_embeddings,
    }
    d: dict = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41"}
    if quantized:
        d["quantization_config"] = {
            "quant_method": "fp8",
            "scale_fmt": "ue8m0",
            "weight_block_size": [BLOCK, BLOCK],
            "activation_scheme": "dynamic",
            "expert_dtype": "fp4",
        }
    d["text_config"] = text
    return d


def write_checkpoint(
    path: str | Path,
    cfg: AttnV41Cfg,
    layers: Sequence[Mapping[str, torch.Tensor]],
    shards: int,
    fp8_names: Iterable[str] = FP8_NAMES,
    seed: int = 0,
) -> Path:
    """Write a checkpoint in the released layout from runtime tensors (a test utility).

    `layers[i]` holds layer i's runtime tensors under module-relative names
    (`"wq_a.weight"`, `"compressor.wkv.weight"`, …, as `tests/conftest.py`'s
    `random_weights`; an `attn.` prefix is tolerated), checked against `cfg`'s roles.
    Writes into the directory `path`: the nested `config.json` (quantization_config at the
    root when any name is fp8), `model.safetensors.index.json` and `shards` files
    `model-000NN-of-000MM.safetensors`. Names in `fp8_names` (a subset of `FP8_NAMES`) are
    stored float8_e4m3fn with their e8m0 `.scale` (`quantize_fp8`); the others in the
    spec's dtype (the ratio>=2 compressor rounded to bf16). Each layer also gets
    `layers.{i}.attn_norm.weight` (bf16 [dim], 1 + 0.1·N(0,1) from `seed`), which loaders
    ignore. Tensors are spread over the shards in layer order, in near-equal counts, so
    a layer — even a weight and its scale — may straddle two shards. Returns `path`.
    """
    root = Path(path)
    fp8 = set(fp8_names)
    if not fp8 <= set(FP8_NAMES):
        raise ValueError(f"fp8_names = {sorted(fp8)}; allowed: a subset of {list(FP8_NAMES)}")
    if len(layers) != cfg.n_layers:
        raise ValueError(f"{len(layers)} layers; allowed: exactly n_layers = {cfg.n_layers}")
    gen = torch.Generator().manual_seed(seed)
    items: list[tuple[str, torch.Tensor]] = []
    for i, (role, w) in enumerate(zip(cfg.roles, layers)):
        AttnV41LayerWeights.from_state_dict(role, w, cfg=cfg)  # names, shapes, runtime dtypes
        norm = 1 + 0.1 * torch.randn(cfg.dim, generator=gen)
        items.append((f"layers.{i}.attn_norm.weight", norm.to(torch.bfloat16)))
        for key, t in w.items():
            rel = key.removeprefix("attn.")
            name = f"layers.{i}.attn.{rel}"
            if rel in fp8:
                q, s = quantize_fp8(t.detach().cpu())
                items += [(name, q), (name.removesuffix(".weight") + ".scale", s)]
            else:  # an fp8 name left out of fp8_names is stored bf16, already dequantized
                dtype = torch.bfloat16 if rel in FP8_NAMES else _disk_dtype("attn." + rel)
                items.append((name, t.detach().cpu().to(dtype).contiguous()))
    if not 1 <= shards <= len(items):
        raise ValueError(f"shards = {shards}; allowed: 1..{len(items)}")
    root.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        chunk = dict(items[len(items) * k // shards : len(items) * (k + 1) // shards])
        save_file(chunk, str(root / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, file))
        total += sum(t.numel() * t.element_size() for t in chunk.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    (root / "config.json").write_text(json.dumps(_hf_config(cfg, bool(fp8)), indent=2) + "\n")
    return root
