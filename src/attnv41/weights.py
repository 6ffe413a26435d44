"""`AttnV41LayerWeights`: one layer's attention tensors under their checkpoint names.

Names are relative to the layer (`attn.wq_a.weight`, `attn.compressor.wkv.weight`,
`attn.indexer.wq_b.weight`, `attn.attn_sink`, ...), as in the released checkpoint
without the `layers.{i}.` prefix. Runtime dtypes (attention-v41.md §1–§2): bf16
projections, fp32 sink, the ratio>=2 compressor in fp32, norm weights as given (bf16
or fp32; both hold the same values). No compute here beyond the checks of names,
shapes, dtypes and finite values, done once when the weights are built.

Two weight formats (`WEIGHT_FORMATS`), one per layer, told apart by the tensors:
"bf16" (every linear bf16, as above) and "fp8", the released checkpoint's (golden
README, v41_fp8): each linear of `FP8_LINEARS` is float8_e4m3fn `<name>.weight [out, in]`
plus `<name>.scale`, float8_e8m0fnu `[ceil(out/32), in/32]` (the checkpoint's and the
golden file's dtype: byte E means 2^(E−127)), run by the released FP8 linear. `wo_a`
runs in bf16 (its input is not quantized), as in the released code, whose conversion holds
its exact bf16 dequantization; given FP8 with its scale (the checkpoint's bytes) it is kept
as the bytes by default (`wo_a="fp8"`: half the memory; the runtime reads them as the same
exact bf16 values: the same math, the CPU path the same bits), except where the geometry's
`o_rank` or `group_width` is not a multiple of 32 (a scale block across two groups), or
held as that bf16 with `wo_a="bf16"`. Everything else is as in "bf16".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .config import AttnV41Cfg, KeyMismatchError, LayerRole, v41_flash

__all__ = [
    "FP8_LINEARS",
    "WEIGHT_FORMATS",
    "WO_A_FORMATS",
    "AttnV41LayerWeights",
    "NonFiniteWeightError",
    "describe_nonfinite",
    "expected_tensors",
]

PREFIX = "attn."
WEIGHT_FORMATS = ("bf16", "fp8")
WO_A_FORMATS = ("bf16", "fp8")  # how an FP8 wo_a is held (`from_state_dict(wo_a=)`)
# The linears the released checkpoint runs in FP8 (relative to `attn.`, without `.weight`).
FP8_LINEARS = ("wq_a", "wq_b", "wkv", "wo_b", "indexer.wq_b")
FP8_BLOCK = 32  # weight scale block edge and activation quantization block
_STANDIN = v41_flash()  # names and dtypes do not depend on the geometry
_NORM_DTYPES = (torch.bfloat16, torch.float32)


def expected_tensors(
    cfg: AttnV41Cfg | None, role: LayerRole, weights: str = "bf16"
) -> dict[str, tuple[tuple[int, ...] | None, tuple[torch.dtype, ...]]]:
    """Checkpoint name (relative to the layer) → (shape, allowed runtime dtypes) for a
    role and a weight format (`WEIGHT_FORMATS`); shapes are None without a geometry.
    "fp8" makes the role's `FP8_LINEARS` float8_e4m3fn and adds their `.scale`."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights = {weights!r}; allowed: {WEIGHT_FORMATS}")
    if cfg is None:
        return {k: (None, dt) for k, (_, dt) in expected_tensors(_STANDIN, role, weights).items()}
    H, D, G = cfg.n_heads, cfg.head_dim, cfg.groups
    bf16 = (torch.bfloat16,)
    e: dict[str, tuple[tuple[int, ...] | None, tuple[torch.dtype, ...]]] = {
        "attn.wq_a.weight": ((cfg.q_rank, cfg.dim), bf16),
        "attn.q_norm.weight": ((cfg.q_rank,), _NORM_DTYPES),
        "attn.wq_b.weight": ((H * D, cfg.q_rank), bf16),
        "attn.wkv.weight": ((D, cfg.dim), bf16),
        "attn.kv_norm.weight": ((D,), _NORM_DTYPES),
        # bf16, or the checkpoint's e4m3 with its scale (`attn.wo_a.scale`, checked by from_state_dict)
        "attn.wo_a.weight": ((G * cfg.o_rank, cfg.group_width), (torch.bfloat16, torch.float8_e4m3fn)),
        "attn.wo_b.weight": ((cfg.dim, G * cfg.o_rank), bf16),
        "attn.attn_sink": ((H,), (torch.float32,)),
    }
    if role.is_kv_source:
        comp = (torch.float32,) if role.ratio >= 2 else bf16
        e["attn.compressor.wkv.weight"] = ((D, cfg.dim), comp)
        if role.ratio >= 2:
            e["attn.compressor.wgate.weight"] = ((D, cfg.dim), comp)
        e["attn.compressor.norm.weight"] = ((D,), _NORM_DTYPES)
        e["attn.indexer.wk.weight"] = ((cfg.index_head_dim, D), bf16)
        e["attn.indexer.k_norm.weight"] = ((cfg.index_head_dim,), _NORM_DTYPES)
    if role.is_index_source:
        e["attn.indexer.wq_b.weight"] = ((cfg.index_heads * cfg.index_head_dim, cfg.q_rank), bf16)
        e["attn.indexer.weights_proj.weight"] = ((cfg.index_heads, cfg.dim), bf16)
    if weights == "fp8":
        for n in _fp8_linears(role):
            shape, _ = e[f"{PREFIX}{n}.weight"]
            e[f"{PREFIX}{n}.weight"] = (shape, (torch.float8_e4m3fn,))
            e[f"{PREFIX}{n}.scale"] = (_scale_grid(shape), (torch.float8_e8m0fnu,))
    return e


