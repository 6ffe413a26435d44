"""`attnv41 bench`: the floors' byte and FLOP counts by hand (an FP8 stack's bytes too),
the synthetic context, the V4 cache layout of the peer, the top-k set check, the
correctness gate, the weight formats (--weights, skips and refusals), the options' bounds
from the geometry's max_position_embeddings, and a CPU smoke run of every part through the
command line (its outputs, its error handling)."""

from __future__ import annotations

import json

import pytest
import torch

from attnv41.bench import run as bench_run
from attnv41.bench.common import Ceilings, Timing, floor_ms, kernel_row
from attnv41.bench.index import check_selection
from attnv41.bench.peer import V4_BYTES, v4_cache, v4_grid_
from attnv41.bench.stack import decode_step_bytes, fill_context, prefill_flops, stack_weight_format
from attnv41.cli import main
from attnv41.runtime.stack import RuntimeStack
from attnv41.synthetic import random_weights, small_preset
from attnv41.weights import FP8_LINEARS

CEIL = Ceilings(copy_gbps=1000.0, copy_bytes=1, mm_tflops=100.0, mm_shape=(1, 1, 1))


@pytest.fixture(scope="module")
def cfg():
    return small_preset(max_tokens=64, max_seq=512)


@pytest.fixture(scope="module")
def weights(cfg):
    return random_weights(cfg, 0)


def test_decode_step_bytes_by_hand(cfg, weights):
    p = 100  # ratio-2 layers see 50 compressed rows, ratio-1 layers 101; index_topk = 16
    D, W, k = cfg.head_dim, cfg.window, cfg.index_topk
    b = decode_step_bytes(cfg, weights, p)
    assert b["weights"] == sum(t.numel() * t.element_size() for w in weights for t in w.values())
    assert b["window"] == 40 * (W + 1) * D * 2
    assert b["selected"] == 38 * min(k, 50) * D * 2  # layers 2..39 have ratio > 0
    assert b["index_keys"] == (3 * 50 + 5 * 101) * cfg.index_head_dim * 2  # sources 2,8,14 | 20,24,..,36
    # kv sources: three of ratio 2 (state read+write, no group completes at p=100: 101 % 2 = 1), one of ratio 1
    assert b["compressor"] == 3 * (2 * 2 * D * 4) + (D + cfg.index_head_dim) * 2
    assert b["total"] == sum(v for key, v in b.items() if key != "total")
    b1 = decode_step_bytes(cfg, weights, 101)  # a ratio-2 group completes: three more rows and keys
    assert b1["compressor"] - b["compressor"] == 3 * (D + cfg.index_head_dim) * 2


