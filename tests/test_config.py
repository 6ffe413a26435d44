import dataclasses
import json

import pytest

from attnv41.config import AttnV41Cfg, v41_flash
from helpers import golden_path, small_cfg


def test_flash_preset_geometry_and_roles():
    cfg = v41_flash()
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.head_dim, cfg.rope_dim) == (5120, 40, 64, 512, 64)
    assert (cfg.q_rank, cfg.o_rank, cfg.groups, cfg.group_width, cfg.window) == (1280, 1024, 8, 4096, 128)
    assert (cfg.index_heads, cfg.index_head_dim, cfg.index_topk, cfg.cand_blocks, cfg.cand_block) == (
        32,
        128,
        512,
        2048,
        8,
    )
    names = [r.name for r in cfg.roles]
    assert names[:2] == ["swa", "swa"]
    assert [i for i, n in enumerate(names) if n == "full"] == [2, 8, 14]
    assert names[20] == "full_candidate_source"
    assert [i for i, n in enumerate(names) if n == "reindex"] == [24, 28, 32, 36]
    assert names.count("reuse") == 40 - 2 - 4 - 4
    assert all(r.ratio == 2 for r in cfg.roles[2:20]) and all(r.ratio == 1 for r in cfg.roles[20:])
    assert [r.layer for r in cfg.roles if r.uses_candidates] == [24, 28, 32, 36]


def test_golden_roles_derived():
    cfg = small_cfg()
    assert [r.name for r in cfg.roles] == ["swa", "full", "reuse", "full_candidate_source", "reuse", "reindex"]


@pytest.mark.parametrize(
    "change, field, allowed",
    [
        (dict(rope_dim=7), "rope_dim", "even"),
        (dict(head_dim=48), "head_dim", "multiple of 32"),
        (dict(index_head_dim=40), "index_head_dim", "multiple of 32"),
        (dict(groups=3), "groups", "divisor of n_heads"),
        (dict(max_tokens=128, max_seq=64), "max_seq", "max_tokens"),
        (dict(max_seq=1 << 21, max_tokens=64), "max_seq", "max_position_embeddings"),
        (dict(window=0), "window", ">= 1"),
        (dict(norm_eps=float("nan")), "norm_eps", "finite"),
        (dict(compress_ratios=(0, 2, 2, 1, 1)), "compress_ratios", "n_layers"),
        (dict(kv_source_layers=(0, 3)), "kv_source_layers", "compress ratio > 0"),
        (dict(kv_source_layers=(3,)), "kv_source_layers", "before layer 1"),
        (dict(candidate_source_layer=5), "candidate_source_layer", "kv_source_layers"),
        (dict(compress_ratios=(0, 2, 2, 2, 1, 1)), "kv_source_layers", "ratio"),
        (dict(index_source_layers=(1, 5)), "index_source_layers", "superset"),
    ],
    ids=lambda v: str(v) if not isinstance(v, dict) else ",".join(v),
)
def test_validation_names_field_and_range(change, field, allowed):
    with pytest.raises(ValueError) as e:
        small_cfg(**change)
    msg = str(e.value)
    assert f"AttnV41Cfg.{field}" in msg and allowed in msg, msg


def test_frozen_and_replace_revalidates():
    cfg = small_cfg()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dim = 3
    assert cfg.replace(window=16).window == 16
    with pytest.raises(ValueError, match="window"):
        cfg.replace(window=-1)


def _hf_config() -> dict:
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "quantization_config": {"quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": [32, 32]},
        "text_config": {
            "hidden_size": 5120,
            "num_hidden_layers": 40,
            "num_attention_heads": 64,
            "head_dim": 512,
            "qk_rope_head_dim": 64,
            "q_lora_rank": 1280,
            "o_lora_rank": 1024,
            "o_groups": 8,
            "sliding_window": 128,
            "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
            "kv_source_layer_ids": [2, 8, 14, 20],
            "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
            "candidate_source_layer_id": 20,
            "candidate_topk_blocks": 2048,
            "candidate_block_size": 8,
            "index_n_heads": 32,
            "index_head_dim": 128,
            "index_topk": 512,
            "rms_norm_eps": 1e-20,
            "rope_theta": 10000,
            "compress_rope_theta": 160000,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 16,
                "original_max_position_embeddings": 65536,
                "beta_fast": 32,
                "beta_slow": 1,
            },
            "max_position_embeddings": 1048576,
        },
    }


