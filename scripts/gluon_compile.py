"""Compile the Gluon decode attention for sm_90 without a GPU and print registers, spills,
shared memory (a probe; `attnv41.bench.sass.compile_only`)."""

import os
import sys

import torch

from attnv41.bench.sass import compile_only
from attnv41.kernels import sparse_attn_gluon as g

H, D, K, m = (int(v) for v in os.environ.get("HDKM", "64,512,640,4").split(","))
q = torch.zeros(m, H, D, dtype=torch.bfloat16)
win = torch.zeros(256, D, dtype=torch.bfloat16)
comp = torch.zeros(1024, D, dtype=torch.bfloat16)
sel = torch.zeros(m, K, dtype=torch.int32)
sink = torch.zeros(H, dtype=torch.float32)
args = [a for a in sys.argv[1:] if not a.startswith("--")]
tune = eval("dict(" + (args[0] if args else "") + ")")
with compile_only() as launches:
    rot = None
    if "--rot" in sys.argv:
        cos = torch.zeros(8192, 32)
        rot = (cos, cos, torch.zeros(m, dtype=torch.int32), torch.zeros(m, H, D, dtype=torch.bfloat16))
    g.sparse_attn_gluon(q, win, comp, sel, 256, sink, 0.05, rot=rot, **tune)
for name, k in launches:
    from attnv41.bench.sass import report

    r = report(k)
    print(
        name,
        "regs",
        r["regs"],
        "smem",
        r["smem"],
        "local",
        r["local"],
        "warps",
        k.metadata.num_warps,
        "dyn_smem",
        k.metadata.shared,
        "ops",
        sum(r["ops"].values()),
        {
            o: n
            for o, n in r["ops"].items()
            if o.split(".")[0] in ("HGMMA", "LDGSTS", "BAR", "SHFL", "MUFU", "STL", "LDL")
        },
    )
    if "--ptx" in sys.argv:
        open("/tmp/gl.ptx", "w").write(k.asm["ptx"])
    if "--ttgir" in sys.argv:
        open("/tmp/gl.ttgir", "w").write(k.asm["ttgir"])
if "--sass" in sys.argv:
    from attnv41.bench.sass import report

    r = report(launches[-1][1], sass_lines=True)
    open("/tmp/gl.sass", "w").write("\n".join(r["sass"]))
    open("/tmp/gl.ttgir", "w").write(r["ttgir"])
