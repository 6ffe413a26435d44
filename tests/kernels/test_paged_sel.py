"""`paged_selection` (Triton) and its twin against a plain loop over tokens and columns,
on random tables, widths and logical rows (−1 entries included): equal entries."""

import pytest
import torch

from attnv41.kernels.paged_sel import paged_selection, paged_selection_torch
from helpers import paged_table

I32 = torch.int32


def _loop(win_sel, width, logical, table, slot, B, base):
    T, W = win_sel.shape
    K = logical.shape[1]
    out = torch.full((T, W + K), -1, dtype=I32)
    for t in range(T):
        ww = int(width[t])
        for c in range(W + K):
            if c < ww:
                out[t, c] = win_sel[t, c]
            elif c - ww < K:
                j = int(logical[t, c - ww])
                if j >= 0:
                    out[t, c] = int(table[int(slot[t]), j // B]) * B + j % B + base
    return out


@pytest.mark.parametrize("W,K,B", [(8, 6, 4), (4, 16, 1), (16, 5, 3)])
def test_paged_selection_matches_the_loop(device, W, K, B):
    g = torch.Generator().manual_seed(W * 100 + K * 10 + B)
    T, S = 9, 3
    rows = [int(v) for v in torch.randint(K, 3 * K, (S,), generator=g)]
    table, _ = paged_table(g, rows, B, max(rows) + B)
    slot = torch.randint(0, S, (T,), generator=g).to(I32)
    width = torch.randint(1, W + 1, (T,), generator=g)
    win_sel = torch.randint(-1, 50, (T, W), generator=g).to(I32)
    logical = torch.stack([torch.randint(-1, rows[int(s)], (K,), generator=g) for s in slot]).to(I32)
    ref = _loop(win_sel, width, logical, table, slot, B, 1000)
    twin = paged_selection_torch(win_sel, width, logical, table, slot, B, 1000, torch.empty(T, W + K, dtype=I32))
    assert torch.equal(twin, ref)
    d = [t.to(device) for t in (win_sel, width, logical, table, slot)]
    got = paged_selection(*d[:5], B, 1000, torch.full((T, W + K), 7, dtype=I32, device=device))
    assert torch.equal(got.cpu(), ref)


def test_paged_selection_refuses_bad_shapes(device):
    z = torch.zeros(2, 4, dtype=I32, device=device)
    with pytest.raises(ValueError, match="out: \\(2, 7\\) torch.int32; allowed: \\(2, 8\\) torch.int32"):
        paged_selection(z, torch.zeros(2, dtype=I32, device=device), z, z, z[:, 0], 4, 0, torch.zeros(2, 7, dtype=I32))
