"""The fused chains writing V4.1's packed rows (`attnv41.packed`) into uint8 caches: the
rows unpack to the bits the same chain writes into a bf16 cache (which the chains' own
tests tie to the single-op kernels), for the window ring (fp8_e8m0), compressed rows
(fp4_e4m3) and index keys (fp4_e8m0), in the kernel and in the torch twins; rows past
the written ones stay as they were; the other outputs do not change.

Bytes: the kernel stores the round trip's own scale; the twins pack the values (`pack`
finds a scale from them). A block whose values fit two scales (an fp8 block whose largest
code rounded down to 224 fits s and s/2) can so differ in bytes, never in values."""

from __future__ import annotations

import pytest
import torch

from attnv41.kernels import fused as F
from attnv41.packed import pack, row_bytes, unpack
from kernels.test_fused import BF, DK, D, _gen, _rows, _tables

CASES = [
    pytest.param(1, [40], [10], 16, id="m1"),
    pytest.param(3, [4, 8, 12], [1, 2, 3], 16, id="m3"),
    # consecutive positions, as a ring's: the kept tokens' ring slots (pos % 2) differ (two
    # kept tokens writing one slot would race on a GPU, whichever the cache format)
    pytest.param(3, [96, 97, 98], [24, 25, 26], 2, id="m3-over-cache"),
]


def _run(chain, fmt, width, m, row_pos, rows, n_cache, device, twin):
    gen = _gen("packed", chain, m, row_pos)
    # small rows too, so that fp4_e4m3 blocks take subnormal e4m3 scales
    x = _rows(gen, m, width, "random")
    x[0] = x[0] * 2.0**-14
    x = x.to(device)
    w = (1 + 0.3 * torch.randn(width, generator=gen)).to(device)
    rp = torch.tensor(row_pos, dtype=torch.int32, device=device)
    row = torch.tensor(rows, dtype=torch.int32, device=device)
    cos, sin = _tables(device, yarn=chain != "kv")
    fns = {
        "kv": (F.kv_chain_torch if twin else F.kv_chain),
        "compress": (F.compress_kv_chain_torch if twin else F.compress_kv_chain),
        "index": (F.index_k_chain_torch if twin else F.index_k_chain),
    }
    fn = fns[chain]
    sentinel = 77
    plain = torch.zeros(n_cache, width, dtype=BF, device=device)
    packed = torch.full((n_cache, row_bytes(fmt, width)), sentinel, dtype=torch.uint8, device=device)
    outs = []
    for cache in (plain, packed):
        out = torch.empty(m, width, dtype=BF, device=device)
        if chain == "kv":
            fn(x, w, 1e-6, cos, sin, rp, out, cache)  # the ring slot is pos % rows
        elif chain == "compress":
            fn(x, w, 1e-6, cos, sin, rp, row, out, cache)
        else:
            fn(x, w, 1e-6, cos, sin, rp, row, cache)
        outs.append(out)
    if chain != "index":
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), "the rows the chain returns"
    slot_of = rp if chain == "kv" else row
    written = sorted({int(s) % n_cache for s in slot_of.tolist()[m - min(m, n_cache) :]})
    got = unpack(packed[written].cpu(), fmt, width)
    assert torch.equal(got.view(torch.int16), plain[written].cpu().view(torch.int16)), f"{chain}: packed rows"
    if twin:  # the twins pack the values: pack's bytes
        assert torch.equal(packed[written].cpu(), pack(plain[written].cpu(), fmt))
    rest = [i for i in range(n_cache) if i not in written]
    assert (packed[rest] == sentinel).all(), "rows not written stay as they were"


@pytest.mark.parametrize("twin", [False, True], ids=["kernel", "twin"])
@pytest.mark.parametrize("m,row_pos,rows,n_cache", CASES)
@pytest.mark.parametrize(
    "chain,fmt,width", [("kv", "fp8_e8m0", D), ("compress", "fp4_e4m3", D), ("index", "fp4_e8m0", DK)]
)
def test_chains_write_packed_rows(chain, fmt, width, m, row_pos, rows, n_cache, twin, device):
    _run(chain, fmt, width, m, row_pos, rows, n_cache, "cpu" if twin else device, twin)


