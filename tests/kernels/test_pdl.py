"""Programmatic dependent launch (`kernels/_triton.py`): when the launch keywords ask for
it. That it changes no byte is checked on the GPU, where it runs
(`tests/runtime/test_batch_graphs.py::test_pdl_changes_no_byte_on_cuda`)."""

import torch

from attnv41.kernels._triton import PDL_ENV, interpreting, pdl_launch


def test_pdl_only_on_hopper_cuda_and_never_when_disabled(monkeypatch, device):
    """CPU tensors and the interpreter: never. CUDA: on compute capability ≥ 9 unless
    ATTNV41_PDL=0."""
    assert pdl_launch(torch.zeros(1)) == {"PDL": False}
    t = torch.zeros(1, device=device)
    monkeypatch.setenv(PDL_ENV, "0")
    assert pdl_launch(t) == {"PDL": False}
    monkeypatch.setenv(PDL_ENV, "1")
    hopper = t.is_cuda and torch.cuda.get_device_capability(t.device)[0] >= 9 and not interpreting()
    assert pdl_launch(t) == ({"PDL": True, "launch_pdl": True} if hopper else {"PDL": False})
