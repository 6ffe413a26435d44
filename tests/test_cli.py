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


def test_bad_golden_format_is_named(tmp_path):
    p = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(1)}, str(p), metadata={"format": "other"})
    with pytest.raises(ValueError, match="format"):
        main(["check", "--golden", str(p)])


def test_check_runtime_forward_and_split(capsys):
    assert main(["check", "--impl", "runtime"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["check", "--impl", "runtime", "--decode", "split"]) == 0
    out = capsys.readouterr().out
    assert "impl runtime-split" in out and "0 failed" in out


def test_split_needs_runtime(capsys):
    assert main(["check", "--decode", "split"]) == 2
