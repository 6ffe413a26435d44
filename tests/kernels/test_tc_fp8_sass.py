"""The Gluon FP8 linear (`kernels.tc_fp8`) compiled for sm_90 offline (no GPU needed; Gluon
does not run under the interpreter, so this is its CPU check): no spills, the launch's
shared memory within an sm_90 block's, and the property it is built for: with x copied by
TMA, no memory barrier (`MEMBAR`, what `fence.proxy.async` compiles to) inside the chunk
loop, where it would wait for the weight copies in flight."""

from __future__ import annotations

import json

import pytest

from kernels.sass_helpers import compiled

CASES = [  # N, K, m, tune
    (5120, 8192, 64, {}),
    (5120, 8192, 1, {}),
    (32768, 1280, 64, {"stages": 3}),
    (1280, 5120, 1, {"xr": 64}),
    (512, 5120, 64, {"xm": 1}),
    (5120, 8192, 64, {"ws": 1, "stages": 3, "maxnreg": 128}),
    (1280, 5120, 64, {"ws": 2, "stages": 2, "maxnreg": 112, "cregs": 128}),
    (32768, 1280, 1, {"ws": 2}),
    (32768, 1280, 1, {"bt": 8, "stages": 8}),
    (5120, 8192, 7, {"bt": 0}),
    (1280, 5120, 1, {"bt": 8, "ws": 1, "stages": 4, "maxnreg": 128}),
]


def _bt(m: int, tune: dict) -> int:
    """The token rows per tile the launch takes (`tc_fp8._tile_rows`)."""
    return tune.get("bt", 64) or next(b for b in (8, 16, 32, 64) if b >= min(m, 64))


def _ops(k):
    return [ln.split()[1] if ln.startswith("@") else ln.split()[0] for ln in k["sass"]]


@pytest.mark.parametrize("N,K,m,tune", CASES, ids=[f"{c[0]}x{c[1]}-m{c[2]}-{json.dumps(c[3])}" for c in CASES])
def test_sm90_compile(N, K, m, tune):
    args = ["tcfp8", "--N", str(N), "--K", str(K), "--m", str(m), "--tune", json.dumps(tune), "--dump-sass-lines"]
    ks = compiled(*args)
    name = "_fp8_ws_kernel" if tune.get("ws") else "_fp8_kernel"
    assert list(ks) == [name], f"launched {sorted(ks)}"
    k = ks[name]
    assert k["local"] == 0, f"{k['local']} bytes of local memory (spills)"
    assert k["regs"] <= 255
    assert 0 < k["dyn_smem"] <= 227 * 1024, f"{k['dyn_smem']} bytes of shared memory"
    ops = _ops(k)
    mma = [i for i, o in enumerate(ops) if o.startswith("HGMMA")]
    nc = tune.get("ws", 0) or 1  # consumer warpgroups, each with its own chunk loop
    assert len(mma) == 8 * nc, f"{len(mma)} warpgroup MMAs (one 128-column chunk: 8 of k = 16 per consumer)"
    bt = _bt(m, tune)
    assert all(o.startswith(f"HGMMA.64x{bt}x16.F32.BF16") for o in (ops[i] for i in mma))
    if tune.get("ws"):  # the producer warp's TMA copies; no memory barrier in the consumers' loops
        assert any(o.startswith("UTMALDG") for o in ops) and any(o.startswith("USETMAXREG") for o in ops)
        waits = [i for i, o in enumerate(ops) if o.startswith("SYNCS.PHASECHK")]
        for c in range(nc):  # consumer c's loop: its barrier wait, up to its 8th product
            last = mma[8 * c + 7]
            first = max(i for i in waits if i < mma[8 * c])
            inside = [o for o in ops[first:last] if o.startswith(("MEMBAR", "FENCE.VIEW.ASYNC"))]
            assert not inside, f"memory barriers inside consumer {c}'s loop: {inside}"
        if tune.get("maxnreg"):
            assert k["regs"] <= tune["maxnreg"]
        return
    assert any(o.startswith("LDGSTS") for o in ops), "the weight's async copies are missing"
    # the chunk loop: from its first wait for the copies to its last product
    start = next(i for i, o in enumerate(ops) if o.startswith("DEPBAR.LE"))
    inside = [o for o in ops[start : mma[-1]] if o.startswith(("MEMBAR", "FENCE.VIEW.ASYNC"))]
    if tune.get("xm", 2) == 2:
        assert any(o.startswith("UTMALDG") for o in ops), "x's TMA copies are missing"
        assert not inside, f"memory barriers inside the chunk loop: {inside}"
        _check_x_copies_branch(ops[start : mma[-1]], tune, bt)
    else:  # x by cp.async needs the proxy fence before each product (why xm = 2 is the default)
        assert inside, "x by cp.async without the fence before the product"


