"""Triton kernels, one file per op (wrapper + @triton.jit), each with a plain-PyTorch
twin of the same name in `attnv41.reference` and a mirrored test in `tests/kernels/`.

Every module imports without Triton or a GPU; launching a kernel needs either CUDA or
`TRITON_INTERPRET=1` (the CPU interpreter the tests use on tiny shapes).
"""
