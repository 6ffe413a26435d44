"""The runtimes' device: `check_device` (the device argument, checked) and
`on_own_device` (a method runs with its runtime's CUDA device current and its own split
kernels' arrival counters)."""

from __future__ import annotations

import functools

import torch

from ..kernels._triton import counters_of, current_counters, on_device

__all__ = ["check_device", "on_own_device"]


def on_own_device(runtime_of):
    """Decorator of a runtime method that launches work. `runtime_of(self)` is the
    `AttnV41` behind the object (itself, or the one a batch, stack or graph driver runs);
    the method runs under `kernels._triton.on_device(its device)`, so its kernels and
    graphs run on the runtime's device whatever the current CUDA device (a no-op on the CPU
    and when it is already current), and under `counters_of(its counters)`, so its split
    kernels' arrival counters are its own: two runtimes may run at once on different
    streams of one GPU. `tests/runtime/test_own_device.py` lists the methods that carry it."""

    def wrap(method):
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            rt = runtime_of(self)
            if current_counters() is rt.counters:  # inside another of its calls: all set already
                return method(self, *args, **kwargs)
            with on_device(rt.device), counters_of(rt.counters):
                return method(self, *args, **kwargs)

        run.on_own_device = True
        return run

    return wrap


def check_device(device) -> torch.device:
    """The runtime's device from `device` (a torch.device or its string): "cpu", or a CUDA
    device this process can use ("cuda" is the current one); ValueError naming it else."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device = {device!r}; allowed: 'cpu', 'cuda' or 'cuda:N'") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device = {device!r}; allowed: 'cpu', 'cuda' or 'cuda:N' (type {dev.type!r})")
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"device = {device!r}: this torch sees no CUDA device; allowed: 'cpu'")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        elif not 0 <= dev.index < n:
            raise ValueError(f"device = {device!r}; allowed: cuda:0..cuda:{n - 1}")
    return dev