def _flat_config() -> dict:
    return {
        "dim": 5120,
        "n_layers": 40,
        "n_heads": 64,
        "head_dim": 512,
        "rope_head_dim": 64,
        "q_lora_rank": 1280,
        "o_lora_rank": 1024,
        "o_groups": 8,
        "window_size": 128,
        "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
        "kv_source_layers": [2, 8, 14, 20],
        "index_source_layers": [2, 8, 14, 20, 24, 28, 32, 36],
        "candidate_source_layer": 20,
        "candidate_topk_blocks": 2048,
        "candidate_block_size": 8,
        "index_n_heads": 32,
        "index_head_dim": 128,
        "index_topk": 512,
        "norm_eps": 1e-20,
        "rope_theta": 10000,
        "compress_rope_theta": 160000,
        "rope_factor": 16,
        "original_seq_len": 65536,
        "beta_fast": 32,
        "beta_slow": 1,
    }


@pytest.mark.parametrize("kind", ["nested", "flat"])
def test_readers_match_preset(tmp_path, kind):
    flash = v41_flash()
    if kind == "nested":
        (tmp_path / "config.json").write_text(json.dumps(_hf_config()))
    else:
        (tmp_path / "inference").mkdir()
        (tmp_path / "inference" / "config.json").write_text(json.dumps(_flat_config()))
    cfg = AttnV41Cfg.from_checkpoint(tmp_path, max_tokens=flash.max_tokens, max_seq=flash.max_seq)
    assert cfg == flash
    assert [r.name for r in cfg.roles] == [r.name for r in flash.roles]


def test_reader_missing_key_is_named():
    d = _hf_config()
    del d["text_config"]["rope_scaling"]["beta_fast"]
    with pytest.raises(KeyError, match="rope_scaling.beta_fast"):
        AttnV41Cfg.from_hf_config(d)


def test_golden_meta_reader(tmp_path):
    from attnv41.golden import GoldenFile, bundled_golden_path

    g = GoldenFile(bundled_golden_path())
    assert g.cfg == small_cfg()


# ---------------------------------------------------------------------------- issue 10: schedule and capacities
@pytest.mark.parametrize(
    "change, field",
    [
        (dict(kv_source_layers=(1, 2.7)), "kv_source_layers[1] = 2.7"),
        (dict(kv_source_layers=(1.0, 3)), "kv_source_layers[0] = 1.0"),
        (dict(kv_source_layers=(True, 3)), "kv_source_layers[0] = True"),
        (dict(index_source_layers=(1, 3, "5")), "index_source_layers[2] = '5'"),
        (dict(compress_ratios=(0, 2.0, 2, 1, 1, 1)), "compress_ratios[1] = 2.0"),
        (dict(compress_ratios=(0, 2, 2, 1, 1, True)), "compress_ratios[5] = True"),
        (dict(candidate_source_layer=3.0), "candidate_source_layer = 3.0"),
        (dict(candidate_source_layer=True), "candidate_source_layer = True"),
        (dict(kv_source_layers="13"), "kv_source_layers = '13'"),
    ],
    ids=["float_2.7", "float_1.0", "bool", "str", "ratio_float", "ratio_bool", "cand_float", "cand_bool", "str_list"],
)
def test_non_integer_layer_lists_rejected(change, field):
    """int(v) used to turn 2.7 into 2, True into 1 and "5" into 5 without a word."""
    with pytest.raises(ValueError) as e:
        small_cfg(**change)
    msg = str(e.value)
    assert f"AttnV41Cfg.{field}; allowed: " in msg and "integer" in msg, msg


def test_layer_lists_accept_lists_and_keep_tuples():
    cfg = small_cfg(compress_ratios=[0, 2, 2, 1, 1, 1], kv_source_layers=[1, 3], index_source_layers=[1, 3, 5])
    assert cfg == small_cfg() and cfg.kv_source_layers == (1, 3) and isinstance(cfg.compress_ratios, tuple)
    hash(cfg)


def test_candidate_source_ratio_must_match_reindex_layers():
    """Layer 5 (reindex, ratio 2) would mask its scores with the ratio-1 candidate source's
    mask: the forward crashed after the ring write. The config refuses it now."""
    bad = dict(compress_ratios=(0, 1, 1, 2, 2, 2), kv_source_layers=(1, 3), index_source_layers=(1, 3, 5))
    with pytest.raises(ValueError) as e:
        small_cfg(candidate_source_layer=1, **bad)
    msg = str(e.value)
    assert "AttnV41Cfg.candidate_source_layer = 1; allowed: " in msg and "layer 5" in msg and "ratio 2" in msg, msg
    # the same schedule with the ratio-2 kv source as candidate source, or without one, is fine
    assert [r.layer for r in small_cfg(candidate_source_layer=3, **bad).roles if r.uses_candidates] == [5]
    assert not any(r.uses_candidates for r in small_cfg(candidate_source_layer=None, **bad).roles)


