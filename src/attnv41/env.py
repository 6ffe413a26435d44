"""`attnv41 env`: what this machine offers the runtime, for bug reports and engine setup.

`collect()` gathers it as a dict (JSON-ready); `lines(info)` renders it for a terminal.
Versions of the package, Python, torch (its CUDA build), Triton, numpy and safetensors;
the environment variables the package reads, with their values in effect; every CUDA
device with its capability and whether the Triton kernels run on it, with bf16 and with
packed caches (`kernels._triton.kernel_support`: the same rule the runtimes refuse by);
and whether `bench`'s FlashMLA peer imports. Nothing is allocated on a GPU.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

import torch

from . import __version__
from .kernels import _triton
from .kernels.sparse_attn_split import GLUON_ENV

__all__ = ["ENV_VARS", "collect", "lines"]

# The variables the package reads: name → (default when unset, what it sets).
ENV_VARS = {
    "TRITON_INTERPRET": ("0", "1 runs the Triton kernels on the CPU interpreter (tests without a GPU)"),
    _triton.PDL_ENV: (_triton.PDL_DEFAULT, "0 turns programmatic dependent launch off (the same bits)"),
    _triton.ROUND_ENV: ("cvt", "cvt or bits: how the kernels round fp32 to bf16 on CUDA (the same bits)"),
    GLUON_ENV: ("0", "1 runs the one-pass Gluon decode attention in batched calls over bf16 rows"),
    "ATTNV41_GOLDEN_DIR": ("", "the tests' golden folder (unset: ../shared/golden beside the repository)"),
}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _devices() -> list[dict]:
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        dev = f"cuda:{i}"
        bf16 = _triton.kernel_support(dev)
        packed = _triton.kernel_support(dev, packed=True)
        cap = _triton.device_capability(i)
        out.append(
            {
                "device": dev,
                "name": p.name,
                "capability": f"{cap[0]}.{cap[1]}",
                "sms": p.multi_processor_count,
                "memory_gib": round(p.total_memory / 2**30, 1),
                "kernels_bf16": "run" if bf16 is None else bf16,
                "kernels_packed": "run" if packed is None else packed,
                "tested": cap in _triton.TESTED_CAPABILITIES,
            }
        )
    return out


def collect(peer: bool = True) -> dict:
    """What `attnv41 env` reports, as a dict. peer: also try importing bench's FlashMLA
    peer (an import of a compiled extension: off in tests)."""
    info = {
        "attnv41": __version__,
        "package_path": os.path.dirname(os.path.abspath(__file__)),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": _version("triton") if _triton.HAVE_TRITON else None,
        "numpy": _version("numpy"),
        "safetensors": _version("safetensors"),
        "env": {k: os.environ.get(k) for k in ENV_VARS},
        "cuda_available": torch.cuda.is_available(),
        "devices": _devices(),
        "tested_capabilities": [f"{a}.{b}" for a, b in _triton.TESTED_CAPABILITIES],
    }
    if peer:
        from .bench.peer import peer_status  # noqa: PLC0415 (imports flash_mla when present)

        info["flashmla_peer"] = peer_status()[1]
    return info


def lines(info: dict) -> list[str]:
    """`collect()`'s dict as the lines `attnv41 env` prints."""
    cuda = f"CUDA {info['torch_cuda']} build" if info["torch_cuda"] else "CPU build"
    out = [
        f"attnv41      {info['attnv41']} ({info['package_path']})",
        f"python       {info['python']} on {info['platform']}",
        f"torch        {info['torch']} ({cuda})",
        f"triton       {info['triton'] or 'not installed (the CPU path needs none; CUDA devices need it)'}",
        f"numpy        {info['numpy']}, safetensors {info['safetensors']}",
        "environment:",
    ]
    for k, (default, what) in ENV_VARS.items():
        v = info["env"].get(k)
        shown = repr(v) if v is not None else f"unset ({default})" if default else "unset"
        out.append(f"  {k:<20} {shown:<12} {what}")
    if not info["cuda_available"]:
        out.append("CUDA         not available: the runtimes run their torch path on device='cpu'")
    for d in info["devices"]:
        tested = "tested" if d["tested"] else f"untested here (tested: {', '.join(info['tested_capabilities'])})"
        out.append(
            f"{d['device']:<12} {d['name']}, compute capability {d['capability']}, {d['sms']} SMs, "
            f"{d['memory_gib']} GiB; {tested}"
        )
        out.append(f"  kernels, bf16 caches:   {d['kernels_bf16']}")
        out.append(f"  kernels, packed caches: {d['kernels_packed']}")
    if "flashmla_peer" in info:
        out.append(f"FlashMLA peer (bench): {info['flashmla_peer']}")
    return out
