"""The decode attention's two combines keep the same bits only if both take each block's
dot(bf16(p), R) in a fresh (zero) accumulator: Triton folds `acc·α + dot(p, R)` into
`dot(p, R, acc·α)` unless the loop form stops it (`sparse_attn_combine._opaque`). The
wrapper picks the form by m (`sparse_attn_split._BLOCKS_MAX_M`), so a fold would make a
token's bits depend on m. Checked in the Triton GPU IR of the sm_90 compile (no GPU
needed), at the Flash shapes; the GPU tests check the bytes themselves. Also the order of
the PDL wait, release and loads that `early_rows` relies on."""

from __future__ import annotations

import json
import re

import pytest

from attnv41.kernels.sparse_attn_split import BATCH_TUNE
from kernels.sass_helpers import compiled


def _dot_accumulators(ttgir: str) -> list[str]:
    """The definition of each dot's accumulator operand (`tt.dot`, or on sm_90 the
    warpgroup MMA `ttng.warp_group_dot` it becomes in a warpgroup-sized tile)."""
    defs = dict(re.findall(r"^\s*(%[\w.]+) = (.*)$", ttgir, re.M))
    accs = re.findall(r"= (?:tt\.dot|ttng\.warp_group_dot) %[\w.]+, %[\w.]+, (%[\w.]+)", ttgir)
    return [defs.get(a, f"{a} (a block argument: a loop-carried accumulator)") for a in accs]


@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])  # packed rows: dequantized in the loop
@pytest.mark.parametrize("m,kernel", [(1, "_pv_blocks_kernel"), (2, "_pv_combine_kernel")], ids=["blocks", "loop"])
def test_combine_dots_start_from_zero(m, kernel, packed):
    ks = compiled("attn", "--m", str(m), *(["--packed"] if packed else []))
    assert kernel in ks, f"m = {m}: launched {sorted(ks)}; expected {kernel} (the wrapper's m rule changed?)"
    accs = _dot_accumulators(ks[kernel]["ttgir"])
    assert accs, f"{kernel}: no tt.dot in its TTGIR"
    for a in accs:
        assert a.startswith("arith.constant dense<0.000000e+00>"), f"{kernel}: a dot accumulates onto {a[:120]}"
    assert ks[kernel]["local"] == 0, f"{kernel}: {ks[kernel]['local']} bytes of local memory (spills)"


@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_batch_shape_combine_dots_start_from_zero(packed):
    """`BATCH_TUNE` (the batched runtime, m ≥ 2): the loop combine in 8 warps over either row
    format keeps its dots in fresh accumulators too, and over packed rows the register caps
    hold (ptxas .maxnreg: the logits kernel at most 96, the combine at most 128)."""
    ks = compiled("attn", "--m", "64", "--tune", json.dumps(BATCH_TUNE), *(["--packed"] if packed else []))
    assert sorted(ks) == ["_logits_kernel", "_pv_combine_kernel"], f"launched {sorted(ks)}"
    accs = _dot_accumulators(ks["_pv_combine_kernel"]["ttgir"])
    assert accs, "_pv_combine_kernel: no tt.dot in its TTGIR"
    for a in accs:
        assert a.startswith("arith.constant dense<0.000000e+00>"), f"a dot accumulates onto {a[:120]}"
    if packed:
        assert ks["_logits_kernel"]["regs"] <= BATCH_TUNE["maxnreg_a_packed"], ks["_logits_kernel"]["regs"]
        assert ks["_pv_combine_kernel"]["regs"] <= BATCH_TUNE["maxnreg_b_packed"], ks["_pv_combine_kernel"]["regs"]


def _pdl_order(ttgir: str) -> tuple[int, int, int]:
    """(line of the PDL wait, line of the release, loads before the wait) in a TTGIR."""
    lines = ttgir.splitlines()
    wait = next(i for i, s in enumerate(lines) if "griddepcontrol.wait" in s)
    release = next(i for i, s in enumerate(lines) if "griddepcontrol.launch_dependents" in s)
    loads = sum(1 for s in lines[:wait] if re.search(r"= tt\.load |ttg\.async_copy_global_to_local", s))
    return wait, release, loads


@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_early_rows_gather_before_the_wait(packed):
    """`early_rows` (production at one token per call), compiled as launched under PDL: the
    logits kernel releases the combine only after its own wait, and the block combine
    issues its selection and row loads before its wait (the overlap the option is for;
    its bytes are the GPU tests'). Without the option the combine loads nothing first."""
    rows = ["--packed"] if packed else []
    ks = compiled("attn", "--m", "1", "--pdl", *rows)
    wait, release, _ = _pdl_order(ks["_logits_kernel"]["ttgir"])
    assert wait < release, "_logits_kernel: releases its successor before its own wait"
    _, _, loads = _pdl_order(ks["_pv_blocks_kernel"]["ttgir"])
    assert loads >= 2, f"_pv_blocks_kernel: {loads} loads before its wait; expected the selection's and the rows'"
    off = compiled("attn", "--m", "1", "--pdl", "--tune", json.dumps({"early_rows": False}), *rows)
    wait, release, _ = _pdl_order(off["_logits_kernel"]["ttgir"])
    assert release < wait, "_logits_kernel without early_rows: releases after its wait"
    assert _pdl_order(off["_pv_blocks_kernel"]["ttgir"])[2] == 0, "_pv_blocks_kernel: loads before its wait"
