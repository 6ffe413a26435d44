import pytest

from attnv41.checkpoint import write_checkpoint
from attnv41.cli import main
from attnv41.demo import prepare_demo, run_demo
from attnv41.synthetic import random_weights, small_preset


def test_demo_cpu_small():
    res = run_demo(prompt=40, steps=6, progress=False, device="cpu")
    assert res.ok and res.device == "cpu" and "preset small" in res.geometry
    assert res.graph_step_ms > 0 and res.eager_step_ms > 0
    assert any("byte for byte: all equal" in line for line in res.lines())
    assert res.nonfinite == 0 and any("0 non-finite values entered a cache write" in line for line in res.lines())


def test_demo_reports_nonfinite_values(monkeypatch, capsys):
    """A NaN in one decode input: counted (once per stack), reported, and the demo fails."""
    from attnv41 import demo

    orig = demo.random_inputs

    def poisoned(cfg, n, seed, dev="cpu"):
        xs = orig(cfg, n, seed, dev)
        if n == 4:  # the decode inputs
            xs[0][1, 0] = float("nan")
        return xs

    monkeypatch.setattr(demo, "random_inputs", poisoned)
    assert main(["demo", "--prompt", "20", "--steps", "4", "--no-progress", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    counted = [line for line in out.splitlines() if "non-finite values entered a cache write" in line]
    assert counted and not counted[0].strip().startswith("finite    0"), out
    assert out.rstrip().splitlines()[-1].startswith("FAIL: ") and "non-finite values entered a cache write" in out


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


@pytest.mark.parametrize(
    "prompt, steps, msg",
    [
        pytest.param(100_000_000, 4, "--prompt = 100000000; allowed: 1..1048571 with --steps 4", id="prompt-huge"),
        pytest.param(10, 1 << 20, "--steps = 1048576; allowed: 1..1048574", id="steps-huge"),
        pytest.param(10, 0, "--steps = 0; allowed: 1..", id="steps-zero"),
        pytest.param(2.5, 3, "--prompt = 2.5; allowed: 1..", id="prompt-float"),
    ],
)
def test_demo_lengths_checked_against_the_geometry(prompt, steps, msg):
    """Up front, naming the option and its range (not AttnV41Cfg.max_seq); a retry works."""
    with pytest.raises(ValueError) as e:
        prepare_demo(prompt=prompt, steps=steps, progress=False, device="cpu")
    assert msg in str(e.value) and "max_position_embeddings = 1048576 of preset small" in str(e.value), str(e.value)
    assert "max_seq" not in str(e.value)
    assert prepare_demo(prompt=5, steps=2, progress=False, device="cpu").cfg.max_seq == 8


def test_demo_lengths_checked_against_a_checkpoint(tmp_path):
    cfg = small_preset(max_tokens=64, max_seq=128).replace(max_position_embeddings=128)
    write_checkpoint(tmp_path, cfg, random_weights(cfg, 7), shards=2)
    with pytest.raises(ValueError, match=r"--prompt = 120; allowed: 1\.\.117 with --steps 10 .*= 128 of checkpoint"):
        prepare_demo(prompt=120, steps=10, progress=False, device="cpu", checkpoint=str(tmp_path))
    ok = prepare_demo(prompt=117, steps=10, progress=False, device="cpu", checkpoint=str(tmp_path))
    assert ok.cfg.max_seq == 128 and ok.cfg.max_tokens == 117


# ---------------------------------------------------------------------------- --weights (issue 12)
def test_demo_fp8_random_weights(capsys):
    """--weights fp8 with random weights: the released conversion of the same model, run
    in FP8 on the CPU; the header names the format."""
    assert main(["demo", "--prompt", "16", "--steps", "3", "--no-progress", "--device", "cpu", "--weights", "fp8"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(", fp8 weights, on cpu"), out
    assert "all equal" in out and out.rstrip().endswith("PASS")
    setup = prepare_demo(prompt=4, steps=1, progress=False, device="cpu", weights="fp8")
    assert setup.weight_format == "fp8" and all("wq_a.scale" in w for w in setup.weights)
    auto = prepare_demo(prompt=4, steps=1, progress=False, device="cpu")
    assert auto.weight_format == "bf16" and not any("wq_a.scale" in w for w in auto.weights)


@pytest.mark.parametrize(
    "flag, fmt",
    [(None, "fp8"), ("bf16", "bf16"), ("fp8", "fp8")],
    ids=["auto_is_the_checkpoints", "bf16", "fp8"],
)
def test_demo_checkpoint_weights(tmp_path, capsys, flag, fmt):
    cfg = small_preset(max_tokens=64, max_seq=128)
    write_checkpoint(tmp_path, cfg, random_weights(cfg, 7), shards=2)  # an FP8 checkpoint
    args = ["demo", "--checkpoint", str(tmp_path), "--prompt", "12", "--steps", "2", "--no-progress"]
    assert main(args + (["--weights", flag] if flag else [])) == 0
    out = capsys.readouterr().out
    assert f", {fmt} weights, on cpu" in out.splitlines()[0] and "all equal" in out, out


def test_demo_weights_rejected(tmp_path, capsys, monkeypatch):
    with pytest.raises(ValueError, match=r"--weights = 'fp4'; allowed: 'auto', 'bf16', 'fp8'"):
        prepare_demo(prompt=4, steps=1, progress=False, device="cpu", weights="fp4")
    assert main(["demo", "--weights", "e4m3"]) == 2
    assert "attnv41 demo: argument --weights: invalid choice: 'e4m3'" in capsys.readouterr().err
    cfg = small_preset(max_tokens=64, max_seq=128)
    bf = tmp_path / "bf16"
    write_checkpoint(bf, cfg, random_weights(cfg, 7), shards=2, fp8_names=())
    args = ["demo", "--checkpoint", str(bf), "--prompt", "4", "--steps", "1", "--no-progress"]
    assert main(args + ["--weights", "fp8"]) == 2
    assert "without a .scale" in capsys.readouterr().err
    # an op table without an FP8 GEMM (CUDA until its kernel lands): refused before loading
    import dataclasses

    from attnv41.runtime import ops

    monkeypatch.setattr(ops, "ops_for", lambda dev: dataclasses.replace(ops.TORCH_OPS, name="nofp8", fp8_mm=None))
    f8 = tmp_path / "fp8"
    write_checkpoint(f8, cfg, random_weights(cfg, 7), shards=2)
    for extra in ([], ["--weights", "fp8"]):
        assert main(["demo", "--checkpoint", str(f8), "--prompt", "4", "--steps", "1", "--no-progress"] + extra) == 2
        err = capsys.readouterr().err
        assert "'nofp8' ops on cpu have no FP8 GEMM yet; allowed here: --weights bf16" in err, err
    with pytest.raises(ValueError, match=r"--weights = 'fp8' gives 'fp8' \(asked\)"):
        prepare_demo(prompt=4, steps=1, progress=False, device="cpu", weights="fp8")
    assert prepare_demo(prompt=4, steps=1, progress=False, device="cpu", checkpoint=str(f8), weights="bf16")


def test_report_names_the_geometrys_layer_count():
    """The prefill line counts the geometry's layers (a 6-layer checkpoint said "x 40 layers")."""
    from attnv41.demo import DemoResult

    r = DemoResult("cpu", "checkpoint x", 16, 4, 0.01, 1.0, 2.0, 3.0, 0, 0, 0, "-", 0, "bf16", 6)
    assert "prefill   16 tokens x 6 layers:" in r.lines()[1]
