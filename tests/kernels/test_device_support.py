"""The compute capabilities the Triton kernels need, refused up front (`kernels._triton.
kernel_support`): on the CPU, with torch.cuda's answers replaced, so the refusal of an older
GPU is tested without one. A refusal must come before anything is allocated on the device:
this torch has no CUDA, so any allocation would raise torch's own RuntimeError instead."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnv41.kernels import _triton, packed_rows
from attnv41.runtime import AttnV41, BatchV41
from helpers import small_cfg

A100 = ((8, 0), "NVIDIA A100-SXM4-80GB")
L40S = ((8, 9), "NVIDIA L40S")
H200 = ((9, 0), "NVIDIA H200")


@pytest.fixture
def fake_gpu(monkeypatch):
    """fake_gpu(capability, name): torch.cuda answers as one such device (cuda:0)."""
    if torch.cuda.is_available():
        pytest.skip("a real GPU answers for itself")

    def install(gpu):
        cap, name = gpu
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: cap)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)
        monkeypatch.setattr(_triton, "_capability", {})

    return install


@pytest.mark.skipif(not _triton.HAVE_TRITON, reason="needs triton")
def test_kernel_support_names_the_device_its_capability_and_the_range(fake_gpu):
    fake_gpu(A100)
    why = _triton.kernel_support("cuda:0")
    assert why is not None and "NVIDIA A100" in why and "compute capability 8.0" in why
    assert "allowed: 8.9 or newer" in why and "e4m3" in why
    assert "allowed: 9.0 or newer" in _triton.kernel_support(torch.device("cuda", 0), packed=True)

    fake_gpu(L40S)
    assert _triton.kernel_support("cuda") is None
    why = _triton.kernel_support("cuda:0", packed=True)
    assert "compute capability 8.9" in why and "allowed: 9.0 or newer" in why and "mul.rn.bf16x2" in why

    fake_gpu(H200)
    assert _triton.kernel_support(0) is None
    assert _triton.kernel_support("cuda:0", packed=True) is None
    assert _triton.device_capability(torch.device("cuda", 0)) == (9, 0)


@pytest.mark.skipif(not _triton.HAVE_TRITON, reason="needs triton")
def test_runtimes_refuse_an_older_gpu_before_allocating(fake_gpu):
    cfg = small_cfg()
    fake_gpu(A100)
    with pytest.raises(
        ValueError, match=r"AttnV41: device cuda:0 \(NVIDIA A100-SXM4-80GB\) has compute capability 8\.0"
    ):
        AttnV41(cfg, "cuda")
    with pytest.raises(ValueError, match=r"BatchV41: device cuda:0 .* allowed: 8\.9 or newer"):
        BatchV41(cfg, "cuda", n_slots=2, block_rows=4)
    fake_gpu(L40S)  # bf16 caches pass the check (then torch, without CUDA, refuses to allocate)
    for kv_format in ("packed",):
        with pytest.raises(ValueError, match=r"AttnV41: device cuda:0 \(NVIDIA L40S\) .* allowed: 9\.0 or newer"):
            AttnV41(cfg, "cuda", kv_format=kv_format)
        with pytest.raises(ValueError, match=r"BatchV41: device cuda:0 .* allowed: 9\.0 or newer"):
            BatchV41(cfg, "cuda", n_slots=2, block_rows=4, kv_format=kv_format)
    with pytest.raises(Exception) as e:
        AttnV41(cfg, "cuda")
    assert "compute capability" not in str(e.value)
    # the torch twins on a CUDA device have no such limit: not refused for the capability
    fake_gpu(A100)
    with pytest.raises(Exception) as e:
        AttnV41(cfg, "cuda", ops="torch")
    assert "compute capability" not in str(e.value)


@pytest.mark.skipif(not _triton.HAVE_TRITON, reason="needs triton")
def test_kernel_launches_refuse_an_older_gpu(fake_gpu, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    t = SimpleNamespace(device=torch.device("cuda", 0))
    fake_gpu(A100)
    with pytest.raises(ValueError, match=r"sparse_attn: device cuda:0 \(NVIDIA A100-SXM4-80GB\) .* 8\.9 or newer"):
        _triton.require_triton("sparse_attn", t, t)
    fake_gpu(L40S)
    _triton.require_triton("sparse_attn", t)  # bf16 rows: allowed
    rows = SimpleNamespace(device=torch.device("cuda", 0), data_ptr=lambda: 256, shape=(4, 272), stride=lambda d: 272)
    with pytest.raises(ValueError, match=r"packed rows: device cuda:0 \(NVIDIA L40S\) .* 9\.0 or newer"):
        packed_rows.fp4_words_mode(rows)
    assert packed_rows.fp4_words_mode(rows, asm=False) == 1  # no PTX asked: nothing to refuse
    assert _triton.pdl_launch(t) == {"PDL": False}  # PDL needs 9.0 (the same cache of capabilities)
    fake_gpu(H200)
    assert packed_rows.fp4_words_mode(rows) == 2
    _triton.require_triton("sparse_attn", t)
    assert _triton.pdl_launch(t) == {"PDL": True, "launch_pdl": True}
    monkeypatch.setenv(_triton.PDL_ENV, "0")
    assert _triton.pdl_launch(t) == {"PDL": False}


@pytest.mark.skipif(not _triton.HAVE_TRITON, reason="needs triton")
def test_env_reports_each_gpu_by_the_same_rule(fake_gpu, monkeypatch):
    from attnv41.env import collect, lines

    props = SimpleNamespace(name=L40S[1], multi_processor_count=142, total_memory=48 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    fake_gpu(L40S)
    info = collect(peer=False)
    (d,) = info["devices"]
    assert d["device"] == "cuda:0" and d["capability"] == "8.9" and d["sms"] == 142 and d["memory_gib"] == 48.0
    assert d["kernels_bf16"] == "run" and d["tested"] is False
    assert d["kernels_packed"] == _triton.kernel_support("cuda:0", packed=True)
    text = "\n".join(lines(info))
    assert "cuda:0       NVIDIA L40S, compute capability 8.9, 142 SMs, 48.0 GiB; untested here (tested: 9.0)" in text
    assert "kernels, packed caches: cuda:0 (NVIDIA L40S) has compute capability 8.9; allowed: 9.0 or newer" in text
    fake_gpu(H200)
    props.name = H200[1]
    (d,) = collect(peer=False)["devices"]
    assert d["kernels_bf16"] == d["kernels_packed"] == "run" and d["tested"] is True
