"""`attnv41 bench` part (b), each kernel alone: a CPU smoke run on the small preset, the
bytes/FLOPs formulas checked by hand (FP8 projections included), the FP8 floor rate, and
the pre-timing check catching a broken op."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attnv41.bench.common import floor_ms, format_table, measure_ceilings
from attnv41.bench.kernels import FP8_KERNEL_NAMES, KERNEL_COLS, KERNEL_NAMES, bench_kernels, check_output
from attnv41.runtime.ops import TORCH_OPS
from attnv41.synthetic import small_preset

CONTEXT, PREFILL = 512, 32


@pytest.fixture(scope="module")
def cfg():
    return small_preset(max_tokens=64, max_seq=1024)


@pytest.fixture(scope="module")
def ceil():
    return measure_ceilings("cpu", quick=True)


@pytest.fixture(scope="module")
def rows(cfg, ceil):
    return bench_kernels(cfg, "cpu", ceil, context=CONTEXT, prefill_tokens=PREFILL, quick=True)


def _row(rows, name, regime):
    (r,) = [r for r in rows if r["name"] == name and r["regime"] == regime]
    return r


def test_every_kernel_in_every_regime(rows):
    got = {(r["name"], r["regime"]) for r in rows}
    want = {(n, reg) for n, regs in {**KERNEL_NAMES, **FP8_KERNEL_NAMES}.items() for reg in regs}
    assert got == want
    assert len(rows) == len(want)
    for r in rows:
        fmt = "fp8" if r["name"].endswith(" fp8") else ("bf16" if r["op"] in ("mm", "group_mm") else None)
        assert r["weights"] == fmt, (r["name"], r["regime"], r["weights"])


def test_rows_are_finite_and_positive(rows):
    for r in rows:
        for key in ("ms", "bytes", "floor_ms", "x_floor", "gbps"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["name"], r["regime"], key, r[key])
        assert r["flops"] >= 0 and r["tflops"] >= 0
        assert r["bound"] in ("memory", "compute")
        assert r["op"] in {f.name for f in dataclasses.fields(TORCH_OPS)}


def test_projection_formulas(rows, cfg):
    H, D, q_rank = cfg.n_heads, cfg.head_dim, cfg.q_rank
    r = _row(rows, "wq_b", "decode")
    assert r["op"] == "mm"
    assert r["bytes"] == (H * D * q_rank + q_rank + H * D) * 2
    assert r["flops"] == 2 * H * D * q_rank
    r = _row(rows, "wq_a", "prefill")
    assert r["bytes"] == (q_rank * cfg.dim + PREFILL * cfg.dim + PREFILL * q_rank) * 2
    assert r["flops"] == 2 * PREFILL * q_rank * cfg.dim
    G, gw, o_rank = cfg.groups, cfg.group_width, cfg.o_rank
    r = _row(rows, "wo_a", "decode")
    assert r["op"] == "group_mm"
    assert r["bytes"] == (G * o_rank * gw + G * gw + G * o_rank) * 2
    assert r["flops"] == 2 * G * o_rank * gw


@pytest.mark.parametrize("regime, m", [("decode", 1), ("prefill", PREFILL)], ids=["decode", "prefill"])
def test_fp8_projection_formulas(rows, cfg, regime, m):
    """FP8 rows: x and out bf16, the weight 1 byte per element, one e8m0 byte per 32×32 block."""
    dims = {
        "wq_a": (cfg.q_rank, cfg.dim),
        "wq_b": (cfg.n_heads * cfg.head_dim, cfg.q_rank),
        "wkv": (cfg.head_dim, cfg.dim),
        "wo_b": (cfg.dim, cfg.groups * cfg.o_rank),
        "indexer.wq_b": (cfg.index_heads * cfg.index_head_dim, cfg.q_rank),
    }
    for name, (N, K) in dims.items():
        r = _row(rows, f"{name} fp8", regime)
        assert (r["op"], r["weights"], r["shape"]) == ("fp8_mm", "fp8", f"m={m} out={N} in={K}"), name
        assert r["bytes"] == m * K * 2 + N * K + math.ceil(N / 32) * (K // 32) + m * N * 2, name
        assert r["flops"] == 2 * m * N * K, name
        b = _row(rows, name, regime)
        assert (b["op"], b["weights"], b["flops"]) == ("mm", "bf16", r["flops"]), name
        assert b["bytes"] == (m * K + N * K + m * N) * 2, name


def test_fp8_rows_use_the_fp8_rate(cfg, ceil):
    """With an FP8 matmul rate measured, FP8 rows take their compute floor from it and
    prefill rows give their share of it; bf16 rows stay on the matmul rate."""
    assert ceil.fp8_mm_tflops is None and "CPU" in ceil.fp8_mm_note  # not measured on the CPU
    fast = dataclasses.replace(ceil, fp8_mm_tflops=ceil.mm_tflops * 4)
    rows = bench_kernels(cfg, "cpu", fast, context=64, prefill_tokens=PREFILL, quick=True)
    fp8 = [r for r in rows if r["weights"] == "fp8"]
    assert len(fp8) == 2 * len(FP8_KERNEL_NAMES)
    for r in rows:
        rate = fast.fp8_mm_tflops if r["op"] == "fp8_mm" else fast.mm_tflops  # wo_a fp8: bf16 products
        assert r["floor_ms"] == pytest.approx(floor_ms(r["bytes"], r["flops"], fast, rate)), r["name"]
        if r["op"] == "fp8_mm" and r["regime"] == "prefill":
            assert r["floor_rate"] == "fp8_mm"
            assert r["pct_fp8_mm"] == pytest.approx(r["tflops"] / fast.fp8_mm_tflops * 100), r["name"]
        else:
            assert "pct_fp8_mm" not in r, r["name"]
    r = _row(bench_kernels(cfg, "cpu", ceil, context=64, prefill_tokens=8, quick=True), "wq_a fp8", "prefill")
    assert r["floor_rate"] == "mm" and "pct_fp8_mm" not in r, "no FP8 rate: the matmul rate, named"


def test_weights_select_the_projection_rows(cfg, ceil):
    only = bench_kernels(cfg, "cpu", ceil, context=64, prefill_tokens=8, quick=True, weights=("bf16",))
    assert {r["weights"] for r in only} == {"bf16", None}
    only = bench_kernels(cfg, "cpu", ceil, context=64, prefill_tokens=8, quick=True, weights=("fp8",))
    assert {r["weights"] for r in only} == {"fp8", None}
    assert {r["name"] for r in only if r["weights"]} == set(FP8_KERNEL_NAMES)


def test_attention_and_index_formulas(rows, cfg):
    H, D, W, k = cfg.n_heads, cfg.head_dim, cfg.window, cfg.index_topk
    K = W + k
    r = _row(rows, "sparse_attn", "decode")
    # decode: W ring rows + k distinct compressed rows; q and o; the selection; the sink
    assert r["bytes"] == K * D * 2 + 2 * H * D * 2 + K * 4 + H * 4
    assert r["flops"] == 2 * 2 * H * K * D
    r = _row(rows, "sparse_attn", "prefill")
    assert r["flops"] == 2 * 2 * PREFILL * H * K * D
    rows_read = (r["bytes"] - 2 * PREFILL * H * D * 2 - PREFILL * K * 4 - H * 4) // (D * 2)
    assert K <= rows_read <= W + CONTEXT  # distinct rows: at least one token's, at most all
    r = _row(rows, "index_scores", "decode")
    ih, d = cfg.index_heads, cfg.index_head_dim
    assert r["bytes"] == (ih * d + ih + CONTEXT * d + CONTEXT) * 2 + 4
    assert r["flops"] == 2 * ih * d * CONTEXT
    r = _row(rows, "ring_write", "decode")
    assert r["bytes"] == 2 * D * 2 + 4 and r["flops"] == 0


def test_table_renders(rows):
    text = format_table(rows, KERNEL_COLS, title="kernels")
    lines = text.splitlines()
    assert len(lines) == len(rows) + 3  # title, header, rule
    assert "x floor" in lines[1] and "sparse_attn" in text and "wo_b" in text


def _broken_rms_norm(x, weight, eps, out=None):
    TORCH_OPS.rms_norm(x, weight, eps, out=out)
    return out.mul_(1.1)


def test_broken_op_is_caught(cfg, ceil):
    broken = dataclasses.replace(TORCH_OPS, name="broken", rms_norm=_broken_rms_norm)
    with pytest.raises(RuntimeError, match="rms_norm_q.*broken.rms_norm"):
        bench_kernels(cfg, "cpu", ceil, context=64, prefill_tokens=8, quick=True, ops=broken)


def test_broken_fp8_mm_is_caught(cfg, ceil):
    def fp8_mm_off(x, w, scale, out):
        return TORCH_OPS.fp8_mm(x, w, scale, out=out).mul_(1.05)

    broken = dataclasses.replace(TORCH_OPS, name="broken", fp8_mm=fp8_mm_off)
    with pytest.raises(RuntimeError, match=r"wq_a fp8 \(decode, op broken\.fp8_mm\)"):
        bench_kernels(cfg, "cpu", ceil, context=64, prefill_tokens=8, quick=True, ops=broken, weights=("fp8",))


def test_broken_selection_is_caught(cfg, ceil):
    def topk_off_by_one(scores, visible, k, offset, out):
        return TORCH_OPS.topk_fixed(scores, visible, k, offset + 1, out)

    broken = dataclasses.replace(TORCH_OPS, name="broken", topk_fixed=topk_off_by_one)
    with pytest.raises(RuntimeError, match="topk_fixed.*exact"):
        bench_kernels(cfg, "cpu", ceil, context=64, prefill_tokens=8, quick=True, ops=broken)


def test_check_output():
    want = torch.randn(4, 8).to(torch.bfloat16)
    check_output("same", want.clone(), want)
    check_output("one ulp", (want.float() * (1 + 2**-8)).to(torch.bfloat16), want)
    with pytest.raises(RuntimeError, match="k1"):
        check_output("k1", want * 2, want)
    with pytest.raises(RuntimeError, match="NaN"):
        check_output("k2", torch.full_like(want, float("nan")), want)
    with pytest.raises(RuntimeError, match="infinities"):
        check_output("k3", torch.full_like(want, float("inf")), want)
    with pytest.raises(RuntimeError, match="k4"):
        check_output("k4", want.float(), want)
    idx = torch.arange(6, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="1 of 6"):
        check_output("k5", idx + (idx == 3).int(), idx, exact=True)


def test_bad_arguments(cfg, ceil):
    with pytest.raises(ValueError, match="context"):
        bench_kernels(cfg, "cpu", ceil, context=0, quick=True)
    with pytest.raises(ValueError, match=r"weights = \('fp4',\); allowed: a non-empty subset of \('bf16', 'fp8'\)"):
        bench_kernels(cfg, "cpu", ceil, context=64, quick=True, weights=("fp4",))
    with pytest.raises(ValueError, match="allowed: a non-empty subset"):
        bench_kernels(cfg, "cpu", ceil, context=64, quick=True, weights=())
    no_fp8 = dataclasses.replace(TORCH_OPS, name="nofp8", fp8_mm=None)
    with pytest.raises(ValueError, match=r"the 'nofp8' op table has no fp8_mm; allowed: \('bf16',\)"):
        bench_kernels(cfg, "cpu", ceil, context=64, quick=True, ops=no_fp8)
    assert bench_kernels(cfg, "cpu", ceil, context=64, prefill_tokens=8, quick=True, ops=no_fp8, weights=("bf16",))
