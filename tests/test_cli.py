import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from attnv41.cli import main
from attnv41.golden import bundled_golden_path


def test_check_default_passes(capsys):
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "PASS: v41_tiny.safetensors" in out and "0 failed" in out
    assert "decode17" in out and "full_candidate_source" in out


def _corrupt(tmp_path, key, fn):
    src = bundled_golden_path()
    with safe_open(str(src), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors[key] = fn(tensors[key])
    p = tmp_path / "corrupt.safetensors"
    save_file(tensors, str(p), metadata=meta)
    return p


def test_check_fails_on_wrong_output(tmp_path, capsys):
    p = _corrupt(tmp_path, "released/decode15/L4/out", lambda t: t * 1.1)
    assert main(["check", "--golden", str(p), "--variant", "released"]) == 1
    out = capsys.readouterr().out
    assert "FAIL decode15 L4: out" in out and out.rstrip().splitlines()[-1].startswith("FAIL")


def test_check_json_holds_every_comparison_and_the_verdict(tmp_path, capsys):
    """`check --json`: strict JSON (no NaN or Infinity), the same verdict and counts as the
    printed run, one report per variant with every layer's comparisons; a failing run
    names its failure in the file too, and a non-finite ratio is written as null."""
    import json

    path = tmp_path / "sub" / "check.json"
    assert main(["check", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    doc = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert doc["verdict"] == "PASS" and doc["failed"] == 0 and doc["golden"] == "tiny"
    assert doc["variants"] == ["released", "intended"] and [r["variant"] for r in doc["reports"]] == doc["variants"]
    assert f"{doc['compared']} tensors compared" in out and doc["compared"] == 492
    layers = doc["reports"][0]["layers"]
    assert sum(len(lr["tensors"]) for lr in layers) == doc["reports"][0]["compared"]
    assert {"regime", "layer", "role", "ok", "tensors", "skipped"} <= set(layers[0])
    assert all(t["ok"] and t["ratio"] == 0.0 for lr in layers for t in lr["tensors"].values())

    p = _corrupt(tmp_path, "released/decode15/L4/out", lambda t: t * 1.1)
    assert main(["check", "--golden", str(p), "--variant", "released", "--json", str(path)]) == 1
    doc = json.loads(path.read_text())
    assert doc["verdict"] == "FAIL" and doc["failed"] == 1 and doc["reports"][0]["ok"] is False
    bad = [lr for lr in doc["reports"][0]["layers"] if not lr["ok"]]
    assert [(lr["regime"], lr["layer"]) for lr in bad] == [("decode15", 4)]
    assert bad[0]["tensors"]["out"]["ratio"] > 1 and any("decode15 L4: out" in f for f in doc["reports"][0]["failures"])

    p = _corrupt(tmp_path, "released/decode15/L4/out", lambda t: t * float("nan"))
    assert main(["check", "--golden", str(p), "--variant", "released", "--json", str(path)]) == 1
    doc = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    (bad,) = [lr for lr in doc["reports"][0]["layers"] if not lr["ok"]]
    assert bad["tensors"]["out"]["ratio"] is None and doc["reports"][0]["worst"]["out"] is None


def test_check_batched_json(tmp_path, capsys):
    import json

    path = tmp_path / "b.json"
    assert main(["check", "--batch", "2", "--variant", "intended", "--json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out and path.read_text())
    assert doc["verdict"] == "PASS" and doc["batch"] == 2 and doc["seed"] == 0
    assert doc["batch_invariance"]["traced"] > 0 and doc["batch_invariance"]["differ"] == []
    assert doc["reports"][0]["variant"] == "intended" and doc["reports"][0]["ok"] is True


def test_env_reports_versions_variables_and_devices(capsys, monkeypatch):
    import json

    import attnv41

    monkeypatch.setenv("ATTNV41_PDL", "0")
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert f"attnv41      {attnv41.__version__}" in out and f"torch        {torch.__version__}" in out
    assert "ATTNV41_PDL          '0'" in out and "ATTNV41_ROUND_BF16   unset (cvt)" in out
    if not torch.cuda.is_available():
        assert "CUDA         not available" in out
    assert main(["env", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["attnv41"] == attnv41.__version__ and doc["env"]["ATTNV41_PDL"] == "0"
    assert doc["cuda_available"] == torch.cuda.is_available()
    assert len(doc["devices"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    for d in doc["devices"]:  # a GPU run of the suite: the rule the runtimes refuse by
        assert d["kernels_bf16"] == "run" or "allowed: 8.9 or newer" in d["kernels_bf16"]


def test_check_fails_on_wrong_selection(tmp_path, capsys):
    def swap(t):
        t = t.clone()
        t[0, -1] = -1
        return t

    p = _corrupt(tmp_path, "released/decode16/L3/sel", swap)
    assert main(["check", "--golden", str(p), "--variant", "released"]) == 1
    assert "decode16 L3: sel" in capsys.readouterr().out


def test_absent_tensor_is_skipped_and_counted(tmp_path, capsys):
    src = bundled_golden_path()
    with safe_open(str(src), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != "released/decode13/L1/index_k"}
    p = tmp_path / "partial.safetensors"
    save_file(tensors, str(p), metadata=meta)
    assert main(["check", "--golden", str(p), "--variant", "released"]) == 0
    assert "1 skipped" in capsys.readouterr().out


def test_console_entry_runs_as_module():
    r = subprocess.run(
        [sys.executable, "-m", "attnv41", "check", "--variant", "intended"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout


def test_bad_golden_format_is_named(tmp_path, capsys):
    p = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(1)}, str(p), metadata={"format": "other"})
    assert main(["check", "--golden", str(p)]) == 2  # a user mistake: one line, exit 2 (not 1, a failed check)
    assert "metadata format = 'other'" in capsys.readouterr().err


def test_check_runtime_forward_and_split(capsys):
    assert main(["check", "--impl", "runtime"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["check", "--impl", "runtime", "--decode", "split"]) == 0
    out = capsys.readouterr().out
    assert "impl runtime-split" in out and "0 failed" in out


def test_split_needs_runtime(capsys):
    assert main(["check", "--decode", "split"]) == 2


# ------------------------------------------------- user mistakes: one line, exit 2


def _junk(tmp_path):
    p = tmp_path / "junk.safetensors"
    p.write_bytes(b"not a safetensors file" * 8)
    return p


def _truncated(tmp_path):
    p = tmp_path / "truncated.safetensors"
    data = bundled_golden_path().read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return p


def _ckpt_bad_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    return tmp_path


def _ckpt_missing_key(tmp_path):
    (tmp_path / "config.json").write_text('{"n_layers": 2}')
    return tmp_path


def _ckpt_bf16(tmp_path):
    """A small checkpoint whose FP8 linears are stored dequantized (bf16, no scales)."""
    from attnv41.checkpoint import write_checkpoint
    from attnv41.synthetic import random_weights, small_preset

    cfg = small_preset(max_tokens=16, max_seq=32)
    return write_checkpoint(tmp_path / "bf16", cfg, random_weights(cfg, 1), shards=1, fp8_names=())


USER_MISTAKES = {
    "golden-missing": (lambda t: ["check", "--golden", str(t / "nope.safetensors")], "does not exist"),
    "golden-junk": (lambda t: ["check", "--golden", str(_junk(t))], "not a readable safetensors file"),
    "golden-truncated": (lambda t: ["check", "--golden", str(_truncated(t))], "not a readable safetensors file"),
    "check-bad-variant": (lambda t: ["check", "--variant", "both2"], "argument --variant: invalid choice"),
    "check-json-folder": (lambda t: ["check", "--json", str(t)], "a folder; allowed: a file path"),
    "check-batch-json-folder": (lambda t: ["check", "--batch", "2", "--json", str(t)], "a folder; allowed"),
    "demo-prompt-huge": (lambda t: ["demo", "--prompt", "100000000"], "--prompt = 100000000; allowed: 1.."),
    "demo-steps-zero": (lambda t: ["demo", "--steps", "0"], "--steps = 0; allowed: 1.."),
    "demo-prompt-not-int": (lambda t: ["demo", "--prompt", "many"], "argument --prompt: invalid int value"),
    "demo-seed-negative": (lambda t: ["demo", "--seed", "-3"], "--seed = -3; allowed: 0.."),
    "demo-ckpt-missing": (lambda t: ["demo", "--checkpoint", str(t / "none")], "No such file"),
    "demo-ckpt-bad-json": (lambda t: ["demo", "--checkpoint", str(_ckpt_bad_json(t))], "Expecting property name"),
    "demo-ckpt-missing-key": (lambda t: ["demo", "--checkpoint", str(_ckpt_missing_key(t))], "config key 'dim'"),
    "bench-bad-contexts": (lambda t: ["bench", "--contexts", "x"], "argument --contexts"),
    "demo-bad-weights": (lambda t: ["demo", "--weights", "fp4"], "argument --weights: invalid choice: 'fp4'"),
    "bench-bad-weights": (lambda t: ["bench", "--weights", "auto"], "argument --weights: invalid choice: 'auto'"),
    "demo-fp8-of-bf16-ckpt": (
        lambda t: ["demo", "--checkpoint", str(_ckpt_bf16(t)), "--weights", "fp8", "--no-progress"],
        "without a .scale (already dequantized); allowed with weights='fp8'",
    ),
    "bench-fp8-of-bf16-ckpt": (
        lambda t: ["bench", "--device", "cpu", "--checkpoint", str(_ckpt_bf16(t)), "--weights", "fp8"],
        "weights = 'fp8', but checkpoint",
    ),
    "no-command": (lambda t: [], "the following arguments are required"),
}


@pytest.mark.parametrize("case", list(USER_MISTAKES), ids=list(USER_MISTAKES))
def test_user_mistake_is_one_line_and_exit_2(tmp_path, capsys, case):
    make_argv, msg = USER_MISTAKES[case]
    argv = make_argv(tmp_path)
    assert main(argv) == 2, case
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    cmd = f"attnv41 {argv[0]}: " if argv else "attnv41: "
    assert len(lines) == 1 and lines[0].startswith(cmd), cap.err
    assert msg in lines[0], lines[0]
    assert "Traceback" not in cap.err and cap.out == "", cap.out


def test_demo_prompt_names_the_option_not_the_config(capsys):
    assert main(["demo", "--prompt", "100000000", "--steps", "4"]) == 2
    err = capsys.readouterr().err
    assert "--prompt = 100000000; allowed: 1..1048571 with --steps 4" in err, err
    assert "max_seq" not in err and "AttnV41Cfg" not in err, err


@pytest.mark.parametrize("exc", [RuntimeError, AssertionError, ValueError], ids=lambda e: e.__name__)
def test_internal_error_in_demo_keeps_its_traceback(monkeypatch, exc):
    """Past the validated setup, any exception is a bug: it propagates (traceback, exit 1)
    instead of being printed as a user mistake, even a ValueError."""
    from attnv41 import demo

    def boom(setup):
        raise exc("internal failure")

    monkeypatch.setattr(demo, "run_prepared", boom)
    with pytest.raises(exc, match="internal failure"):
        main(["demo", "--prompt", "8", "--steps", "2", "--no-progress"])


@pytest.mark.parametrize("exc", [RuntimeError, AssertionError, ValueError, KeyError], ids=lambda e: e.__name__)
def test_internal_error_in_check_keeps_its_traceback(monkeypatch, exc):
    from attnv41 import cli

    def boom(*a, **k):
        raise exc("replay broke")

    monkeypatch.setattr(cli, "replay", boom)
    with pytest.raises(exc, match="replay broke"):
        main(["check"])


def test_user_mistake_exit_code_as_a_process():
    r = subprocess.run(
        [sys.executable, "-m", "attnv41", "demo", "--prompt", "100000000"], capture_output=True, text=True
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "--prompt = 100000000" in r.stderr, r.stderr


def test_golden_file_content_errors_stay_user_mistakes(tmp_path, capsys):
    """A golden file whose layer input is missing is a bad input file: one line, exit 2."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from attnv41.golden import bundled_golden_path

    with safe_open(str(bundled_golden_path()), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != "released/decode14/L2/x"}
    p = tmp_path / "no_x.safetensors"
    save_file(tensors, str(p), metadata=meta)
    assert main(["check", "--golden", str(p), "--variant", "released"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnv41 check: ") and "released/decode14/L2/x is missing" in err, err
    assert main(["check", "--golden", str(tmp_path)]) == 2
    assert "is a directory, not a file" in capsys.readouterr().err


def test_check_tensor_parallel(tmp_path, capsys):
    """`check --tp 2`: two ranks of the runtime (and of the reference), reduced, pass the
    tiny file; the JSON names tp; a size the geometry does not shard into, or --tp with
    --batch or --decode split, is a user mistake (exit 2, one line naming the value)."""
    import json

    path = tmp_path / "tp.json"
    assert main(["check", "--tp", "2", "--impl", "runtime", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    (verdict,) = [line for line in out.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert verdict.startswith("PASS") and "impl runtime (tp 2)" in verdict
    doc = json.loads(path.read_text())
    assert doc["tp"] == 2 and doc["compared"] == 492 and doc["impl"] == "runtime (tp 2)"
    assert main(["check", "--tp", "2", "--variant", "intended"]) == 0
    for args, msg in (
        (["--tp", "3"], "tp_size = 3; allowed: [1, 2] (divisors of groups (2)"),
        (["--tp", "0"], "--tp 0; allowed: >= 1"),
        (["--tp", "2", "--batch", "2"], "--tp 2 with --batch; allowed"),
        (["--tp", "2", "--impl", "runtime", "--decode", "split"], "--tp 2 with --decode split; allowed"),
    ):
        assert main(["check", *args]) == 2, args
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err
