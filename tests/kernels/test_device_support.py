"""The GPUs the Triton kernels need, refused up front (`kernels._triton.kernel_support`):
compute capability 8.9 (e4m3), 160 KiB of shared memory per block (the kernels' tiles), 9.0
with packed caches (bf16-pair multiplies). On the CPU, with torch.cuda's answers replaced, so
the refusal of other GPUs is tested without one. A refusal must come before anything is
allocated on the device: this torch has no CUDA, so any allocation would raise torch's own
error instead. The interpreter is switched off where a test needs the CUDA rule."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnv41.kernels import _triton, packed_rows
from attnv41.runtime import AttnV41, BatchV41
from helpers import small_cfg

# (capability, name, shared memory per block (opt-in), SMs)
A100 = ((8, 0), "NVIDIA A100-SXM4-80GB", 167936, 108)
L40S = ((8, 9), "NVIDIA L40S", 101376, 142)
ODD89 = ((8, 9), "an 8.9 part with Hopper's shared memory", 232448, 100)  # no such GPU: the packed rule alone
H200 = ((9, 0), "NVIDIA H200", 232448, 132)

pytestmark = pytest.mark.skipif(not _triton.HAVE_TRITON, reason="needs triton")


@pytest.fixture
def fake_gpu(monkeypatch):
    """fake_gpu(gpu): torch.cuda answers as one such device (cuda:0); the interpreter off."""
    if torch.cuda.is_available():
        pytest.skip("a real GPU answers for itself")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    def install(gpu):
        cap, name, shared, sms = gpu
        props = SimpleNamespace(
            name=name, multi_processor_count=sms, total_memory=48 * 2**30, shared_memory_per_block_optin=shared
        )
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: cap)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
        for cache in ("_capability", "_shared_bytes", "_supported"):
            monkeypatch.setattr(_triton, cache, type(getattr(_triton, cache))())

    return install


def test_kernel_support_names_the_device_the_failing_property_and_the_range(fake_gpu, monkeypatch):
    fake_gpu(A100)
    why = _triton.kernel_support("cuda:0")
    assert why is not None and "NVIDIA A100" in why and "compute capability 8.0" in why
    assert "allowed: 8.9 or newer" in why and "e4m3" in why
    assert _triton.kernel_support(torch.device("cuda", 0), packed=True) == why  # the first rule that fails

    fake_gpu(L40S)
    why = _triton.kernel_support("cuda")
    assert "NVIDIA L40S" in why and "offers 101376 bytes of shared memory per block" in why
    assert "allowed: 163840 or more" in why

    fake_gpu(ODD89)
    assert _triton.kernel_support("cuda:0") is None
    why = _triton.kernel_support("cuda:0", packed=True)
    assert "compute capability 8.9" in why and "allowed with packed caches: 9.0 or newer" in why
    assert "mul.rn.bf16x2" in why

    fake_gpu(H200)
    assert _triton.kernel_support(0) is None
    assert _triton.kernel_support("cuda:0", packed=True) is None
    assert _triton.device_capability(torch.device("cuda", 0)) == (9, 0)
    assert _triton.device_shared_bytes("cuda:0") == 232448

    fake_gpu(H200)  # a torch without the field: Triton's driver answers
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: SimpleNamespace(name=H200[1]))
    utils = SimpleNamespace(get_device_properties=lambda i: {"max_shared_mem": 101376})
    monkeypatch.setattr(_triton.triton.runtime.driver, "_active", SimpleNamespace(utils=utils), raising=False)
    monkeypatch.setattr(type(_triton.triton.runtime.driver), "active", property(lambda self: self._active))
    assert _triton.device_shared_bytes(0) == 101376

    fake_gpu(A100)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter runs anywhere
    assert _triton.kernel_support("cuda:0") is None


def test_runtimes_refuse_before_allocating(fake_gpu):
    cfg = small_cfg()
    fake_gpu(A100)
    with pytest.raises(
        ValueError, match=r"AttnV41: device cuda:0 \(NVIDIA A100-SXM4-80GB\) has compute capability 8\.0"
    ):
        AttnV41(cfg, "cuda")
    with pytest.raises(ValueError, match=r"BatchV41: device cuda:0 .* allowed: 8\.9 or newer"):
        BatchV41(cfg, "cuda", n_slots=2, block_rows=4)
    fake_gpu(L40S)
    with pytest.raises(ValueError, match=r"AttnV41: device cuda:0 \(NVIDIA L40S\) offers 101376 bytes"):
        AttnV41(cfg, "cuda")
    fake_gpu(ODD89)  # bf16 caches pass the check (then torch, without CUDA, refuses to allocate)
    with pytest.raises(ValueError, match=r"AttnV41: device cuda:0 .* allowed with packed caches: 9\.0 or newer"):
        AttnV41(cfg, "cuda", kv_format="packed")
    with pytest.raises(ValueError, match=r"BatchV41: device cuda:0 .* allowed with packed caches: 9\.0 or newer"):
        BatchV41(cfg, "cuda", n_slots=2, block_rows=4, kv_format="packed")
    with pytest.raises(Exception) as e:
        AttnV41(cfg, "cuda")
    assert "allowed" not in str(e.value)
    # the torch twins on a CUDA device have no such limit: not refused for the device
    fake_gpu(A100)
    with pytest.raises(Exception) as e:
        AttnV41(cfg, "cuda", ops="torch")
    assert "compute capability" not in str(e.value)


def test_kernel_launches_refuse_an_unsupported_gpu(fake_gpu, monkeypatch):
    t = SimpleNamespace(device=torch.device("cuda", 0))
    fake_gpu(A100)
    with pytest.raises(ValueError, match=r"sparse_attn: device cuda:0 \(NVIDIA A100-SXM4-80GB\) .* 8\.9 or newer"):
        _triton.require_triton("sparse_attn", t, t)
    with pytest.raises(ValueError):  # refused again: a refusal is not remembered as support
        _triton.require_triton("sparse_attn", t)
    fake_gpu(ODD89)
    _triton.require_triton("sparse_attn", t)  # bf16 rows: allowed, then remembered
    assert _triton._supported == {0}
    rows = SimpleNamespace(device=torch.device("cuda", 0), data_ptr=lambda: 256, shape=(4, 272), stride=lambda d: 272)
    with pytest.raises(ValueError, match=r"packed rows: device cuda:0 .* 9\.0 or newer"):
        packed_rows.fp4_words_mode(rows)
    assert packed_rows.fp4_words_mode(rows, asm=False) == 1  # no PTX asked: nothing to refuse
    assert _triton.pdl_launch(t) == {"PDL": False}  # PDL needs 9.0 (the same cache of capabilities)
    fake_gpu(H200)
    assert packed_rows.fp4_words_mode(rows) == 2
    _triton.require_triton("sparse_attn", t)
    assert _triton.pdl_launch(t) == {"PDL": True, "launch_pdl": True}
    monkeypatch.setenv(_triton.PDL_ENV, "0")
    assert _triton.pdl_launch(t) == {"PDL": False}


def test_env_reports_each_gpu_by_the_same_rule(fake_gpu):
    from attnv41.env import collect, lines

    fake_gpu(L40S)
    info = collect(peer=False)
    (d,) = info["devices"]
    assert d["device"] == "cuda:0" and d["capability"] == "8.9" and d["sms"] == 142 and d["memory_gib"] == 48.0
    assert d["kernels_bf16"] == _triton.kernel_support("cuda:0") != "run" and d["tested"] is False
    text = "\n".join(lines(info))
    assert "cuda:0       NVIDIA L40S, compute capability 8.9, 142 SMs, 48.0 GiB; untested here (tested: 9.0)" in text
    assert "kernels, bf16 caches:   cuda:0 (NVIDIA L40S) offers 101376 bytes of shared memory per block" in text
    fake_gpu(H200)
    (d,) = collect(peer=False)["devices"]
    assert d["kernels_bf16"] == d["kernels_packed"] == "run" and d["tested"] is True


def test_a_capture_on_another_device_is_refused(monkeypatch):
    """A runtime on cuda:1 called inside a capture on cuda:0 would run its work uncaptured on
    cuda:1 (an empty graph): `on_device` refuses the switch then."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match=r"a call on cuda:1 inside a CUDA graph capture on cuda:0"):
        _triton.on_device(torch.device("cuda", 1))
    assert _triton.on_device(torch.device("cuda", 0)) is _triton._SAME_DEVICE  # no switch: capturing is fine
