import pytest

from attnv41.checkpoint import write_checkpoint
from attnv41.cli import main
from attnv41.demo import run_demo
from attnv41.synthetic import random_weights, small_preset


def test_demo_cpu_small():
    res = run_demo(prompt=40, steps=6, progress=False, device="cpu")
    assert res.ok and res.device == "cpu" and "preset small" in res.geometry
    assert res.graph_step_ms > 0 and res.eager_step_ms > 0
    assert any("byte for byte: all equal" in line for line in res.lines())


def test_demo_cli(capsys):
    assert main(["demo", "--prompt", "33", "--steps", "5", "--no-progress", "--index-keys", "released"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("PASS") and "tokens/s" in out


def test_demo_on_a_written_checkpoint(tmp_path, capsys):
    cfg = small_preset(max_tokens=64, max_seq=128)
    write_checkpoint(tmp_path, cfg, random_weights(cfg, 7), shards=4)
    assert main(["demo", "--checkpoint", str(tmp_path), "--prompt", "20", "--steps", "4", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint {tmp_path}" in out and "all equal" in out


def test_demo_rejects_bad_options():
    with pytest.raises(ValueError, match="prompt = 0"):
        run_demo(prompt=0, steps=3, progress=False)
    with pytest.raises(ValueError, match="preset = 'huge'"):
        run_demo(preset="huge", prompt=4, steps=1, progress=False)
