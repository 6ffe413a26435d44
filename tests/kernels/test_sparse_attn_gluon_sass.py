"""The one-pass Gluon decode attention (`kernels.sparse_attn_gluon`) compiled for sm_90
offline (no GPU needed; Gluon does not run under the interpreter, so this is its CPU
check): at the geometries the runtime launches, no spills, the launch's shared memory within
an sm_90 block's, and the warpgroup MMAs and async copies it is built on present."""

from __future__ import annotations

import pytest

from kernels.sass_helpers import compiled


@pytest.mark.parametrize(
    "heads, dim, width, rot",
    [(64, 512, 640, True), (64, 512, 640, False), (8, 512, 640, True), (4, 32, 640, True), (16, 64, 13, True)],
    ids=["flash-rot", "flash", "headdim-rot", "tiny-rot", "one-block"],
)
def test_sm90_compile(heads, dim, width, rot):
    """Offline sm_90 compile at the geometries the runtime launches: no spills in the block
    loop, the launch's shared memory within an sm_90 block's, the warpgroup MMAs and async
    copies present. A selection of one 64-entry block once failed to lower (its loop of one
    constant trip)."""
    args = ["attn", "--gluon", "--m", "2", "--heads", str(heads), "--dim", str(dim), "--width", str(width)]
    ks = compiled(*args, *([] if rot else ["--no-rot"]), "--dump-sass-lines")
    assert list(ks) == ["_attn_gl_kernel"], f"launched {sorted(ks)}"
    k = ks["_attn_gl_kernel"]
    assert k["local"] == 0, f"{k['local']} bytes of local memory (spills)"
    # ptxas may park a few values on the stack across the block loop (the Flash shape: two),
    # never inside it: no spill store or reload between the first and the last MMA
    ops = [line.split()[0] for line in k["sass"]]
    mma = [i for i, o in enumerate(ops) if o.startswith("HGMMA")]
    inside = [ops[i] for i in range(mma[0], mma[-1]) if ops[i].startswith(("STL", "LDL"))] if mma else []
    assert not inside, f"spill traffic inside the block loop: {inside[:8]}"
    assert k["regs"] <= 255, f"{k['regs']} registers"
    assert 0 < k["dyn_smem"] <= 227 * 1024, f"{k['dyn_smem']} bytes of shared memory"
    ops = k["ops"]
    assert any(o.startswith("HGMMA") for o in ops), "no warpgroup MMA in the SASS"
    assert any(o.startswith("LDGSTS") for o in ops), "no async copy in the SASS"


def test_pdl_wait_precedes_every_global_load():
    """Launched with programmatic dependent launch, the kernel waits (ACQBULK, from
    griddepcontrol.wait) before its first global load or async copy: every input it reads
    (q, the selection, the rows) is another kernel's output."""
    k = compiled("attn", "--gluon", "--m", "2", "--pdl", "--dump-sass-lines")["_attn_gl_kernel"]
    ops = [line.split()[0] for line in k["sass"]]
    waits = [i for i, o in enumerate(ops) if o == "ACQBULK"]
    loads = [i for i, o in enumerate(ops) if o.startswith(("LDG", "LDGSTS"))]
    assert waits and loads, f"ACQBULK at {waits[:3]}, global loads at {loads[:3]}"
    assert waits[0] < loads[0], f"a global load (SASS line {loads[0]}) before the PDL wait (line {waits[0]})"
