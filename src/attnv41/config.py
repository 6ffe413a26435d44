"""Model geometry of DeepSeek-V4.1 attention and the role of every layer.

`AttnV41Cfg` holds every field of attention-v41.md §1 plus the two runtime
capacities `max_tokens` (most tokens per call) and `max_seq` (positions held by
RoPE tables and caches). It is frozen and validated on construction: a bad value
raises `ValueError` naming the field, the value and the allowed range.

Readers: `v41_flash()` (the released V4.1-Flash geometry), `from_hf_config`
(the checkpoint's nested `config.json`), `from_inference_config` (the flat
`inference/config.json`), `from_golden_meta` (the golden files' metadata) and
`from_checkpoint` (a checkpoint directory or a config file).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["AttnV41Cfg", "KeyMismatchError", "LayerRole", "v41_flash"]


class KeyMismatchError(KeyError, ValueError):
    """A key of a state dict or config file that is missing, unexpected or given twice:
    a KeyError (a mapping's key) and a ValueError (bad input, what the runtime's checks
    raise), whose message reads as written (KeyError's own str() would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


# Widest decode selection (window + index_topk) the runtime launches.
MAX_DECODE_WIDTH = 2048

# Runtime capacities when neither the caller nor the config file gives them (both
# clamped to the checkpoint's max_position_embeddings by the readers).
DEFAULT_MAX_SEQ = 8192
DEFAULT_MAX_TOKENS = 4096

# Role names as the golden files spell them.
ROLE_SWA = "swa"
ROLE_FULL = "full"
ROLE_FULL_CANDIDATE = "full_candidate_source"
ROLE_REUSE = "reuse"
ROLE_REINDEX = "reindex"


@dataclass(frozen=True)
class LayerRole:
    """What one layer owns and publishes (attention-v41.md §2)."""

    layer: int
    ratio: int
    is_kv_source: bool
    is_index_source: bool
    is_candidate_source: bool
    uses_candidates: bool

    @property
    def name(self) -> str:
        """The role's name as the golden files spell it."""
        if self.ratio == 0:
            return ROLE_SWA
        if self.is_kv_source:
            return ROLE_FULL_CANDIDATE if self.is_candidate_source else ROLE_FULL
        if self.is_index_source:
            return ROLE_REINDEX
        return ROLE_REUSE


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _range_error(name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"AttnV41Cfg.{name} = {value!r}; allowed: {allowed}")


@dataclass(frozen=True)
class AttnV41Cfg:
    """Geometry of V4.1 attention (attention-v41.md §1) plus runtime capacities.

    `max_seq` and `max_tokens` left out (None) default to `min(max(8192, max_tokens),
    max_position_embeddings)` and `min(4096, max_seq)`: values that fit the geometry.
    """

    dim: int
    n_layers: int
    n_heads: int
    head_dim: int
    rope_dim: int
    q_rank: int
    o_rank: int
    groups: int
    window: int
    index_heads: int
    index_head_dim: int
    index_topk: int
    cand_blocks: int
    cand_block: int
    rope_theta: float
    compress_rope_theta: float
    rope_factor: float
    original_seq_len: int
    beta_fast: float
    beta_slow: float
    norm_eps: float
    max_position_embeddings: int
    compress_ratios: tuple[int, ...]
    kv_source_layers: tuple[int, ...]
    index_source_layers: tuple[int, ...]
    candidate_source_layer: int | None
    max_tokens: int | None = None  # default: min(4096, max_seq)
    max_seq: int | None = None  # default: min(max(8192, max_tokens), max_position_embeddings)
    roles: tuple[LayerRole, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Capacities left out get defaults that fit the geometry (never a value beyond
        # max_position_embeddings that the caller did not pass).
        mpe = self.max_position_embeddings
        if self.max_seq is None:
            mt = self.max_tokens if _is_int(self.max_tokens) else 0
            seq = min(max(DEFAULT_MAX_SEQ, mt), mpe) if _is_int(mpe) else DEFAULT_MAX_SEQ
            object.__setattr__(self, "max_seq", seq)
        if self.max_tokens is None:
            tok = min(DEFAULT_MAX_TOKENS, self.max_seq) if _is_int(self.max_seq) else DEFAULT_MAX_TOKENS
            object.__setattr__(self, "max_tokens", tok)
        # Normalise list inputs to tuples so the dataclass stays hashable. No conversion of
        # the entries: int(2.7) or int(True) would silently change the schedule.
        for name in ("compress_ratios", "kv_source_layers", "index_source_layers"):
            v = getattr(self, name)
            if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__iter__"):
                raise _range_error(name, v, "a list or tuple of integers")
            v = tuple(v)
            for i, x in enumerate(v):
                if not _is_int(x):
                    raise _range_error(f"{name}[{i}]", x, "an integer (not a bool or a float)")
            object.__setattr__(self, name, v)
        c = self.candidate_source_layer
        if c is not None and not _is_int(c):
            raise _range_error("candidate_source_layer", c, "None or an integer layer index (not a bool or a float)")
        self._validate()
        object.__setattr__(self, "roles", tuple(self._derive_role(i) for i in range(self.n_layers)))

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        positive = (
            "dim",
            "n_layers",
            "n_heads",
            "head_dim",
            "rope_dim",
            "q_rank",
            "o_rank",
            "groups",
            "window",
            "index_heads",
            "index_head_dim",
            "index_topk",
            "cand_blocks",
            "cand_block",
            "original_seq_len",
            "max_position_embeddings",
            "max_tokens",
            "max_seq",
        )
        for name in positive:
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise _range_error(name, v, "an integer >= 1")
        for name in ("rope_theta", "compress_rope_theta", "rope_factor", "beta_fast", "beta_slow", "norm_eps"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise _range_error(name, v, "a finite number > 0")
        if self.rope_theta <= 1 or self.compress_rope_theta <= 1:
            bad = "rope_theta" if self.rope_theta <= 1 else "compress_rope_theta"
            raise _range_error(bad, getattr(self, bad), "> 1")
        if self.beta_fast <= self.beta_slow:
            raise _range_error("beta_fast", self.beta_fast, f"> beta_slow ({self.beta_slow})")
        if self.head_dim % 32:
            raise _range_error("head_dim", self.head_dim, "a multiple of 32 (fp8 and fp4 blocks)")
        if self.index_head_dim % 32:
            raise _range_error("index_head_dim", self.index_head_dim, "a multiple of 32 (fp4 blocks)")
        if self.rope_dim % 2 or self.rope_dim > self.head_dim or self.rope_dim > self.index_head_dim:
            raise _range_error(
                "rope_dim",
                self.rope_dim,
                f"even and <= min(head_dim, index_head_dim) = {min(self.head_dim, self.index_head_dim)}",
            )
        if self.n_heads % self.groups:
            raise _range_error("groups", self.groups, f"a divisor of n_heads ({self.n_heads})")
        if self.window + self.index_topk > MAX_DECODE_WIDTH:
            raise _range_error(
                "index_topk",
                self.index_topk,
                f"<= {MAX_DECODE_WIDTH - self.window} (window ({self.window}) + index_topk <= {MAX_DECODE_WIDTH}, "
                f"the runtime's fixed decode launch width)",
            )
        # Blame the field that breaks the limit: max_seq beyond the checkpoint first, then a
        # max_tokens beyond it (whatever max_seq is), then the order between the two.
        mpe = self.max_position_embeddings
        seq_allowed = f"max_tokens ({self.max_tokens}) <= max_seq <= max_position_embeddings ({mpe})"
        if self.max_seq > mpe:
            raise _range_error("max_seq", self.max_seq, seq_allowed)
        if self.max_tokens > mpe:
            raise _range_error("max_tokens", self.max_tokens, f"<= max_position_embeddings ({mpe})")
        if self.max_tokens > self.max_seq:
            raise _range_error("max_seq", self.max_seq, seq_allowed)
        if len(self.compress_ratios) != self.n_layers:
            raise _range_error("compress_ratios", self.compress_ratios, f"exactly n_layers ({self.n_layers}) entries")
        for i, r in enumerate(self.compress_ratios):
            if r < 0 or r > 128:
                raise _range_error(f"compress_ratios[{i}]", r, "0 (window only) or 1..128")
        for name in ("kv_source_layers", "index_source_layers"):
            layers = getattr(self, name)
            if list(layers) != sorted(set(layers)):
                raise _range_error(name, layers, "strictly increasing layer indices")
            for i in layers:
                if not 0 <= i < self.n_layers:
                    raise _range_error(name, layers, f"layer indices in 0..{self.n_layers - 1}")
                if self.compress_ratios[i] == 0:
                    raise _range_error(name, layers, f"layers with compress ratio > 0 (layer {i} has 0)")
        missing = [i for i in self.kv_source_layers if i not in self.index_source_layers]
        if missing:
            raise _range_error(
                "index_source_layers",
                self.index_source_layers,
                f"a superset of kv_source_layers (a kv source also indexes; missing {missing})",
            )
        c = self.candidate_source_layer
        if c is not None and c not in self.kv_source_layers:
            raise _range_error("candidate_source_layer", c, f"None or one of kv_source_layers {self.kv_source_layers}")
        # Every ratio>0 layer reads the latest kv source's compressed rows and the latest
        # index source's selection; both must exist and share its ratio.
        for i, r in enumerate(self.compress_ratios):
            if r == 0:
                continue
            for name in ("kv_source_layers", "index_source_layers"):
                before = [j for j in getattr(self, name) if j <= i]
                if not before:
                    raise _range_error(
                        name,
                        getattr(self, name),
                        f"a source at or before layer {i} (compress ratio {r})",
                    )
                if self.compress_ratios[before[-1]] != r:
                    raise _range_error(
                        name,
                        getattr(self, name),
                        f"the latest source before layer {i} (layer {before[-1]}, ratio "
                        f"{self.compress_ratios[before[-1]]}) to have layer {i}'s ratio {r}",
                    )
        # A reindex layer masks its scores with the candidate source's mask, one entry per
        # compressed row of the candidate source: both must count rows with the same ratio.
        if c is not None:
            for i in self.index_source_layers:
                if i > c and i not in self.kv_source_layers and self.compress_ratios[i] != self.compress_ratios[c]:
                    raise _range_error(
                        "candidate_source_layer",
                        c,
                        f"a layer whose compress ratio ({self.compress_ratios[c]}) equals that of every later "
                        f"reindex layer (layer {i}, which uses its candidates, has ratio {self.compress_ratios[i]})",
                    )

    def _derive_role(self, i: int) -> LayerRole:
        kv = i in self.kv_source_layers
        ix = i in self.index_source_layers
        cand = self.candidate_source_layer == i
        uses = ix and not kv and self.candidate_source_layer is not None and i > self.candidate_source_layer
        return LayerRole(i, self.compress_ratios[i], kv, ix, cand, uses)

    # ------------------------------------------------------------------ derived
    @property
    def group_width(self) -> int:
        """Width of one output group, n_heads·head_dim / groups."""
        return self.n_heads * self.head_dim // self.groups

    def kv_source_of(self, layer: int) -> int | None:
        """The kv source whose compressed rows layer `layer` attends to (itself or the latest
        before it; None on ratio-0 layers): static wiring, validated on construction."""
        if self.compress_ratios[self.role(layer).layer] == 0:
            return None
        return max(j for j in self.kv_source_layers if j <= layer)

    def index_source_of(self, layer: int) -> int | None:
        """The index source whose selection layer `layer` attends with (itself or the latest
        before it; None on ratio-0 layers)."""
        if self.compress_ratios[self.role(layer).layer] == 0:
            return None
        return max(j for j in self.index_source_layers if j <= layer)

    def role(self, layer: int) -> LayerRole:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer = {layer!r}; allowed: an int 0..{self.n_layers - 1}")
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer = {layer}; allowed: 0..{self.n_layers - 1}")
        return self.roles[layer]

    def replace(self, **changes: Any) -> AttnV41Cfg:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        for k in ("compress_ratios", "kv_source_layers", "index_source_layers"):
            d[k] = list(d[k])
        return d

    # ------------------------------------------------------------------ readers
    @classmethod
    def from_inference_config(cls, d: dict[str, Any], **overrides: Any) -> AttnV41Cfg:
        """From the flat `inference/config.json` (the released code's `ModelArgs` names).

        `overrides` replace fields. Runtime capacities not given fit the checkpoint:
        `max_seq` defaults to the file's `max_seq_len`, else to
        `min(max(8192, max_tokens), max_position_embeddings)`; `max_tokens` defaults to
        `min(4096, max_seq)`. A `max_seq` given explicitly is validated as given.
        """
        if not isinstance(d, dict):
            raise TypeError(f"config = {type(d).__name__}; allowed: a JSON object (dict)")
        # No conversions: int(6.7), int("6") or float(True) would silently change the model;
        # the constructor checks every value's type (numbers: int or float, not bool).
        n_layers = _need(d, "n_layers")
        if not _is_int(n_layers) or n_layers < 1:
            raise _range_error("n_layers", n_layers, "an integer >= 1")
        mpe = d.get("max_position_embeddings", 1 << 20)
        if not _is_int(mpe) or mpe < 1:
            raise _range_error("max_position_embeddings", mpe, "an integer >= 1")
        if "max_seq" in overrides:
            max_seq = overrides.pop("max_seq")
        elif "max_seq_len" in d:
            max_seq = d["max_seq_len"]
        else:
            # The default must fit the checkpoint (and an explicit max_tokens): a value the
            # caller never passed must not be what the validation refuses.
            max_tokens = overrides.get("max_tokens")
            max_seq = min(max(DEFAULT_MAX_SEQ, max_tokens if _is_int(max_tokens) else 0), mpe)
        # (a max_seq that is no integer is refused by the validation, naming it)
        max_tokens = overrides.pop("max_tokens", min(DEFAULT_MAX_TOKENS, max_seq) if _is_int(max_seq) else 1)
        kw = dict(
            dim=_need(d, "dim"),
            n_layers=n_layers,
            n_heads=_need(d, "n_heads"),
            head_dim=_need(d, "head_dim"),
            rope_dim=_need(d, "rope_head_dim"),
            q_rank=_need(d, "q_lora_rank"),
            o_rank=_need(d, "o_lora_rank"),
            groups=_need(d, "o_groups"),
            window=_need(d, "window_size"),
            index_heads=_need(d, "index_n_heads"),
            index_head_dim=_need(d, "index_head_dim"),
            index_topk=_need(d, "index_topk"),
            cand_blocks=_need(d, "candidate_topk_blocks"),
            cand_block=_need(d, "candidate_block_size"),
            rope_theta=_number(d, "rope_theta"),
            compress_rope_theta=_number(d, "compress_rope_theta"),
            rope_factor=_number(d, "rope_factor"),
            original_seq_len=_need(d, "original_seq_len"),
            beta_fast=_number(d, "beta_fast"),
            beta_slow=_number(d, "beta_slow"),
            norm_eps=_number(d, "norm_eps"),
            max_position_embeddings=mpe,
            compress_ratios=_need(d, "compress_ratios"),
            kv_source_layers=_need(d, "kv_source_layers"),
            index_source_layers=_need(d, "index_source_layers"),
            # required: a missing key would silently drop the reindex layers' candidate mask (null: none)
            candidate_source_layer=_need(d, "candidate_source_layer"),
            max_seq=max_seq,
            max_tokens=max_tokens,
        )
        ratios = kw["compress_ratios"]
        if not isinstance(ratios, (list, tuple)):
            raise _range_error("compress_ratios", ratios, "a list of integers")
        # The released list also covers the draft stages after the backbone (ratio 0).
        if len(ratios) < n_layers or any(r != 0 or not _is_int(r) for r in ratios[n_layers:]):
            raise _range_error(
                "compress_ratios", ratios, f"{n_layers} entries (n_layers), then only the draft stages' zeros"
            )
        kw["compress_ratios"] = tuple(ratios[:n_layers])
        kw.update(overrides)
        return cls(**kw)

    @classmethod
    def from_hf_config(cls, d: dict[str, Any], **overrides: Any) -> AttnV41Cfg:
        """From a checkpoint's nested `config.json` (model keys under `text_config`).

        Defaults of `max_seq` and `max_tokens` as `from_inference_config`: at most the
        checkpoint's `max_position_embeddings`.
        """
        if not isinstance(d, dict):
            raise TypeError(f"config.json = {type(d).__name__}; allowed: a JSON object")
        t = d.get("text_config", d)
        if not isinstance(t, dict):
            raise TypeError(f"config.json text_config = {t!r}; allowed: a JSON object")
        rs = t.get("rope_scaling") or {}
        if not isinstance(rs, dict):
            raise TypeError(f"config.json rope_scaling = {rs!r}; allowed: a JSON object")
        if rs and rs.get("rope_type", rs.get("type")) not in ("yarn", None):
            raise ValueError(f"config.json rope_scaling.rope_type = {rs.get('rope_type')!r}; allowed: 'yarn'")
        flat = dict(
            dim=_need(t, "hidden_size"),
            n_layers=_need(t, "num_hidden_layers"),
            n_heads=_need(t, "num_attention_heads"),
            head_dim=_need(t, "head_dim"),
            rope_head_dim=_need(t, "qk_rope_head_dim"),
            q_lora_rank=_need(t, "q_lora_rank"),
            o_lora_rank=_need(t, "o_lora_rank"),
            o_groups=_need(t, "o_groups"),
            window_size=_need(t, "sliding_window"),
            compress_ratios=_need(t, "compress_ratios"),
            kv_source_layers=_need(t, "kv_source_layer_ids"),
            index_source_layers=_need(t, "index_source_layer_ids"),
            candidate_source_layer=_need(t, "candidate_source_layer_id"),
            candidate_topk_blocks=_need(t, "candidate_topk_blocks"),
            candidate_block_size=_need(t, "candidate_block_size"),
            index_n_heads=_need(t, "index_n_heads"),
            index_head_dim=_need(t, "index_head_dim"),
            index_topk=_need(t, "index_topk"),
            norm_eps=_need(t, "rms_norm_eps"),
            rope_theta=_need(t, "rope_theta"),
            compress_rope_theta=_need(t, "compress_rope_theta"),
            rope_factor=_need(rs, "factor", "rope_scaling."),
            original_seq_len=_need(rs, "original_max_position_embeddings", "rope_scaling."),
            beta_fast=_need(rs, "beta_fast", "rope_scaling."),
            beta_slow=_need(rs, "beta_slow", "rope_scaling."),
            max_position_embeddings=_need(t, "max_position_embeddings"),
        )
        return cls.from_inference_config(flat, **overrides)

    @classmethod
    def from_golden_meta(cls, meta: dict[str, Any], **overrides: Any) -> AttnV41Cfg:
        """From the `config` entry of a golden file's metadata (already JSON-decoded or not)."""
        c = meta["config"] if "config" in meta else meta
        if isinstance(c, str):
            c = json.loads(c)
        c = dict(c)
        overrides.setdefault("max_tokens", int(c["max_seq_len"]))
        # The golden configs keep max_seq_len far below the released maximum.
        c.setdefault("max_position_embeddings", max(int(c["max_seq_len"]), 1 << 20))
        return cls.from_inference_config(c, **overrides)

    @classmethod
    def from_checkpoint(cls, path: str | Path, **overrides: Any) -> AttnV41Cfg:
        """From a checkpoint directory (`config.json`, else `inference/config.json`) or a config file.

        `overrides` replace fields. Without them `max_seq = min(8192,
        max_position_embeddings)` and `max_tokens = min(4096, max_seq)` (see
        `from_inference_config`), so the defaults fit any checkpoint; an explicit `max_seq`
        above `max_position_embeddings` raises naming `max_seq`. A file that is not valid
        JSON raises `attnv41.checkpoint.CheckpointError` naming the file.
        """
        p = Path(path)
        if p.is_dir():
            for cand in (p / "config.json", p / "inference" / "config.json"):
                if cand.is_file():
                    p = cand
                    break
            else:
                raise FileNotFoundError(f"{path}: no config.json or inference/config.json")
        d = _read_json(p)
        if "text_config" in d or "hidden_size" in d:
            return cls.from_hf_config(d, **overrides)
        return cls.from_inference_config(d, **overrides)


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a checkpoint's file; `CheckpointError` naming the file otherwise."""
    from .checkpoint import CheckpointError  # checkpoint imports this module

    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: top-level JSON value is a {type(d).__name__}; allowed: an object")
    return d


def _need(d: dict[str, Any], key: str, prefix: str = "") -> Any:
    if key not in d:
        raise KeyMismatchError(f"config key '{prefix}{key}' is missing")
    return d[key]


def _number(d: dict[str, Any], key: str) -> Any:
    """A float field's value as a float when it is a number (an int or a float, not a
    bool); anything else as it is, for the constructor to refuse, naming it."""
    v = _need(d, key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def v41_flash(max_tokens: int = 4096, max_seq: int | None = None) -> AttnV41Cfg:
    """The released DeepSeek-V4.1-Flash attention geometry (attention-v41.md §1). `max_seq`
    left out: min(max(8192, max_tokens), max_position_embeddings), the config's default (so
    a large `max_tokens` alone is not refused for a capacity the caller never passed)."""
    return AttnV41Cfg(
        dim=5120,
        n_layers=40,
        n_heads=64,
        head_dim=512,
        rope_dim=64,
        q_rank=1280,
        o_rank=1024,
        groups=8,
        window=128,
        index_heads=32,
        index_head_dim=128,
        index_topk=512,
        cand_blocks=2048,
        cand_block=8,
        rope_theta=10000.0,
        compress_rope_theta=160000.0,
        rope_factor=16.0,
        original_seq_len=65536,
        beta_fast=32.0,
        beta_slow=1.0,
        norm_eps=1e-20,
        max_position_embeddings=1 << 20,
        compress_ratios=(0, 0) + (2,) * 18 + (1,) * 20,
        kv_source_layers=(2, 8, 14, 20),
        index_source_layers=(2, 8, 14, 20, 24, 28, 32, 36),
        candidate_source_layer=20,
        max_tokens=max_tokens,
        max_seq=max_seq,
    )