def test_decode_step_bytes_packed(cfg, weights):
    """Packed caches: the same weights and activations; window rows D + D/32 bytes,
    compressed rows D/2 + D/16, index keys d/2 + d/32 instead of 2 bytes per value."""
    b, p = decode_step_bytes(cfg, weights, 1000), decode_step_bytes(cfg, weights, 1000, "packed")
    D, d = cfg.head_dim, cfg.index_head_dim
    assert p["weights"] == b["weights"] and p["activations"] == b["activations"]
    assert p["window"] * 2 * D == b["window"] * (D + D // 32)
    assert p["selected"] * 2 * D == b["selected"] * (D // 2 + D // 16)
    assert p["index_keys"] * 2 * d == b["index_keys"] * (d // 2 + d // 32)
    with pytest.raises(ValueError, match="kv_format = 'fp8'"):
        decode_step_bytes(cfg, weights, 1000, "fp8")


def test_fp8_stack_reads_about_half_the_weight_bytes(cfg, weights):
    """decode_step_bytes counts weights as stored: an FP8 stack's FP8 linears 1 byte per
    element plus one scale byte per 32×32 block, the other tensors as in bf16 (wo_a held as
    its bf16 here; by default as its bytes, 1 byte per element plus its scales)."""
    f8 = random_weights(cfg, 0, weights="fp8")
    rt = RuntimeStack(cfg, f8, wo_a="bf16")
    assert stack_weight_format(rt) == "fp8" and stack_weight_format(RuntimeStack(cfg, weights)) == "bf16"
    b16, b8 = decode_step_bytes(cfg, weights, 100), decode_step_bytes(cfg, rt.weights, 100)
    lin = sum(w[f"{n}.weight"].numel() for w in weights for n in FP8_LINEARS if f"{n}.weight" in w)
    scales = sum(-(-w[f"{n}.weight"].shape[0] // 32) * (w[f"{n}.weight"].shape[1] // 32)
                 for w in weights for n in FP8_LINEARS if f"{n}.weight" in w)  # fmt: skip
    assert b8["weights"] == b16["weights"] - 2 * lin + lin + scales, "FP8 linears: 1 byte + scales"
    assert {k: v for k, v in b8.items() if k not in ("weights", "total")} == {
        k: v for k, v in b16.items() if k not in ("weights", "total")
    }, "everything but the weights is the same"
    fp8_part = lin + scales
    assert 0.5 < fp8_part / (2 * lin) < 0.51, "the FP8 linears' bytes about halve"
    assert b8["weights"] < 0.75 * b16["weights"], (b8["weights"], b16["weights"])
    wo_a = [w["wo_a.weight"] for w in weights]
    wo_a_bytes = sum(t.numel() for t in wo_a)
    wo_a_scales = sum(-(-t.shape[0] // 32) * (t.shape[1] // 32) for t in wo_a)
    kept = decode_step_bytes(cfg, RuntimeStack(cfg, f8).weights, 100)
    assert kept["weights"] == b8["weights"] - 2 * wo_a_bytes + wo_a_bytes + wo_a_scales, "wo_a's bytes by default"


def test_prefill_flops_by_token_loop(cfg):
    m = 37
    H, D, W, dim, IH, ID = cfg.n_heads, cfg.head_dim, cfg.window, cfg.dim, cfg.index_heads, cfg.index_head_dim
    want = 0.0
    for role in cfg.roles:
        r = role.ratio
        proj = dim * cfg.q_rank + cfg.q_rank * H * D + dim * D + cfg.groups * cfg.o_rank * (H * D // cfg.groups)
        proj += cfg.groups * cfg.o_rank * dim
        want += 2 * m * proj
        if role.is_kv_source:
            want += 2 * m * dim * D * (2 if r >= 2 else 1) + 2 * (m // r) * D * ID
        if role.is_index_source:
            want += 2 * m * (cfg.q_rank * IH * ID + dim * IH)
        for t in range(m):
            L = (t + 1) // r if r else 0
            entries = min(t + 1, W) + (min(cfg.index_topk, L) if r else 0)
            want += 4 * H * D * entries
            if role.is_index_source:
                want += 2 * IH * ID * L
    assert prefill_flops(cfg, m) == pytest.approx(want, rel=1e-12)


def test_fill_context_puts_rows_on_the_grids(cfg, weights):
    stack = RuntimeStack(cfg, weights)
    ops = stack.attn.ops
    fill_context(stack, 301, seed=3)
    for st in stack.states:
        assert st.next_pos == 301
        assert torch.equal(ops.fp8_qdq(st.ring.clone()), st.ring), "ring rows must lie on the fp8 grid"
        assert st.ring.abs().sum() > 0
        if st.role.is_kv_source:
            n = 301 // st.role.ratio
            assert st.n_rows == n
            ckv, ik = st.compress_kv[:n], st.index_k[:n]
            assert torch.equal(ops.fp4_e4m3_qdq(ckv.clone()), ckv)
            assert torch.equal(ops.fp4_e8m0_qdq(ik.clone()), ik)
            assert not st.compress_kv[n:].any(), "rows past the context stay empty"
            if st.role.ratio == 2:  # 301 = 2·150 + 1: one remainder token in slot 0
                assert torch.isfinite(st.comp_g[0]).all() and torch.isneginf(st.comp_g[1]).all()
    # a decode step at the context runs and is finite
    x = torch.randn(cfg.n_layers, 1, cfg.dim).to(torch.bfloat16)
    outs = stack.step(list(x), 301, keep=True)
    assert all(torch.isfinite(o.float()).all() for o in outs)
    with pytest.raises(ValueError, match="context = 512; allowed: 1..511"):
        fill_context(stack, 512)


def _dequant_v4(cache: torch.Tensor, n: int) -> torch.Tensor:
    """Read the V4 layout back from its bytes (FlashMLA's documented layout)."""
    nb, block = cache.shape[0], cache.shape[1]
    raw = torch.as_strided(cache.view(torch.uint8), (nb, block * V4_BYTES), (cache.stride(0), 1))
    data = raw[:, : block * 576].reshape(nb * block, 576)
    scales = raw[:, block * 576 : block * V4_BYTES].reshape(nb * block, 8)
    nope = data[:, :448].contiguous().view(torch.float8_e4m3fn).float().view(-1, 7, 64)
    nope = nope * torch.exp2(scales[:, :7].float() - 127)[..., None]
    rope = data[:, 448:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope.view(-1, 448), rope], 1)[:n]


def test_v4_cache_layout_round_trip():
    gen = torch.Generator().manual_seed(5)
    rows = (torch.randn(192, 512, generator=gen) * torch.logspace(-2, 2, 192)[:, None]).to(torch.bfloat16)
    cache = v4_cache(rows)
    assert cache.shape == (3, 64, 1, V4_BYTES) and cache.dtype == torch.float8_e4m3fn
    assert cache.stride(1) == V4_BYTES and cache.stride(0) % 576 == 0 and cache.stride(0) >= 64 * V4_BYTES
    back = _dequant_v4(cache, 192)
    assert torch.equal(back[:, 448:], rows[:, 448:].float()), "rope values are stored as bf16, exactly"
    ref = rows[:, :448].float()
    amax = ref.view(-1, 7, 64).abs().amax(-1, keepdim=True).expand(-1, -1, 64).reshape(-1, 448)
    assert ((back[:, :448] - ref).abs() <= amax * 2.0**-3).all(), "fp8 e4m3 with a power-of-two tile scale"
    with pytest.raises(ValueError, match="multiple of the page block 64"):
        v4_cache(rows[:100])
    on_grid = v4_grid_(rows.clone())
    assert torch.equal(on_grid[:, 448:], rows[:, 448:])
    assert torch.equal(_dequant_v4(v4_cache(on_grid), 192), on_grid.float()), "grid rows are stored exactly"
    assert torch.equal(v4_grid_(on_grid.clone()), on_grid), "rounding onto the grid is idempotent"


def test_check_selection_catches_wrong_topk():
    s = torch.tensor([[0.5, 3.0, 1.0, 3.0, -2.0, 2.0]])
    check_selection(s, torch.tensor([[1, 3, 5]], dtype=torch.int32), 3)
    with pytest.raises(RuntimeError, match="missing"):
        check_selection(s, torch.tensor([[1, 2, 5]], dtype=torch.int32), 3)
    with pytest.raises(RuntimeError, match="ascending"):
        check_selection(s, torch.tensor([[3, 1, 5]], dtype=torch.int32), 3)
    with pytest.raises(RuntimeError, match="distinct"):
        check_selection(s, torch.tensor([[1, 1, 3]], dtype=torch.int32), 3)
    t = torch.tensor([[1.0, 2.0, 2.0, 2.0]])  # ties at the k-th score: either is right
    check_selection(t, torch.tensor([[1, 2]], dtype=torch.int32), 2)
    check_selection(t, torch.tensor([[2, 3]], dtype=torch.int32), 2)


def test_floor_takes_the_larger_bound():
    assert floor_ms(1e9, 0, CEIL) == pytest.approx(1.0)  # 1 GB at 1000 GB/s
    assert floor_ms(0, 1e12, CEIL) == pytest.approx(10.0)  # 1 TFLOP at 100 TFLOP/s
    r = kernel_row("x", "s", Timing(2.0, 2.0, 2.0, 1), 1e9, 1e12, CEIL)
    assert r["bound"] == "compute" and r["x_floor"] == pytest.approx(0.2) and r["gbps"] == pytest.approx(500.0)


def test_peer_estimate_swaps_attention_time():
    cfg = small_preset()
    res = {
        "decode": [{"context": 4, "mode": "graphs", "ms": 10.0}, {"context": 4, "mode": "eager", "ms": 20.0}],
        "peer": [
            {"context": 4, "batch": 1, "name": "attnv41 (bf16 rows)", "ms": 0.1},
            {"context": 4, "batch": 1, "name": "FlashMLA legacy (x)", "ms": 0.04},
            {"context": 4, "batch": 64, "name": "FlashMLA legacy (x)", "ms": 9.0},
        ],
    }
    bench_run._peer_estimate(res, cfg)
    assert res["decode"][0]["peer_est_ms"] == pytest.approx(10.0 - 38 * 0.06)
    assert "peer_est_ms" not in res["decode"][1]


def test_bench_command_on_cpu(tmp_path, capsys):
    out = tmp_path / "b"
    assert (
        main(
            [
                "bench",
                "--device",
                "cpu",
                "--quick",
                "--out",
                str(out),
                "--contexts",
                "96,200",
                "--index-lengths",
                "1000",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "gate: bundled golden tiny (bf16 weights) through the runtime on cpu" in text and "0 failed" in text
    res = json.loads((out / "bench.json").read_text())
    assert not res.get("errors")
    for part in bench_run.DEFAULT_PARTS:
        assert res[part], f"part {part} produced no rows"
    assert [(r["weights"], r["kv_format"], r["context"]) for r in res["decode"]] == [
        (f, k, c) for f in ("bf16", "fp8") for k in ("bf16", "packed") for c in (96, 96, 200, 200)
    ], "both weight formats by default, bf16 first; each with both cache formats"
    for rp in (r for r in res["decode"] if r["kv_format"] == "packed"):  # against the bytes its caches hold
        rb = next(r for r in res["decode"] if r["kv_format"] == "bf16" and r["context"] == rp["context"])
        assert rp["bytes"]["window"] < 0.6 * rb["bytes"]["window"] and rp["floor_ms"] < rb["floor_ms"]
    assert {r["mode"] for r in res["decode"]} == {"split", "eager"}
    assert [(r["weights"], r["tokens"]) for r in res["prefill"]] == [(f, t) for f in ("bf16", "fp8") for t in (64, 128)]
    for r in res["decode"] + res["prefill"]:
        assert r["ms"] > 0 and r["floor_ms"] > 0 and r["x_floor"] > 0
    for r8 in (r for r in res["decode"] if r["weights"] == "fp8"):  # each against the bytes it reads
        r16 = next(
            r
            for r in res["decode"]
            if r["weights"] == "bf16" and r["context"] == r8["context"] and r["kv_format"] == r8["kv_format"]
        )
        assert r8["bytes"]["weights"] < 0.75 * r16["bytes"]["weights"] and r8["floor_ms"] < r16["floor_ms"]
    assert {r["weights"] for r in res["kernels"]} == {"bf16", "fp8", None}
    prefill_m = {r["shape"].split()[0] for r in res["kernels"] if r["regime"] == "prefill" and r["weights"]}
    assert prefill_m == {"m=128"}, "kernel prefill rows at the largest --prefill length"
    assert res["weights"] == {"kernels": ["bf16", "fp8"], "stacks": ["bf16", "fp8"]} and "skipped" not in res
    assert res["ceilings"]["fp8_mm_tflops"] is None and "fp8 matmul: not measured on the CPU" in text
    assert res["peer_status"] == "skipped (needs CUDA)"
    assert (out / "decode_step.png").stat().st_size > 10_000
    md = (out / "bench.md").read_text()
    assert "### (a) decode step" in md and "| context | weights |" in md
    assert "### (a) decode step, 40 layers, batch 1, bf16 and fp8 weights" in md
    assert "### (e) prefill through 40 layers, bf16 and fp8 weights" in md and "| tokens | weights |" in md
    assert "| wq_a fp8 | decode | fp8 |" in md
    assert res["nonfinite_values"] == 0 and "non-finite values that entered a cache write: 0" in text
    assert {r["kv_format"] for r in res["batch"]} == {"bf16", "packed"}, "decode rows for both cache formats"
    assert [r["weights"] for r in res["batch"]] == sorted(
        (r["weights"] for r in res["batch"]), key=["bf16", "fp8"].index
    )
    assert {r["weights"] for r in res["batch"]} == {r["weights"] for r in res["batch_prefill"]} == {"bf16", "fp8"}
    assert [r["mode"] for r in res["batch_prefill"]] == ["eager", "graphs"] * (len(res["batch_prefill"]) // 2)
    assert all(r["ms"] > 0 for r in res["batch_prefill"]) and res["batch_prefill"]
    kb = res["kv_bytes_per_token"]  # the small preset's kv sources
    assert kb["packed"] < kb["bf16"] and kb["runtime"] == "bf16" and "KV bytes per token" in md


def test_bench_command_rejects_bad_input(tmp_path, capsys):
    assert main(["bench", "--device", "cpu", "--parts", "decode,nope", "--out", str(tmp_path)]) == 2
    assert "allowed: a comma-separated subset" in capsys.readouterr().err
    assert main(["bench", "--contexts", "4k"]) == 2  # argparse's error: one line, exit 2
    assert "attnv41 bench: argument --contexts: '4k'" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"weights = 'fp4'; allowed: 'both', 'bf16', 'fp8'"):
        bench_run.run_bench(bench_run.BenchOptions(weights="fp4", device="cpu"))
    with pytest.raises(ValueError, match="contexts = .*allowed: positive integers"):
        bench_run.run_bench(bench_run.BenchOptions(contexts=(0,), device="cpu"))
    assert not any(tmp_path.iterdir()), "nothing written on bad input"


def test_gate_failure_times_nothing(monkeypatch):
    from attnv41 import golden

    class Bad:
        n_compared, n_failed = 10, 1

    monkeypatch.setattr(golden, "replay", lambda *a, **k: Bad())
    with pytest.raises(RuntimeError, match="correctness gate.*nothing was timed"):
        bench_run.run_bench(bench_run.BenchOptions(parts=("decode",), device="cpu"))


def test_failing_part_is_reported_and_fails_the_command(tmp_path, monkeypatch, capsys):
    from attnv41.bench import index

    def boom(*a, **k):
        raise RuntimeError("index broke")

    monkeypatch.setattr(index, "bench_index_topk", boom)
    assert main(["bench", "--device", "cpu", "--quick", "--parts", "index,prefill", "--out", str(tmp_path)]) == 1
    res = json.loads((tmp_path / "bench.json").read_text())
    assert "index broke" in res["errors"]["index"] and res["prefill"]
    assert "FAILED part index" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.gpu_full  # a smoke run of every bench part: the full GPU tier
def test_bench_command_on_cuda_small(tmp_path):
    """Every part through the Triton kernels at the small geometry (the peer needs 64 heads
    of width 512, so it reports itself as not run)."""
    args = ["bench", "--device", "cuda", "--preset", "small", "--quick", "--out", str(tmp_path)]
    args += ["--contexts", "256,1024", "--prefill", "64,128", "--index-lengths", "4096,65536", "--batches", "1,4"]
    assert main(args) == 0
    res = json.loads((tmp_path / "bench.json").read_text())
    assert not res.get("errors") and res["gate"]["released"]["failed"] == 0
    assert {r["mode"] for r in res["decode"]} == {"graphs", "eager"}
    for r in res["decode"]:
        if r["mode"] == "graphs":
            assert r["n_sources"] == 0 and 0 < r["host_ms"] < r["ms"] and r["capture_s"] > 0 and r["recaptures"] == 0
    assert all(r["impl"] == "triton" and r["timing"] == "graph" for r in res["kernels"]), [
        (r["name"], r.get("graph_error")) for r in res["kernels"] if r["timing"] != "graph"
    ]
    assert res["ceilings"]["copy_gbps"] > 100 and res["ceilings"]["mm_tflops"] > 1  # --quick: a 512^3 product


def test_bench_on_a_written_checkpoint(tmp_path, capsys):
    """`--checkpoint`: the stack parts use its geometry and weights, loaded once in each
    format ("both", the default: bf16 dequantized, fp8 as stored)."""
    from attnv41.checkpoint import write_checkpoint

    cfg = small_preset(max_tokens=64, max_seq=128)
    ckpt = tmp_path / "ckpt"
    write_checkpoint(ckpt, cfg, random_weights(cfg, 7), shards=3)
    out = tmp_path / "b"
    args = ["bench", "--device", "cpu", "--quick", "--checkpoint", str(ckpt), "--no-progress", "--out", str(out)]
    assert (
        main(args + ["--parts", "decode,prefill", "--contexts", "64", "--prefill", "16", "--kv-formats", "bf16"]) == 0
    )
    res = json.loads((out / "bench.json").read_text())
    assert res["stack"] == f"checkpoint {ckpt}"
    assert [(r["weights"], r["context"]) for r in res["decode"]] == [("bf16", 64)] * 2 + [("fp8", 64)] * 2
    assert [(r["weights"], r["tokens"]) for r in res["prefill"]] == [("bf16", 16), ("fp8", 16)]
    text = capsys.readouterr().out
    assert f"checkpoint {ckpt}, bf16 weights" in text and f"checkpoint {ckpt}, fp8 weights" in text
    assert text.count(f"stack: checkpoint {ckpt}") == 3, "bf16, fp8 for (a); fp8 held for (e), then bf16"


def test_bench_weights_that_cannot_run(tmp_path, monkeypatch, capsys):
    """FP8 that cannot run: skipped with its reason under 'both' (kept in the results),
    refused up front when asked for alone."""
    import dataclasses

    from attnv41.checkpoint import write_checkpoint
    from attnv41.runtime import ops

    cfg = small_preset(max_tokens=64, max_seq=128)
    bf = write_checkpoint(tmp_path / "bf16", cfg, random_weights(cfg, 7), shards=2, fp8_names=())
    base = dict(device="cpu", quick=True, contexts=(64,), prefill=(16,), progress=False)
    res = bench_run.run_bench(bench_run.BenchOptions(parts=("prefill",), checkpoint=str(bf), **base))
    assert res["skipped"] == {
        "decode/prefill fp8": f"checkpoint {bf} does not hold its FP8 linears as e4m3 with scales"
    }
    assert [r["weights"] for r in res["prefill"]] == ["bf16"]
    assert res["weights"] == {"kernels": ["bf16", "fp8"], "stacks": ["bf16"]}
    assert "skipped: decode/prefill fp8: checkpoint" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"weights = 'fp8', but checkpoint .* allowed: 'bf16'"):
        bench_run.run_bench(bench_run.BenchOptions(checkpoint=str(bf), weights="fp8", **base))
    # an op table without an FP8 GEMM (CUDA until its kernel lands)
    monkeypatch.setattr(ops, "ops_for", lambda dev: dataclasses.replace(ops.TORCH_OPS, name="nofp8", fp8_mm=None))
    res = bench_run.run_bench(bench_run.BenchOptions(parts=("kernels",), **base))
    why = "the 'nofp8' op table on cpu has no FP8 GEMM (fp8_mm) yet"
    assert res["skipped"] == {"kernels fp8": why, "decode/prefill fp8": why}
    assert {r["weights"] for r in res["kernels"]} == {"bf16", None}
    out = tmp_path / "b"
    bench_run.write_outputs(res, out, log=lambda s: None)
    assert f"Skipped: kernels fp8: {why}" in (out / "bench.md").read_text()
    with pytest.raises(ValueError, match=r"weights = 'fp8', but the 'nofp8' op table on cpu has no FP8 GEMM"):
        bench_run.run_bench(bench_run.BenchOptions(parts=("kernels",), weights="fp8", **base))
    assert main(["bench", "--device", "cpu", "--weights", "fp8", "--out", str(tmp_path / "c")]) == 2
    assert "attnv41 bench: weights = 'fp8', but the 'nofp8' op table" in capsys.readouterr().err
    assert not (tmp_path / "c").exists(), "nothing written on a refused format"


def test_bench_contexts_shorter_than_the_prefill_rows(tmp_path):
    """`--contexts` below the longest `--prefill` length: the stack's max_seq still holds
    max_tokens (the config's rule), e.g. `bench --contexts 4096` on a GPU beside 8,192-token
    prefill rows (it raised before)."""
    out = tmp_path / "b"
    args = ["bench", "--device", "cpu", "--quick", "--parts", "decode", "--weights", "bf16", "--out", str(out)]
    assert main([*args, "--contexts", "40", "--prefill", "300"]) == 0
    res = json.loads((out / "bench.json").read_text())
    assert not res.get("errors") and {r["context"] for r in res["decode"]} == {40}


def test_bench_long_part_on_cpu(tmp_path, capsys):
    """`--parts long`: one prompt prefilled in chunks through BatchGraphs, decode at its end;
    its row says how far the prefill got and what the caches hold (both cache formats), and
    the part is not in the default run."""
    assert "long" in bench_run.PARTS and "long" not in bench_run.DEFAULT_PARTS
    out = tmp_path / "b"
    args = ["bench", "--device", "cpu", "--quick", "--parts", "long", "--weights", "bf16", "--out", str(out)]
    assert main([*args, "--long-context", "80", "--long-kv-formats", "bf16,packed"]) == 0
    res = json.loads((out / "bench.json").read_text())
    assert not res.get("errors")
    rows = res["long"]
    assert [(r["kv_format"], r["context"], r["reached"], r["chunk"]) for r in rows] == [
        ("bf16", 80, 80, 32),
        ("packed", 80, 80, 32),
    ]
    for r in rows:
        assert r["prefill_s"] > 0 and r["tok_s"] > 0 and r["decode_ms"] > 0
        assert r["decode_at"] == 80 + 2 + 3, "two untimed decode steps and three timed ones after the prompt"
        assert [end for end, _ in r["chunk_ms"]] == [32, 64, 80], "every chunk timed, ending at its last position"
    assert rows[1]["caches_gib"] < rows[0]["caches_gib"], "packed caches hold fewer bytes"
    assert "(h) one long prompt in chunks" in (out / "bench.md").read_text()
    assert "long: 80 of 80 tokens (bf16 caches)" in capsys.readouterr().out


def test_bench_long_budget_and_bad_input(tmp_path):
    """A spent budget stops the prefill at a sync point (every 8 chunks) and the decode runs
    where it stopped; bad values raise naming them, before anything runs."""
    from attnv41.bench.long import bench_long
    from attnv41.runtime.stack import RuntimeStack
    from attnv41.synthetic import PRESETS, random_weights

    cfg = PRESETS["small"](max_tokens=8, max_seq=256)
    stack = RuntimeStack(cfg, random_weights(cfg, 0, torch.device("cpu")), device=torch.device("cpu"))
    r = bench_long(stack, 200, 8, steps=1, budget_s=1e-9, log=lambda s: None)
    assert r["reached"] == 64 and r["decode_at"] == 64 + 3, "stopped at the first check, 8 chunks of 8"
    for kw, match in (
        (dict(context=0), r"context = 0; allowed: an int >= 1"),
        (dict(chunk=True), r"chunk = True; allowed: an int >= 1"),
        (dict(budget_s=0), r"budget_s = 0; allowed: None or > 0 seconds"),
        (dict(context=cfg.max_position_embeddings), r"allowed: <= "),
    ):
        with pytest.raises(ValueError, match=match):
            bench_long(stack, **{"context": 200, "chunk": 8, **kw})
    from attnv41.bench import long as long_mod

    class NanOnSecond(long_mod.BatchGraphs):  # the second chunk's outputs hold a NaN
        def step(self, *a, **k):
            y = super().step(*a, **k)
            if self.batch.pool.length[0] == 16:
                y[0, 0, 0] = float("nan")
            return y

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(long_mod, "BatchGraphs", NanOnSecond)
        with pytest.raises(RuntimeError, match=r"non-finite outputs in a chunk ending at or before position 24"):
            bench_long(stack, 24, 8, steps=1, log=lambda s: None)
    with pytest.raises(ValueError, match=r"long_context = -3; allowed: a positive integer"):
        bench_run.run_bench(bench_run.BenchOptions(parts=("long",), long_context=-3, device="cpu"))
    assert not any(tmp_path.iterdir())


MPE = small_preset().max_position_embeddings  # the CPU preset's last position + 1 (2^20)


@pytest.fixture
def no_gate(monkeypatch):
    """The correctness gate raises if it runs: a refused option must be refused before it."""
    from attnv41 import golden

    def replay(*a, **k):
        raise AssertionError("the gate ran: the option should have been refused before it")

    monkeypatch.setattr(golden, "replay", replay)


# (part, quick, options at their largest allowed values, the option one past it, its message).
# By hand: --quick decode runs 2 oracle steps, 3 + 1 per mode, 1 host-timed step and 1 more
# position past its context (12; 50 reps: 2 + 6 + 10 + 5 + 10 + 1 = 34); batch rows run
# k × (3 steps + 3) positions past theirs; long rows 3 steps + 3.
_BOUNDS = [
    (
        "decode",
        True,
        dict(contexts=(64, MPE - 12)),
        dict(contexts=(64, MPE - 11)),
        f"contexts = (64, {MPE - 11}); allowed: <= {MPE - 12} (max_position_embeddings {MPE} less the 12 positions "
        "the decode part runs past its context)",
    ),
    (
        "decode",
        False,
        dict(contexts=(MPE - 34,)),
        dict(contexts=(MPE - 33,)),
        f"contexts = ({MPE - 33},); allowed: <= {MPE - 34} (max_position_embeddings {MPE} less the 34 positions "
        "the decode part runs past its context)",
    ),
    (
        "prefill",
        True,
        dict(prefill=(16, MPE)),
        dict(prefill=(16, MPE + 1)),
        f"prefill = (16, {MPE + 1}); allowed: <= {MPE} (max_position_embeddings; the stack that part prefill runs on "
        "takes max(prefill) tokens per call)",
    ),
    (
        "batch",
        True,
        dict(batch_contexts=(MPE - 12,), verify_lens=(1, 2)),
        dict(batch_contexts=(MPE - 11,), verify_lens=(1, 2)),
        f"batch_contexts = ({MPE - 11},); allowed: <= {MPE - 12} (max_position_embeddings {MPE} less the 12 "
        "positions the batch part runs past its context, 2 per step)",
    ),
    (
        "batch",
        True,
        dict(batch_sizes=(1, MPE // 2), verify_lens=(2,)),
        dict(batch_sizes=(1, MPE // 2 + 1), verify_lens=(2,)),
        f"batch_sizes = (1, {MPE // 2 + 1}); allowed: <= {MPE // 2} (max_position_embeddings {MPE} over "
        "max(verify_lens) 2: one step of the batch part takes batch × k tokens)",
    ),
    (
        "batch",
        True,
        dict(verify_lens=((MPE - 1) // 6,), batch_contexts=(1,), batch_sizes=(1,)),
        dict(verify_lens=((MPE - 1) // 6 + 1,), batch_contexts=(1,), batch_sizes=(1,)),
        f"verify_lens = ({(MPE - 1) // 6 + 1},); allowed: <= {(MPE - 1) // 6} (max_position_embeddings {MPE}: "
        "the batch part runs 6 steps of k tokens past a context of at least one token)",
    ),
    (
        "long",
        True,
        dict(long_context=MPE - 6),
        dict(long_context=MPE - 5),
        f"long_context = {MPE - 5}; allowed: <= {MPE - 6} (max_position_embeddings {MPE} less the 6 positions "
        "the long part decodes past its prompt)",
    ),
]


@pytest.mark.parametrize("part, quick, largest, past, message", _BOUNDS)
def test_bench_refuses_values_past_the_geometry(no_gate, part, quick, largest, past, message):
    """Each part's values beyond the geometry's max_position_embeddings (less the positions
    the part runs past them) are refused before the gate, naming the option, its value and
    the largest allowed; the largest itself is accepted."""
    base = dict(parts=(part,), device="cpu", quick=quick, weights="bf16")
    with pytest.raises(ValueError) as e:
        bench_run.run_bench(bench_run.BenchOptions(**base, **past))
    assert str(e.value) == message
    dev, o = bench_run._resolve(bench_run.BenchOptions(**base, **largest))
    assert dev.type == "cpu" and {k: getattr(o, k) for k in largest} == largest


def test_bench_bounds_only_for_the_parts_run(no_gate, tmp_path):
    """Values no selected part runs with are not bounded (contexts and prefill lengths of
    the kernels and the peer have no position limit), and a checkpoint's geometry is the
    one that bounds them."""
    from attnv41.checkpoint import write_checkpoint

    big = dict(contexts=(MPE + 1,), prefill=(MPE + 1,), long_context=MPE + 1, batch_contexts=(MPE + 1,))
    bench_run._resolve(bench_run.BenchOptions(parts=("kernels", "peer", "index"), device="cpu", **big))
    cfg = small_preset(max_tokens=64, max_seq=128).replace(max_position_embeddings=300)
    ckpt = write_checkpoint(tmp_path / "ckpt", cfg, random_weights(cfg, 7), shards=1)
    base = dict(parts=("decode", "prefill"), device="cpu", quick=True, checkpoint=str(ckpt))
    bench_run._resolve(bench_run.BenchOptions(**base, contexts=(288,), prefill=(300,)))
    with pytest.raises(ValueError, match=r"contexts = \(289,\); allowed: <= 288 \(max_position_embeddings 300 "):
        bench_run.run_bench(bench_run.BenchOptions(**base, contexts=(289,), prefill=(16,)))
    with pytest.raises(ValueError, match=r"prefill = \(301,\); allowed: <= 300 \(.*parts decode, prefill run on"):
        bench_run.run_bench(bench_run.BenchOptions(**base, contexts=(16,), prefill=(301,)))


def test_bench_position_bounds_match_the_parts_own_checks(cfg, weights):
    """The rooms `_resolve` uses are the parts' own: bench_decode_one and bench_long refuse
    one position past them, with the reps and steps run_bench passes (PART_REPS)."""
    from attnv41.bench.long import bench_long, long_room
    from attnv41.bench.stack import bench_decode_one, decode_room

    assert bench_run.PART_REPS["decode"] == (50, 3) and bench_run.PART_REPS["long"] == (20, 3)
    assert (decode_room(50), decode_room(3), long_room(3)) == (34, 12, 6)
    stack = RuntimeStack(cfg, weights)  # max_seq 512
    with pytest.raises(ValueError, match="contexts up to 501 need max_seq >= 513; the stack has 512"):
        bench_decode_one(stack, (64, 512 - 12 + 1), CEIL, reps=3)
    with pytest.raises(ValueError, match=rf"context = {MPE - 5} \(\+ 6 decode positions\); allowed: <= {MPE - 6} "):
        bench_long(stack, MPE - 5, 8, steps=3)


def test_bench_command_refuses_a_context_past_the_geometry(no_gate, tmp_path, capsys):
    """The command line: one line naming the option, exit 2, nothing run or written."""
    out = tmp_path / "b"
    args = ["bench", "--device", "cpu", "--quick", "--parts", "decode", "--out", str(out)]
    assert main([*args, "--contexts", "1048576"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnv41 bench: contexts = (1048576,); allowed: <= {MPE - 12} (max_position_embeddings")
    assert "Traceback" not in err and not out.exists()


def test_batch_step_with_more_tokens_than_positions(cfg, weights):
    """B·k tokens per step above the positions a row holds (ctx + k·(steps + 3)), e.g.
    --batch-sizes 512 --batch-contexts 128: `_batch` raises max_seq to max_tokens (the
    config requires max_tokens <= max_seq; it refused the row before) and the row runs."""
    from attnv41.bench.batch import _batch, batch_room, bench_batch

    stack = RuntimeStack(cfg, weights)
    with pytest.raises(ValueError, match=r"AttnV41Cfg.max_seq = 12; allowed: max_tokens \(32\) <= max_seq"):
        cfg.replace(max_seq=8 + batch_room(1, 1), max_tokens=32)
    bt = _batch(stack, 32, 8 + batch_room(1, 1), 32)
    assert (bt.cfg.max_seq, bt.cfg.max_tokens, bt.pool.n_slots) == (32, 32, 32)
    assert _batch(stack, 1, 100, 8).cfg.max_seq == 100, "a larger max_seq is kept"
    res = bench_batch(stack, (8,), (32,), CEIL, steps=1, chunk=8, kv_formats=("bf16",))
    assert [(r["batch"], r["context"], r["k"]) for r in res["decode"]] == [(32, 8, 1)]
    assert res["decode"][0]["ms"] > 0


def test_bench_tensor_parallel_share(tmp_path, capsys):
    """`--tp 2`: the stack parts run rank 0's share (half the heads, one output group), from
    a checkpoint too (its share loaded); the tables say so; a size the geometry does not
    shard into is refused before anything runs (exit 2, naming the value)."""
    from attnv41.checkpoint import write_checkpoint

    cfg = small_preset(max_tokens=64, max_seq=128)
    ckpt = tmp_path / "ckpt"
    write_checkpoint(ckpt, cfg, random_weights(cfg, 7), shards=2)
    out = tmp_path / "b"
    args = ["bench", "--device", "cpu", "--quick", "--checkpoint", str(ckpt), "--no-progress", "--out", str(out)]
    args += ["--parts", "decode", "--contexts", "64", "--prefill", "16", "--kv-formats", "bf16", "--tp", "2"]
    assert main(args + ["--weights", "fp8"]) == 0
    res = json.loads((out / "bench.json").read_text())
    assert res["options"]["tp"] == 2 and res["stack"] == f"checkpoint {ckpt}, rank 0 of tp 2"
    assert [(r["weights"], r["context"]) for r in res["decode"]] == [("fp8", 64)] * 2
    text = capsys.readouterr().out
    assert f"{cfg.n_heads // 2}x{cfg.head_dim} heads" in text and "rank 0 of 2" in text
    assert "rank 0 of tensor parallelism 2" in (out / "bench.md").read_text()
    assert main(["bench", "--device", "cpu", "--quick", "--tp", "3", "--out", str(tmp_path / "c")]) == 2
    assert "tp_size = 3; allowed: [1, 2]" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_peer_problem_padded_to_the_peers_head_count():
    """A tensor-parallel share's 8 heads handed to the peer padded to 64 by zero queries and
    zero sinks: the first 8 heads' outputs are the share's (checked with our torch twin,
    heads being independent)."""
    from attnv41.bench import peer
    from attnv41.tp import tp_config

    cfg = tp_config(small_preset(), 2)
    gen = torch.Generator().manual_seed(3)
    pb = peer._problem(cfg, 2, 96, 1, gen, torch.device("cpu"))
    wide = peer._padded(pb, 64)
    assert wide.q[0].shape == (2, 64, cfg.head_dim) and wide.sink.shape == (64,)
    B, H, D = pb.q[0].shape
    sel = torch.cat([pb.win_idx, pb.comp_idx[0] + B * cfg.window], 1)
    o = peer._torch_twin(
        pb.q[0], pb.win, pb.comp, sel, B * cfg.window, pb.sink, D**-0.5, torch.empty(B, H, D, dtype=torch.bfloat16)
    )
    ow = peer._torch_twin(
        wide.q[0], pb.win, pb.comp, sel, B * cfg.window, wide.sink, D**-0.5, torch.empty(B, 64, D, dtype=torch.bfloat16)
    )
    assert torch.equal(ow[:, :H], o) and torch.isfinite(ow.float()).all()


def test_bench_without_matplotlib(tmp_path, monkeypatch, capsys):
    """matplotlib is an optional dependency (`attnv41[bench]`): without it bench writes its
    JSON and tables and says why there is no plot."""
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = tmp_path / "b"
    args = ["bench", "--device", "cpu", "--quick", "--parts", "decode", "--contexts", "64", "--prefill", "16"]
    assert main(args + ["--kv-formats", "bf16", "--weights", "bf16", "--out", str(out)]) == 0
    assert (out / "bench.json").is_file() and (out / "bench.md").is_file()
    assert not (out / "decode_step.png").exists()
    assert "plot: not drawn, matplotlib is not installed" in capsys.readouterr().out


def test_bench_tp_where_fp8_does_not_shard(tmp_path, capsys):
    """A geometry whose rank would split a 32-block of wo_b's input (o_rank 16, 2 groups, tp
    2): under `--weights both` FP8 is skipped with that reason and bf16 runs; `--weights fp8`
    is refused before anything runs."""
    from attnv41.checkpoint import write_checkpoint
    from helpers import small_cfg

    cfg = small_cfg(max_tokens=64, max_seq=128)
    ckpt = tmp_path / "ckpt"
    write_checkpoint(ckpt, cfg, random_weights(cfg, 7), shards=1)
    args = ["bench", "--device", "cpu", "--quick", "--checkpoint", str(ckpt), "--no-progress", "--tp", "2"]
    args += ["--parts", "decode", "--contexts", "32", "--prefill", "16", "--kv-formats", "bf16"]
    assert main(args + ["--out", str(tmp_path / "b")]) == 0
    res = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert [r["weights"] for r in res["decode"]] == ["bf16", "bf16"]
    assert "FP8 weights do not shard into it: tp_size = 2; allowed: [1]" in res["skipped"]["decode/prefill fp8"]
    capsys.readouterr()
    assert main(args + ["--weights", "fp8", "--out", str(tmp_path / "c")]) == 2
    assert "weights = 'fp8', but FP8 weights do not shard into it" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