@pytest.mark.parametrize("window, topk, ok", [(2000, 48, True), (2000, 49, False), (8, 2041, False)])
def test_decode_width_checked_by_the_config(window, topk, ok):
    """window + index_topk <= 2048 was refused only by AttnV41()."""
    if ok:
        assert small_cfg(window=window, index_topk=topk).index_topk == topk
        return
    with pytest.raises(ValueError) as e:
        small_cfg(window=window, index_topk=topk)
    msg = str(e.value)
    assert f"AttnV41Cfg.index_topk = {topk}; allowed: <= {2048 - window}" in msg and "2048" in msg, msg


def test_presets_and_golden_configs_construct():
    from attnv41.golden import GoldenFile

    assert v41_flash().max_seq == 8192
    assert small_cfg().max_seq == 64
    for name in ("tiny", "fp8", "headdim"):
        g = GoldenFile(golden_path(name))
        assert g.cfg.n_layers >= 1, name


def _hf_with_limit(mpe: int) -> dict:
    d = _hf_config()
    d["text_config"]["max_position_embeddings"] = mpe
    return d


@pytest.mark.parametrize(
    "mpe, overrides, seq, tokens",
    [
        (1 << 20, {}, 8192, 4096),
        (6000, {}, 6000, 4096),
        (2048, {}, 2048, 2048),
        (2048, dict(max_tokens=512), 2048, 512),
        (1 << 20, dict(max_tokens=10000), 10000, 10000),
        (2048, dict(max_seq=1024), 1024, 1024),
    ],
    ids=["released", "below_8192", "below_4096", "explicit_tokens", "tokens_above_8192", "explicit_seq"],
)
def test_default_capacities_fit_the_checkpoint(tmp_path, mpe, overrides, seq, tokens):
    """A max_position_embeddings below 8192 used to fail with 'max_seq = 8192', a value
    nobody passed."""
    (tmp_path / "config.json").write_text(json.dumps(_hf_with_limit(mpe)))
    cfg = AttnV41Cfg.from_checkpoint(tmp_path, **overrides)
    assert (cfg.max_seq, cfg.max_tokens, cfg.max_position_embeddings) == (seq, tokens, mpe)


@pytest.mark.parametrize(
    "overrides, field",
    [(dict(max_seq=4096), "max_seq = 4096"), (dict(max_tokens=3000), "max_tokens = 3000")],
    ids=["explicit_max_seq", "explicit_max_tokens"],
)
def test_explicit_capacity_above_the_limit_is_named(tmp_path, overrides, field):
    (tmp_path / "config.json").write_text(json.dumps(_hf_with_limit(2048)))
    with pytest.raises(ValueError) as e:
        AttnV41Cfg.from_checkpoint(tmp_path, **overrides)
    msg = str(e.value)
    assert f"AttnV41Cfg.{field}; allowed: " in msg and "max_position_embeddings (2048)" in msg, msg


def test_flat_config_max_seq_len_is_kept(tmp_path):
    d = dict(_flat_config(), max_seq_len=3000, max_position_embeddings=4000)
    (tmp_path / "config.json").write_text(json.dumps(d))
    cfg = AttnV41Cfg.from_checkpoint(tmp_path)
    assert (cfg.max_seq, cfg.max_tokens) == (3000, 3000)


@pytest.mark.parametrize(
    "text", ['{"text_config": {', "[1, 2]", "\xff\xfe"], ids=["truncated_json", "json_list", "not_utf8"]
)
def test_malformed_config_json_names_the_file(tmp_path, text):
    from attnv41.checkpoint import CheckpointError

    p = tmp_path / "config.json"
    p.write_bytes(text.encode("latin-1"))
    with pytest.raises(CheckpointError) as e:
        AttnV41Cfg.from_checkpoint(tmp_path)
    assert str(p) in str(e.value), str(e.value)


def test_direct_construction_defaults_fit_a_small_position_limit():
    """Leaving max_seq/max_tokens out never blames a value the caller did not pass."""
    kw = small_cfg().to_dict()
    del kw["max_seq"], kw["max_tokens"]
    cfg = AttnV41Cfg(**{**kw, "max_position_embeddings": 512})
    assert (cfg.max_seq, cfg.max_tokens) == (512, 512)
    cfg = AttnV41Cfg(**{**kw, "max_position_embeddings": 1 << 20})
    assert (cfg.max_seq, cfg.max_tokens) == (8192, 4096)
    cfg = AttnV41Cfg(**{**kw, "max_tokens": 10000})
    assert (cfg.max_seq, cfg.max_tokens) == (10000, 10000)
    assert cfg.replace(window=16).max_seq == 10000  # replace keeps the resolved values
    with pytest.raises(ValueError, match="AttnV41Cfg.max_seq = 1024; allowed: max_tokens"):
        AttnV41Cfg(**{**kw, "max_position_embeddings": 512, "max_seq": 1024})


