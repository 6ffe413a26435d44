"""The decode GEMV compiled for sm_90 without a GPU: registers, shared memory, local memory
and the SASS instruction counts of one launch, from Triton's bundled `ptxas` and
`cuobjdump`. For checks and sweeps that cost no device time (`tests/kernels/
test_gemv_sass.py`, `python -m attnv41.bench.sass`).

Triton compiles for the active driver's target; here a stand-in driver names the H200's
(CUDA, sm_90, warp 32) for the duration of one `gemv` call, whose launch is replaced by
`warmup` (compile only). Needs a process where Triton is not interpreting
(`TRITON_INTERPRET` unset): the tests run it in a subprocess.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import subprocess
import tempfile
from collections import Counter

import torch

__all__ = ["gemv_sass"]


def _bin(name: str) -> str:
    import triton  # noqa: PLC0415

    found = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name))
    if not found:
        raise RuntimeError(f"{name} not found in Triton's nvidia backend (a Triton wheel without it?)")
    return found[0]


@contextlib.contextmanager
def _sm90_driver():
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.runtime import driver  # noqa: PLC0415

    class _Sm90:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self):
            return torch.device("cpu")

        def is_active(self):
            return True

    saved = driver._active  # None until first use; reset_active() would build the CUDA driver
    driver.set_active(_Sm90())
    try:
        yield
    finally:
        driver._active = saved


def _report(cubin: bytes) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        usage = subprocess.run([_bin("cuobjdump"), "--dump-resource-usage", path], capture_output=True, text=True)
        sass = subprocess.run([_bin("cuobjdump"), "--dump-sass", path], capture_output=True, text=True)
    if usage.returncode or sass.returncode:
        raise RuntimeError(f"cuobjdump failed: {usage.stderr}{sass.stderr}")
    res = re.search(r"REG:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", usage.stdout)
    ops: Counter = Counter()
    for line in sass.stdout.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if m:
            ops[m.group(1)] += 1
    return dict(regs=int(res.group(1)), smem=int(res.group(2)), local=int(res.group(3)), ops=dict(ops))


def gemv_sass(K: int, Ns: list[int], dtype: str, m: int = 1) -> dict:
    """Compile the `gemv` launch of x `[m, K]` against weights `[N, K]` for each N in Ns
    (dtype "bf16", "fp32" or "fp8": e4m3 with e8m0 scales) for sm_90 and return its
    resource usage and SASS opcode counts (`{"regs", "smem", "local", "ops"}`)."""
    from ..kernels import _triton as T  # noqa: PLC0415
    from ..kernels import gemv as G  # noqa: PLC0415

    if T.interpreting():
        raise RuntimeError("gemv_sass: TRITON_INTERPRET is set; compile in a process without it")
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}[dtype]
    x = torch.zeros(m, K, dtype=torch.bfloat16)
    ws, outs, scales = [], [], []
    for N in Ns:
        if dt == torch.float8_e4m3fn:
            ws.append(torch.zeros(N, K, dtype=torch.uint8).view(dt))
            scales.append(torch.zeros(-(-N // 32), K // 32, dtype=torch.uint8))
            outs.append(torch.zeros(m, N, dtype=torch.bfloat16))
        else:
            ws.append(torch.zeros(N, K, dtype=dt))
            scales.append(None)
            outs.append(torch.zeros(m, N, dtype=dt))
    got = {}
    kernel = G._gemv_kernel

    class _Compile:  # `kernel[grid](...)` → compile only
        def __getitem__(self, grid):
            return lambda *a, **kw: got.setdefault("k", kernel.warmup(*a, grid=grid, **kw))

    saved = (G._gemv_kernel, G.require_triton, G._counters.buffer)
    with _sm90_driver():
        try:
            G._gemv_kernel = _Compile()
            G.require_triton = lambda *a: None
            G._counters.buffer = lambda dev: torch.zeros(G._LOCKS, dtype=torch.int32)
            G.gemv(x, tuple(ws), tuple(outs), tuple(scales))
        finally:
            G._gemv_kernel, G.require_triton, G._counters.buffer = saved
    return _report(got["k"].asm["cubin"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--K", type=int, default=1280)
    ap.add_argument("--N", type=int, nargs="+", default=[32768])
    ap.add_argument("--dtype", default="fp8", choices=["bf16", "fp32", "fp8"])
    ap.add_argument("--m", type=int, default=1)
    args = ap.parse_args()
    print(json.dumps(gemv_sass(args.K, args.N, args.dtype, args.m)))


if __name__ == "__main__":
    main()