def test_packed_cache_of_the_wrong_width_is_refused(device):
    x = torch.zeros(1, DK, dtype=BF, device=device)
    cos, sin = _tables(device, yarn=True)
    z = torch.zeros(1, dtype=torch.int32, device=device)
    bad = torch.zeros(4, 33, dtype=torch.uint8, device=device)
    with pytest.raises(
        ValueError, match="index_k.shape = \\(4, 33\\); allowed: \\[rows >= 1, 68\\] \\(packed fp4_e8m0\\)"
    ):
        F.index_k_chain(x, torch.ones(DK, device=device), 1e-6, cos, sin, z, z, bad)


@pytest.mark.parametrize("twin", [False, True], ids=["kernel", "twin"])
@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
@pytest.mark.parametrize(
    "chain,fmt,width", [("kv", "fp8_e8m0", D), ("compress", "fp4_e4m3", D), ("index", "fp4_e8m0", DK)]
)
def test_chains_write_by_slot_mapping(chain, fmt, width, packed, twin, device):
    """mapped=True (`attnv41.ops`' pools): token t writes row slots[t] of the cache whatever
    the pool's size (no `% rows`, every token, not only the last min(m, rows)), −1 writes
    nothing; the rows are those the ring rule writes for the same tokens."""
    dev = "cpu" if twin else device
    gen = _gen("mapped", chain, packed)
    m, n_cache, sentinel = 5, 4, 77
    slots = torch.tensor([3, -1, 0, -1, 2], dtype=torch.int64, device=dev)
    x = _rows(gen, m, width, "random").to(dev)
    w = (1 + 0.3 * torch.randn(width, generator=gen)).to(dev)
    rp = torch.tensor([7, 9, 12, 13, 20], dtype=torch.int32, device=dev)
    cos, sin = _tables(dev, yarn=chain != "kv")
    fn = {
        "kv": (F.kv_chain_torch if twin else F.kv_chain),
        "compress": (F.compress_kv_chain_torch if twin else F.compress_kv_chain),
        "index": (F.index_k_chain_torch if twin else F.index_k_chain),
    }[chain]

    def run(cache, slot, mapped):
        out = torch.empty(m, width, dtype=BF, device=dev)
        if chain == "kv":
            fn(x, w, 1e-6, cos, sin, rp, out, cache, slot=slot, mapped=mapped)
        elif chain == "compress":
            fn(x, w, 1e-6, cos, sin, rp, slot, out, cache, mapped=mapped)
        else:
            fn(x, w, 1e-6, cos, sin, rp, slot, cache, mapped=mapped)
        return out

    # the ring rule over m rows at slots 0..m−1 writes every token's row: the expected rows
    every = torch.zeros(m, width, dtype=BF, device=dev)
    exp_out = run(every, torch.arange(m, device=dev), False)
    if packed:
        cache = torch.full((n_cache, row_bytes(fmt, width)), sentinel, dtype=torch.uint8, device=dev)
    else:
        cache = torch.full((n_cache, width), float(sentinel), dtype=BF, device=dev)
    out = run(cache, slots, True)
    if chain != "index":
        assert torch.equal(out.view(torch.int16), exp_out.view(torch.int16)), "the rows the chain returns"
    kept = [(t, s) for t, s in enumerate(slots.tolist()) if s >= 0]
    got = cache[[s for _, s in kept]].cpu()
    if packed:
        got = unpack(got, fmt, width)
    exp = every[[t for t, _ in kept]].cpu()
    assert torch.equal(got.view(torch.int16), exp.view(torch.int16)), f"{chain}: rows at their slots"
    rest = [r for r in range(n_cache) if r not in {s for _, s in kept}]
    assert (cache[rest].cpu() == sentinel).all(), "rows no token maps to stay as they were"
