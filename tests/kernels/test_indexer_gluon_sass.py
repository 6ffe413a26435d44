"""The Gluon index scores over packed keys (`kernels.indexer_gluon`) on the CPU: compiled
for sm_90 offline (Gluon does not run under the interpreter) at the Flash index geometry
and a narrow one, and its refusals. Its numerics are checked on the GPU
(`test_indexer_gluon.py`)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from attnv41.kernels import indexer as I
from attnv41.kernels import indexer_gluon as G
from kernels.sass_helpers import compiled

# the forms before `afrag` became the default (fifty-first entry)
_STAGED = json.dumps(dict(stages=4, afrag=False, slice_out=False))
_DIRECT = dict(stages=0, afrag=False, slice_out=False)


@pytest.mark.parametrize("heads, paged", [(32, 64), (8, 16)], ids=["flash", "narrow"])
def test_default_is_afrag(heads, paged):
    """The default launch (`GLUON_INDEX_TUNE`: afrag, slice_out, sub 8) at the Flash index
    geometry and a narrow one: no spills, q's tile alone in shared memory, no async copies or
    shared loads of keys, one barrier."""
    assert G.GLUON_INDEX_TUNE["afrag"] and G.GLUON_INDEX_TUNE["slice_out"] and G.GLUON_INDEX_TUNE["stages"] == 0
    args = ["index", "--m", "4", "--L", "4096", "--packed", "--paged", str(paged), "--gluon", "--heads", str(heads)]
    k = compiled(*args)["_index_gl_kernel"]
    assert k["local"] == 0 and k["dyn_smem"] <= 8 * 1024, (k["local"], k["dyn_smem"])
    ops = k["ops"]
    assert not any(o.startswith(("LDSM", "LDGSTS")) for o in ops), sorted(ops)
    assert ops.get("BAR.SYNC.DEFER_BLOCKING", 0) == 1


@pytest.mark.parametrize("heads, paged", [(32, 64), (8, 16)], ids=["flash", "narrow"])
def test_sm90_compile(heads, paged):
    """(The cp.async form.) No spills, shared memory within an sm_90 block's, the warpgroup MMAs present, and the
    code words copied by 4-byte `cp.async` only: the 68-byte rows are 4-byte aligned, and a
    16-byte copy there would fault (the copy's width follows its layout's per-thread
    contiguity, not the pointers' alignment)."""
    args = ["index", "--m", "4", "--L", "4096", "--packed", "--paged", str(paged), "--gluon", "--heads", str(heads)]
    ks = compiled(*args, "--dump-sass-lines", "--tune", _STAGED)
    assert list(ks) == ["_index_gl_kernel"], f"launched {sorted(ks)}"
    k = ks["_index_gl_kernel"]
    assert k["local"] == 0, f"{k['local']} bytes of local memory (spills)"
    assert k["regs"] <= 255
    assert 0 < k["dyn_smem"] <= 227 * 1024
    ops = k["ops"]
    assert any(o.startswith("HGMMA") for o in ops), "no warpgroup MMA"
    copies = {o: n for o, n in ops.items() if o.startswith("LDGSTS")}
    assert copies and set(copies) <= {"LDGSTS.E", "LDGSTS.E.LTC128B"}, f"async copies {copies}"


def _layout_of(ttgir: str, name: str) -> str:
    """The `#blockedN` attribute's text in a TTGIR module."""
    m = re.search(rf"^{re.escape(name)} = (#ttg\.blocked<.*>)$", ttgir, re.M)
    assert m, f"{name} not defined"
    return m.group(1)


@pytest.mark.parametrize("gather", ["0", "8"], ids=["full", "gathered"])
def test_one_word_conversion_layouts(gather):
    """`one_word`: the code words converted in the copies' layout (one word per thread, a
    warp over two whole rows), so the dequantized tile reaches shared memory as one 16-byte
    chunk per thread, eight consecutive chunks of a row per quarter warp (the swizzle then
    gives them eight different bank groups); still no spills, 4-byte copies only."""
    args = ["index", "--m", "4", "--L", "4096", "--packed", "--paged", "64", "--gluon", "--gather", gather]
    k = compiled(*args, "--tune", json.dumps(dict(json.loads(_STAGED), one_word=True)))["_index_gl_kernel"]
    assert k["local"] == 0 and k["regs"] <= 255
    copies = {o for o in k["ops"] if o.startswith("LDGSTS")}
    assert copies and copies <= {"LDGSTS.E", "LDGSTS.E.LTC128B"}, f"async copies {copies}"
    ir = k["ttgir"]
    tile = re.search(r"ttg\.local_store %\S+, %\S+ : tensor<64x128xbf16, (#blocked\d*)>", ir)
    assert tile, "no store of the [64, 128] key tile"
    layout = _layout_of(ir, tile.group(1))
    assert "sizePerThread = [1, 8], threadsPerWarp = [2, 16]" in layout, layout
    words = re.search(r"ttg\.local_load %\S+ : !ttg\.memdesc<64x16xi32, [^>]*> -> tensor<64x16xi32, (#blocked\d*)>", ir)
    assert words, "no shared load of the code words"
    assert "sizePerThread = [1, 1], threadsPerWarp = [2, 16]" in _layout_of(ir, words.group(1))


@pytest.mark.parametrize("gather", ["0", "8"], ids=["full", "gathered"])
def test_direct_form_loads_one_word_per_thread(gather):
    """`stages = 0`: no cp.async and no word stages (the q and key tiles' 24.7 KiB of shared
    memory alone), the code words loaded straight into registers one per thread (a warp
    over two whole rows), the tile stored from the one-word conversion's layout; no
    spills, at the default registers and under a cap of 72."""
    args = ["index", "--m", "4", "--L", "4096", "--packed", "--paged", "64", "--gluon", "--gather", gather]
    for tune in (json.dumps(_DIRECT), json.dumps(dict(_DIRECT, maxnreg=72))):
        k = compiled(*args, "--tune", tune)["_index_gl_kernel"]
        assert k["local"] == 0, f"{tune}: {k['local']} bytes of local memory (spills)"
        assert not any(o.startswith("LDGSTS") for o in k["ops"]), f"{tune}: async copies in the direct form"
        assert k["dyn_smem"] <= 25 * 1024, f"{tune}: {k['dyn_smem']} bytes of shared memory"
        ir = k["ttgir"]
        words = re.search(r"tt\.load %\S+, %\S+(, %\S+)? : tensor<64x16x!tt\.ptr<i32>, (#blocked\d*)>", ir)
        assert words, "no load of the [64, 16] code words"
        assert "sizePerThread = [1, 1], threadsPerWarp = [2, 16]" in _layout_of(ir, words.group(2))
        tile = re.search(r"ttg\.local_store %\S+, %\S+ : tensor<64x128xbf16, (#blocked\d*)>", ir)
        assert tile and "sizePerThread = [1, 8], threadsPerWarp = [2, 16]" in _layout_of(ir, tile.group(1))


@pytest.mark.parametrize("gather", ["0", "8"], ids=["full", "gathered"])
def test_afrag_keys_never_touch_shared_memory(gather):
    """`afrag` (with `slice_out`, `row0`, `ahead`): the code words loaded in the MMA's A-fragment layout and byte-transposed
    within quads by shuffles (16 per block of 64 keys: two per word), the keys handed to the
    MMA from registers: no shared-memory key tile (q's 8 KiB alone), no shared loads of it
    (no LDSM), no spills; with `slice_out` also no shared round trip of the scores, so one
    barrier in all (before the first MMA, for q's store)."""
    args = ["index", "--m", "4", "--L", "4096", "--packed", "--paged", "64", "--gluon", "--gather", gather]
    for so, r0, ah in ((False, False, False), (True, False, False), (True, True, False), (True, True, True)):
        tune = json.dumps(dict(stages=0, afrag=True, slice_out=so, row0=r0, ahead=ah))
        k = compiled(*args, "--tune", tune)["_index_gl_kernel"]
        ops = k["ops"]
        assert k["local"] == 0, f"{tune}: {k['local']} bytes of local memory (spills)"
        assert k["dyn_smem"] <= 8 * 1024 + (0 if so else 256), f"{tune}: {k['dyn_smem']} bytes of shared memory"
        assert not any(o.startswith(("LDSM", "LDGSTS")) for o in ops), f"{tune}: shared or async loads of keys"
        assert ops.get("SHFL.BFLY", 0) >= 16, f"{tune}: {ops.get('SHFL.BFLY', 0)} butterfly shuffles"
        assert any(o.startswith("HGMMA") for o in ops), "no warpgroup MMA"
        ir = k["ttgir"]
        assert ir.count("ttg.local_store") == 1, "a shared store besides q's"
        # the fragment's conversion is a relabelling of registers (no shared memory: above)
        assert re.search(
            r"ttg\.convert_layout %\S+ : tensor<64x128xbf16, #linear\d*> -> tensor<64x128xbf16, #ttg\.dot_op", ir
        )
        if so:
            assert ops.get("BAR.SYNC.DEFER_BLOCKING", 0) == 1, f"{ops.get('BAR.SYNC.DEFER_BLOCKING')} barriers"


def test_sm90_compile_gathered_form():
    """(The cp.async form.) The reindex layers' gathered form (ids of candidate blocks of 8 rows) compiles for
    sm_90 without spills, its copies 4-byte."""
    ks = compiled(
        "index", "--m", "4", "--L", "4096", "--packed", "--paged", "64", "--gluon", "--gather", "8", "--tune", _STAGED
    )
    k = ks["_index_gl_kernel"]
    assert k["local"] == 0 and k["regs"] <= 255
    copies = {o for o in k["ops"] if o.startswith("LDGSTS")}
    assert copies and copies <= {"LDGSTS.E", "LDGSTS.E.LTC128B"}, f"async copies {copies}"


def _args(d=128, H=32, dtype=torch.uint8):
    iq = torch.zeros(2, H, d, dtype=torch.bfloat16)
    w = torch.zeros(2, H, dtype=torch.bfloat16)
    keys = (
        torch.zeros(64, d // 2 + d // 32, dtype=torch.uint8)
        if dtype == torch.uint8
        else torch.zeros(64, d, dtype=dtype)
    )
    table = torch.zeros(2, 1, dtype=torch.int32)
    slot = torch.zeros(2, dtype=torch.int32)
    vis = torch.zeros(2, dtype=torch.int32)
    return iq, w, keys, table, slot, 64, vis, 64


@pytest.mark.parametrize(
    "kw, tune, match",
    [
        (dict(d=64), {}, "of 128 values"),
        (dict(dtype=torch.bfloat16), {}, "packed fp4_e8m0 keys"),
        (dict(H=64), {}, "heads"),
        ({}, dict(sub=3), "sub = 3"),
        ({}, dict(stages=1), "stages = 1"),
        ({}, dict(bogus=1), "tune keys"),
        ({}, dict(stages=4), "afrag = True with stages = 4"),
        ({}, dict(afrag=False), "slice_out = True"),
        ({}, dict(afrag=1), "afrag = 1"),
        ({}, dict(afrag=False, slice_out=False, row0=True), "row0 = True"),
        ({}, dict(afrag=False, slice_out=False, ahead=True), "ahead = True"),
    ],
    ids=[
        "d64",
        "bf16-keys",
        "heads64",
        "sub3",
        "stages1",
        "unknown-key",
        "afrag-staged",
        "slice-out-alone",
        "afrag-int",
        "row0-alone",
        "ahead-alone",
    ],
)
def test_refusals_name_the_value(kw, tune, match):
    with pytest.raises(ValueError, match=match):
        G.index_scores_paged_gluon(*_args(**kw), **tune)


def test_not_under_the_interpreter_or_on_the_cpu():
    """On the CPU (or under TRITON_INTERPRET) it refuses, and the runtime's option leaves the
    call to the Triton kernel there (its geometry rule needs an sm_90 GPU)."""
    with pytest.raises(RuntimeError, match="index_scores_paged_gluon: (tensor on cpu|needs Gluon and a CUDA device)"):
        G.index_scores_paged_gluon(*_args())
    iq, w, keys, table, slot, B, vis, width = _args()
    assert not I._gluon_takes(iq, keys, 1)
