"""The reduced output of tensor-parallel ranks against the whole layer at the V4.1-Flash
widths, on the CPU (BENCHMARKS.md, twenty-sixth entry): two window layers of the Flash
geometry with random weights, 8 prompt tokens, the reference per rank (`attnv41.tp.TPStack`,
impl="reference") at tp 2, 4 and 8 against the reference over all heads; prints the worst
|error| / golden tolerance (max|ref|·2^-7 + 1e-4, `attnv41.testing.compare_bf16`) and the
share of outputs that moved. About a minute and 10 GB of memory.

run: PYTHONPATH=src python3 scripts/tp_flash_error.py"""

import dataclasses

import torch

from attnv41 import v41_flash
from attnv41.reference.layer import RefStack
from attnv41.synthetic import random_inputs, random_weights
from attnv41.testing import BF16_ABS, BF16_REL
from attnv41.tp import TPStack


def main() -> None:
    flash = v41_flash(max_tokens=8, max_seq=64)
    cfg = dataclasses.replace(
        flash,
        n_layers=2,
        compress_ratios=(0, 0),
        kv_source_layers=(),
        index_source_layers=(),
        candidate_source_layer=None,
    )
    w, xs = random_weights(cfg, 5), random_inputs(cfg, 8, 6)
    full = RefStack(cfg, w)
    refs = [full.layer(i, xs[i], 0) for i in range(cfg.n_layers)]
    print("tp  layer  worst err/tol  outputs moved")
    for tp in (2, 4, 8):
        st = TPStack(cfg, w, tp, impl="reference")
        for i in range(cfg.n_layers):
            got = st.layer(i, xs[i], 0)
            r, g = refs[i].out.double(), got.out.double()
            tol = r.abs().max() * BF16_REL + BF16_ABS
            print(
                f"{tp:>2}  {i:>5}  {((g - r).abs().max() / tol).item():>13.3f}  {(g != r).double().mean().item():>13.3f}"
            )


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