# ------------------------------------------------ config.json values taken as they are (2026-12-04 audit)


@pytest.mark.parametrize(
    "key, value, exc, match",
    [
        ("num_hidden_layers", 6.7, ValueError, r"AttnV41Cfg\.n_layers = 6\.7; allowed: an integer >= 1"),
        ("num_hidden_layers", "40", ValueError, r"AttnV41Cfg\.n_layers = '40'; allowed: an integer >= 1"),
        ("max_position_embeddings", True, ValueError, r"max_position_embeddings = True; allowed: an integer"),
        ("max_position_embeddings", 1048576.9, ValueError, r"max_position_embeddings = 1048576\.9; allowed"),
        ("rms_norm_eps", True, ValueError, r"AttnV41Cfg\.norm_eps = True; allowed: a finite number > 0"),
        ("rope_theta", "1e4", ValueError, r"AttnV41Cfg\.rope_theta = '1e4'; allowed: a finite number > 0"),
        ("rope_theta", [1e4], ValueError, r"AttnV41Cfg\.rope_theta = \[10000\.0\]; allowed: a finite number"),
        ("rope_scaling.factor", True, ValueError, r"AttnV41Cfg\.rope_factor = True; allowed: a finite number"),
        ("compress_ratios", [0, 0] + [2] * 18 + [1] * 20 + [4, 4], ValueError, r"then only the draft stages' zeros"),
        ("compress_ratios", [0, 0] + [2] * 18 + [1] * 19, ValueError, r"40 entries \(n_layers\)"),
        ("compress_ratios", "0,2,1", ValueError, r"compress_ratios = '0,2,1'; allowed: a list of integers"),
        ("candidate_source_layer_id", None, KeyError, r"config key 'candidate_source_layer_id' is missing"),
        ("text_config", None, TypeError, r"config\.json text_config = None; allowed: a JSON object"),
        ("rope_scaling", "yarn", TypeError, r"config\.json rope_scaling = 'yarn'; allowed: a JSON object"),
    ],
)
def test_reader_takes_no_value_it_would_have_to_convert(key, value, exc, match):
    """No int()/float() of config values (6.7 → 6 layers, true → eps 1.0 or max_seq 1, "1e4"
    parsed), no truncated per-layer list beyond the draft stages' zeros, no missing
    candidate source read as none (the reindex layers would lose their mask), and no
    AttributeError for a malformed structure: each is refused naming the key."""
    d = _hf_config()
    t = d["text_config"]
    if key == "text_config":
        d["text_config"] = value
    elif key == "candidate_source_layer_id":
        del t[key]
    elif key.startswith("rope_scaling."):
        t["rope_scaling"][key.split(".")[1]] = value
    else:
        t[key] = value
    with pytest.raises(exc, match=match):
        AttnV41Cfg.from_hf_config(d)


def test_reader_keeps_numbers_and_an_explicit_null_candidate_source():
    """JSON ints for float fields are numbers (stored as floats, as before); an explicit null
    candidate source is a geometry without one; draft-stage zeros past n_layers are dropped."""
    d = _hf_config()
    d["text_config"]["candidate_source_layer_id"] = None
    cfg = AttnV41Cfg.from_hf_config(d)
    assert cfg.candidate_source_layer is None and not any(r.uses_candidates for r in cfg.roles)
    assert isinstance(cfg.rope_theta, float) and cfg.rope_theta == 10000.0 and len(cfg.compress_ratios) == 40


def test_presets_take_a_large_max_tokens_alone():
    """A preset given only max_tokens above its default max_seq sizes max_seq for it (before,
    the default max_seq the caller never passed was refused)."""
    from attnv41.synthetic import small_preset

    assert v41_flash().max_seq == 8192 and v41_flash(max_tokens=10000).max_seq == 10000
    assert small_preset().max_seq == 512 and small_preset(max_tokens=1024).max_seq == 1024
    with pytest.raises(ValueError, match=r"AttnV41Cfg\.max_seq = 512; allowed: max_tokens \(1024\) <= max_seq"):
        small_preset(max_tokens=1024, max_seq=512)