def _check_x_copies_branch(loop: list[str], tune: dict, bt: int) -> None:
    """The chunk loop's x copies: the compiler puts a CTA barrier (`BAR.SYNC`) before every
    operation on an mbarrier, TMA copies included, so each box's two copies and each
    possible expect sit behind a branch of their own: a chunk at m = 1 runs one box's
    barriers, not all BT / XR boxes' (18 barriers a chunk before; BENCHMARKS.md, 2026-12-04
    twenty-first entry). Events: B a conditional branch, U a TMA copy, A an mbarrier
    arrive (the expect)."""
    boxes = bt // min(tune.get("xr", 16), bt)
    ev = "".join(
        "B" if o.startswith("BRA") else "U" if o.startswith("UTMALDG") else "A" if o.startswith("SYNCS.ARRIVE") else ""
        for o in loop
    )
    ev = ev[ev.index("A") - 1 :]  # from the copies' first branch (the loop's wait retries before it)
    assert ev.count("U") == 2 * boxes and ev.count("A") == boxes, ev
    for run in ev.split("B")[1:]:
        assert run in ("", "A", "UU"), f"more than one expect or box behind one branch: {ev}"


def test_rope_epilogue_compiles_without_fma():
    """With q's RoPE in the store (wq_b's shape, heads of 512): no spills, and no fused
    multiply-add anywhere (the rotation must round as the rope op does: the launch turns FMA
    contraction off), in both forms."""
    for tune in ({}, {"ws": 2}):
        ks = compiled("tcfp8", "--N", "32768", "--K", "1280", "--rope", "--tune", json.dumps(tune))
        (k,) = ks.values()
        assert k["local"] == 0
        assert not any(o.startswith("FFMA") for o in k["ops"]), {o: n for o, n in k["ops"].items() if "FMA" in o}


def test_several_weights_in_one_launch_compile():
    """`tc_fp8_many` over q's latent (wq_b and indexer.wq_b, wq_b rotated): one kernel, each
    weight's chunk loop (8 products each), no spills, within two programs' shared memory
    per SM (113 KiB each)."""
    ks = compiled("tcfp8", "--N", "32768", "4096", "--K", "1280", "--rope", "--dump-sass-lines")
    k = ks["_fp8_kernel"]
    assert k["local"] == 0
    assert sum(n for o, n in k["ops"].items() if o.startswith("HGMMA")) == 16
    assert k["dyn_smem"] <= 113 * 1024, f"{k['dyn_smem']} bytes of shared memory"


def test_pdl_wait_precedes_every_global_load():
    """Launched with programmatic dependent launch (as `compile_only(pdl=True)` compiles it),
    the kernel waits before its first global load, async copy or TMA: x is another kernel's
    output."""
    k = compiled("tcfp8", "--m", "2", "--dump-sass-lines")["_fp8_kernel"]
    ops = _ops(k)
    waits = [i for i, o in enumerate(ops) if o == "ACQBULK"]
    loads = [i for i, o in enumerate(ops) if o.startswith(("LDG", "LDGSTS", "UTMALDG"))]
    assert waits and loads, f"ACQBULK at {waits[:3]}, global loads at {loads[:3]}"
    assert waits[0] < loads[0]