def _fp8_linears(role: LayerRole) -> tuple[str, ...]:
    return tuple(n for n in FP8_LINEARS if n != "indexer.wq_b" or role.is_index_source)


def _scale_grid(shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
    if shape is None:
        return None
    return (-(-shape[0] // FP8_BLOCK), -(-shape[1] // FP8_BLOCK))


def _fp8_bad_bytes(t: torch.Tensor) -> str | None:
    """None when an e4m3 weight holds no NaN byte (0x7F/0xFF) and an e8m0 scale no 0xFF
    (NaN); else what is wrong and what is allowed."""
    b = t.view(torch.uint8)
    if t.dtype == torch.float8_e4m3fn:
        bad, what, allowed = (b & 0x7F) == 0x7F, "NaN byte", "finite e4m3 values"
    else:
        bad, what, allowed = b == 0xFF, "byte 0xFF (NaN)", "0x00..0xFE (2^-127..2^127)"
    if not bool(bad.any()):
        return None
    n = int(bad.sum())
    return f"{n} {what}{'s' if n > 1 else ''} (first at {bad.nonzero()[0].tolist()}); allowed: {allowed}"


# The smallest e8m0 scale byte whose block can dequantize to ±inf: e4m3 values reach 448 =
# 1.75·2^8, and 1.75·2^(8 + S − 127) rounds to bf16 ±inf from S − 127 = 120 on.
_OVERFLOW_SCALE_BYTE = 0xF7


def _fp8_overflow(w: torch.Tensor, sc: torch.Tensor) -> str | None:
    """None when the e4m3 weight `w` times its e8m0 block scale `sc` is finite in bf16 (the
    released conversion's values, `reference.fp8.dequant_weight`), else what is wrong.
    Only blocks with a scale byte >= 0xF7 can overflow; the product is formed only then."""
    s = sc.view(torch.uint8)
    if not bool((s >= _OVERFLOW_SCALE_BYTE).any()):
        return None
    from .reference.fp8 import dequant_weight  # noqa: PLC0415

    detail = describe_nonfinite(dequant_weight(w, sc, FP8_BLOCK, check=False))
    if detail is None:
        return None
    return f"{detail} (after dequantization; scale bytes up to 0x{int(s.max()):02X})"


def _weight_format(role: LayerRole, got: Mapping[str, torch.Tensor]) -> str:
    """The layer's format from its tensors: "fp8" when its FP8 linears are float8_e4m3fn
    or carry a scale, "bf16" when none does; a mix, or a scale on another tensor, raises."""
    lin = _fp8_linears(role)
    stray = sorted(k for k in got if k.endswith(".scale") and k.removeprefix(PREFIX).removesuffix(".scale") not in lin)
    if stray:
        raise KeyMismatchError(
            f"layer {role.layer}: {stray[0]!r} is a scale on a tensor that does not run in FP8; "
            f"allowed scales: {[f'{PREFIX}{n}.scale' for n in lin]} and attn.wo_a.scale"
        )
    fp8 = {
        n: f"{PREFIX}{n}.scale" in got or getattr(got.get(f"{PREFIX}{n}.weight"), "dtype", None) == torch.float8_e4m3fn
        for n in lin
    }
    if all(fp8.values()):
        return "fp8"
    if any(fp8.values()):
        a = next(n for n in lin if fp8[n])
        b = next(n for n in lin if not fp8[n])
        raise ValueError(
            f"layer {role.layer}: {PREFIX}{a} is FP8 but {PREFIX}{b}.weight is bf16 without a scale; allowed: "
            f"every FP8 linear of the layer ({', '.join(lin)}) in one format, {WEIGHT_FORMATS}"
        )
    return "bf16"


def _take_wo_a_scale(role: LayerRole, got: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """`attn.wo_a.scale` taken out of `got` after checking the pair: float8_e4m3fn
    `attn.wo_a.weight` with a float8_e8m0fnu scale of its block grid, no NaN byte in either
    (None when wo_a is given without a scale, which must then be bf16: checked by the spec)."""
    k, ks = f"{PREFIX}wo_a.weight", f"{PREFIX}wo_a.scale"
    sc = got.pop(ks, None)
    w = got.get(k)
    if sc is None:
        if w is not None and w.dtype == torch.float8_e4m3fn:
            raise KeyMismatchError(
                f"layer {role.layer}: {k} is float8_e4m3fn without its scale {ks!r}; allowed: "
                "float8_e4m3fn with a float8_e8m0fnu scale, or bf16 without one"
            )
        return None
    if w is None or w.dtype != torch.float8_e4m3fn or sc.dtype != torch.float8_e8m0fnu:
        raise TypeError(
            f"layer {role.layer}: {k} {getattr(w, 'dtype', 'missing')} with {ks} {sc.dtype}; allowed: "
            "float8_e4m3fn with a float8_e8m0fnu scale, or bf16 without a scale"
        )
    grid = _scale_grid(tuple(w.shape)) if w.dim() == 2 else None
    if w.dim() != 2 or w.shape[1] % FP8_BLOCK or tuple(sc.shape) != grid:
        raise ValueError(
            f"layer {role.layer}: {ks}.shape = {tuple(sc.shape)} for {k} {list(w.shape)}; allowed: a 2-D weight "
            f"[out, in] with in a multiple of {FP8_BLOCK} and its scale {grid}"
        )
    for t, name in ((w, k), (sc, ks)):
        detail = _fp8_bad_bytes(t)
        if detail is not None:
            raise NonFiniteWeightError(role.layer, name, detail)
    detail = _fp8_overflow(w, sc)
    if detail is not None:
        raise NonFiniteWeightError(role.layer, k, detail)
    return sc


class NonFiniteWeightError(ValueError):
    """A weight holding NaN or ±inf. `key`: its name relative to the layer; `detail`: the
    count, the first index and what is allowed."""

    def __init__(self, layer: int, key: str, detail: str):
        super().__init__(f"layers.{layer}.{key}: {detail}")
        self.layer, self.key, self.detail = layer, key, detail


def describe_nonfinite(t: torch.Tensor) -> str | None:
    """None when every value of `t` is finite, else "<n> non-finite values (first at [i, j]);
    allowed: finite"."""
    bad = ~torch.isfinite(t)
    if not bool(bad.any()):
        return None
    n = int(bad.sum())
    return f"{n} non-finite value{'s' if n > 1 else ''} (first at {bad.nonzero()[0].tolist()}); allowed: finite"


def _canonical(name: str) -> str:
    return name if name.startswith(PREFIX) else PREFIX + name


@dataclass
class AttnV41LayerWeights:
    """The role plus every tensor the role needs, keyed by checkpoint name."""

    role: LayerRole
    tensors: dict[str, torch.Tensor]

    @classmethod
    def from_state_dict(
        cls,
        role: LayerRole,
        tensors: Mapping[str, torch.Tensor],
        cfg: AttnV41Cfg | None = None,
        device: torch.device | str | None = None,
        wo_a: str = "fp8",
    ) -> AttnV41LayerWeights:
        """Take a layer's tensors (names with or without the `attn.` prefix).

        `wo_a` (`WO_A_FORMATS`), for a `wo_a` given FP8 with its scale: "fp8" (default)
        keeps the checkpoint's bytes (half the memory: 1.3 GB less over the 40 Flash
        layers), read as their exact bf16 values; "bf16" holds that exact bf16
        dequantization, as the released conversion does. The same math either way (the CPU
        path the same bits; the batched runtime's products the same bytes); the
        single-sequence GPU decode reads the bytes through the grouped FP8 GEMV (another
        summation order, within the golden tolerance). Faster in both runtimes
        (BENCHMARKS.md, 2026-12-05 thirty-first entry, H100, FP8 weights, 32K: the
        single-sequence step 3.82 → 3.37 ms, 13.3 against cuBLAS's 25.7 µs per layer; the
        batched step 5.66 → 5.49 ms at B = 1 and 9.40 → 9.23 at B = 64).

        Upcasts the ratio>=2 compressor to fp32 (the checkpoint stores it bf16) and holds an
        FP8 `wo_a` given with its scale as `wo_a` says (checked; module doc). The format ("bf16" or "fp8", see
        the module doc) follows from the tensors; a mix, an e4m3 weight without its scale
        or a scale on a linear that does not run in FP8 raises. With `cfg`, checks every
        name, shape and dtype against the role and raises naming the tensor; without it,
        checks names only (the runtime checks shapes on use), and FP8 scales against
        their weights. Either way a tensor holding NaN or ±inf (an e4m3 NaN byte, an e8m0
        0xFF) raises `NonFiniteWeightError` (a ValueError) naming it,
        `layers.{i}.attn.<name>`.
        """
        if not isinstance(role, LayerRole):
            raise TypeError(f"role is a {type(role).__name__}; allowed: a LayerRole (cfg.roles[i])")
        if cfg is not None and (not 0 <= role.layer < cfg.n_layers or cfg.roles[role.layer] != role):
            want = cfg.roles[role.layer] if 0 <= role.layer < cfg.n_layers else f"layer 0..{cfg.n_layers - 1}"
            raise ValueError(f"role {role}; allowed: the config's role for its layer ({want})")
        if not isinstance(tensors, Mapping):
            raise TypeError(f"tensors is a {type(tensors).__name__}; allowed: a mapping of names to torch.Tensor")
        got: dict[str, torch.Tensor] = {}
        given: dict[str, str] = {}  # canonical name -> the name given
        for k, v in tensors.items():
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"layer {role.layer}: {k!r} is a {type(v).__name__}; allowed: a torch.Tensor")
            if v.is_meta:
                raise ValueError(f"layer {role.layer}: {k!r} is on the meta device (no data); allowed: real tensors")
            c = _canonical(k)
            if c in got:  # 'wq_a.weight' and 'attn.wq_a.weight': which one is meant is not known
                raise KeyMismatchError(
                    f"layer {role.layer}: {given[c]!r} and {k!r} both name {c!r}; allowed: one of them"
                )
            got[c], given[c] = v, k
        if role.is_kv_source and role.ratio >= 2:
            for k in ("attn.compressor.wkv.weight", "attn.compressor.wgate.weight"):
                if k in got and got[k].dtype == torch.bfloat16:
                    got[k] = got[k].float()
        if wo_a not in WO_A_FORMATS:
            raise ValueError(f"wo_a = {wo_a!r}; allowed: {WO_A_FORMATS}")
        wo_a_scale = _take_wo_a_scale(role, got)
        across = cfg is not None and (cfg.o_rank % FP8_BLOCK or cfg.group_width % FP8_BLOCK)
        if wo_a_scale is not None and (wo_a == "bf16" or across):
            # the exact bf16 (the released conversion's values); also where scale blocks straddle
            # the groups (the grouped kernels read whole blocks per group)
            from .reference.fp8 import dequant_weight  # noqa: PLC0415

            k = f"{PREFIX}wo_a.weight"
            got[k] = dequant_weight(got[k], wo_a_scale, FP8_BLOCK, name=f"layer {role.layer}: {k}")
            wo_a_scale = None
        fmt = _weight_format(role, got)
        if fmt == "fp8":
            for n in _fp8_linears(role):
                wk, sk = f"{PREFIX}{n}.weight", f"{PREFIX}{n}.scale"
                if wk in got and sk not in got:
                    raise KeyMismatchError(
                        f"layer {role.layer}: {wk} is {got[wk].dtype} without its scale {sk!r}; allowed: "
                        "float8_e4m3fn with a float8_e8m0fnu scale, or bf16 without one (every FP8 linear alike)"
                    )
        spec = expected_tensors(cfg, role, fmt)
        missing = sorted(set(spec) - set(got))
        extra = sorted(set(got) - set(spec))
        if missing:
            raise KeyMismatchError(
                f"layer {role.layer} ({role.name}): tensor {missing[0]!r} is missing (missing: {missing})"
            )
        if extra:
            raise KeyMismatchError(
                f"layer {role.layer} ({role.name}): unexpected tensor {extra[0]!r} for this role "
                f"(allowed: {sorted(spec)})"
            )
        for k, (shape, dtypes) in spec.items():
            t = got[k]
            if t.dtype not in dtypes:
                raise TypeError(f"layer {role.layer}: {k}.dtype = {t.dtype}; allowed: {list(dtypes)}")
            if shape is not None and tuple(t.shape) != shape:
                raise ValueError(f"layer {role.layer}: {k}.shape = {tuple(t.shape)}; allowed: {shape}")
        if fmt == "fp8":  # without cfg too: each scale against its weight, K in whole blocks
            for n in _fp8_linears(role):
                wt, sc = got[f"{PREFIX}{n}.weight"], got[f"{PREFIX}{n}.scale"]
                if wt.dim() != 2 or wt.shape[1] % FP8_BLOCK:
                    raise ValueError(
                        f"layer {role.layer}: {PREFIX}{n}.weight.shape = {tuple(wt.shape)}; allowed: [out, in] with "
                        f"in a multiple of {FP8_BLOCK} (FP8 activations are quantized per {FP8_BLOCK} columns)"
                    )
                grid = _scale_grid(tuple(wt.shape))
                if tuple(sc.shape) != grid:
                    raise ValueError(
                        f"layer {role.layer}: {PREFIX}{n}.scale.shape = {tuple(sc.shape)}; allowed: {grid} for "
                        f"{PREFIX}{n}.weight {list(wt.shape)}"
                    )
        for k in spec:  # every tensor is float (dtypes checked above); once per construction, never per forward
            t = got[k]
            if t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu):  # isfinite does not take fp8
                detail = _fp8_bad_bytes(t)
                if detail is not None:
                    raise NonFiniteWeightError(role.layer, k, detail)
                continue
            detail = describe_nonfinite(t)
            if detail is not None:
                raise NonFiniteWeightError(role.layer, k, detail)
        if fmt == "fp8":  # a finite byte times a finite scale can still overflow (released conversion's rule)
            for n in _fp8_linears(role):
                detail = _fp8_overflow(got[f"{PREFIX}{n}.weight"], got[f"{PREFIX}{n}.scale"])
                if detail is not None:
                    raise NonFiniteWeightError(role.layer, f"{PREFIX}{n}.weight", detail)
        if wo_a_scale is not None:
            got[f"{PREFIX}wo_a.scale"] = wo_a_scale
        if device is not None:
            got = {k: v.to(device) for k, v in got.items()}
        return cls(role, got)

    @classmethod
    def from_checkpoint(
        cls,
        path,
        layer: int,
        cfg: AttnV41Cfg | None = None,
        device: torch.device | str = "cpu",
        weights: str | None = None,
    ) -> AttnV41LayerWeights:
        """Layer `layer` from a checkpoint directory in the released layout, in the
        checkpoint's own format by default (None), or `weights="bf16"` (fp8 weights
        dequantized) or `"fp8"` (e4m3 with their scales; see `attnv41.checkpoint.load_layer`)."""
        from .checkpoint import load_layer  # checkpoint imports this module

        return load_layer(path, layer, cfg=cfg, device=device, weights=weights)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The runtime tensors under the checkpoint's names relative to the layer (FP8
        weights with their `.scale`; `wo_a` bf16, or e4m3 with its `.scale` as given)."""
        return dict(self.tensors)

    @property
    def format(self) -> str:
        """ "fp8" when the FP8 linears hold e4m3 weights with scales, else "bf16"."""
        return "fp8" if f"{PREFIX}wq_a.scale" in self.tensors else "bf16"

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[_canonical(name)]

    def get(self, name: str) -> torch.Tensor | None:
        return self.tensors.get(_canonical(name))

    @property
    def device(self) -> torch.device:
        return self.tensors["attn.wq_a.weight"].device

    def to(self, device) -> AttnV41LayerWeights:
        return AttnV41LayerWeights(self.role, {k: v.to(device) for k, v in self.tensors.items()})
