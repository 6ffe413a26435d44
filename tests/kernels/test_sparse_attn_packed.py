"""The decode attention over V4.1's packed rows (window rows fp8_e8m0, compressed rows
fp4_e4m3; `attnv41.packed`), dequantized as the kernels load them: the same bytes as over
the bf16 rows they pack, for both combines, the batched runtime's tiles and the fused
inverse RoPE; and the twin likewise. The prefill kernel (`sparse_attn`: fresh bf16 window
rows, packed compressed rows) too."""

import pytest
import torch

from attnv41.kernels.packed_rows import fp4_words_ok
from attnv41.kernels.sparse_attn import sparse_attn, sparse_attn_torch
from attnv41.kernels.sparse_attn_split import BATCH_TUNE, sparse_attn_split, sparse_attn_split_torch
from attnv41.packed import pack
from attnv41.reference.qdq import fp4_e4m3_qdq, fp8_qdq
from helpers import interp_subset

BF = torch.bfloat16


def _bits(t):
    return t.cpu().view(torch.int16)


def _unaligned(x):
    """x's bytes at an odd address: packed rows the kernels must read byte by byte
    (`packed_rows.fp4_words_ok` is False)."""
    buf = torch.empty(x.numel() + 1, dtype=torch.uint8, device=x.device)[1:].view(x.shape)
    buf.copy_(x)
    return buf


def _case(device, seed, m=3, H=4, D=64, K=70, Nw=20, Nc=50, layout="random"):
    """layout "random": every 64-entry block mixes window, compressed and absent entries;
    "runtime": the runtime's order (window entries in the first block, compressed ones in
    the next, the −1 tail last), so blocks of one source only, whose dequantization
    the kernels take alone, and an all-absent block (K = 256)."""
    if layout == "runtime":
        K, Nw, Nc = 256, 64, 150
    layout = "random" if layout == "unaligned" else layout
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(m, H, D, generator=g).to(BF)
    scale_rows = torch.exp2(torch.randint(-6, 6, (Nw, 1), generator=g).float())
    win = fp8_qdq((torch.randn(Nw, D, generator=g) * scale_rows).to(BF))
    # row scales down to 2^-14: block scales among e4m3's subnormals (2^-9 … 7·2^-9) too
    comp_scale = torch.exp2(torch.randint(-14, 3, (Nc, 1), generator=g).float())
    comp = fp4_e4m3_qdq((torch.randn(Nc, D, generator=g) * comp_scale).to(BF))
    win[0, :7] = -0.0
    sel = torch.randint(-1, Nw + Nc, (m, K), generator=g, dtype=torch.int32)
    if layout == "runtime":
        sel[:, :64] = torch.randint(-1, Nw, (m, 64), generator=g, dtype=torch.int32)
        sel[:, 64:192] = torch.randint(Nw, Nw + Nc, (m, 128), generator=g, dtype=torch.int32)
        sel[:, 170:] = -1
    sel[0] = -1  # a token with nothing selected
    sink = torch.randn(H, generator=g)
    pw, pc = pack(win, "fp8_e8m0"), pack(comp, "fp4_e4m3")
    return [t.to(device) for t in (q, win, comp, pw, pc, sel, sink)]


_TUNES = [
    dict(combine="loop"),
    dict(combine="blocks"),
    BATCH_TUNE,
    dict(BATCH_TUNE, dk=32),
    dict(BATCH_TUNE, dk_packed=None),
    dict(BATCH_TUNE, dk_packed=32, fmt_dots=True),
    dict(BATCH_TUNE, fp4_asm=True),
    dict(combine="loop", fp4_asm=True),
    dict(combine="blocks", fmt_dots=True, dk=32),
    dict(BATCH_TUNE, keys_m=True, fp4_asm=True),
    dict(combine="blocks", keys_m=True, fp4_asm=True, bh=16),
    dict(BATCH_TUNE, keys_m_packed=False, dk_packed=128),
    dict(BATCH_TUNE, keys_m_packed=False, fmt_dots=True),
    dict(combine="blocks", rsplit=4),
    dict(combine="loop", rsplit=2, keys_m=True),
    dict(BATCH_TUNE, warps_b_packed=4, maxnreg_a_packed=None, maxnreg_b_packed=None),
    dict(BATCH_TUNE, scale_word=True),
    dict(combine="loop", dk=64, comb_d=64, scale_word=True),
    dict(combine="blocks", early_rows=False),
    dict(BATCH_TUNE, lut=True),
    dict(combine="blocks", lut=True),
    dict(combine="loop", lut=True, keys_m=True),
    dict(BATCH_TUNE, fmt_loops=True),
    dict(combine="blocks", bh=16, fmt_loops=False),
    dict(BATCH_TUNE, fmt_loops=True, lut=True, dk_packed=128),
]
_TUNE_IDS = [
    "loop",
    "blocks",
    "batch",
    "batch-dk32",
    "batch-one-dk",
    "batch-fmt-dots-dk32",
    "batch-fp4-asm",
    "loop-fp4-asm",
    "blocks-fmt-dots-dk32",
    "batch-keys-m-fp4-asm",
    "blocks-keys-m-fp4-asm-bh16",
    "batch-heads-major-dk128",
    "batch-heads-major-fmt-dots",
    "blocks-rsplit4",
    "loop-rsplit2-keys-m",
    "batch-4-warp-combine-uncapped",
    "batch-scale-word",  # (the e4m3 scales' word form on the GPU: the logits kernel's chunks of 64)
    "loop-64-scale-word",  # (and the combine's 64-column slices)
    "blocks-without-early-rows",
    "batch-lut",  # (the table-lookup PTX over scale words, on the GPU)
    "blocks-lut",
    "loop-lut-keys-m",
    "batch-fmt-loops",  # (a chunk loop per row format: its row loads pipelined on the GPU)
    "blocks-bh16-one-loop",  # (`_TUNE` has fmt_loops on: the batched m = 1 form, its one loop)
    "batch-fmt-loops-lut-dk128",
]
_TUNE_PARAMS = [pytest.param(t, id=i) for t, i in zip(_TUNES, _TUNE_IDS, strict=True)]
# CUDA only: the PTX-only forms alone (fp4_asm, scale_word, lut), which the interpreter runs as
# the case without them (`fp4_words_mode` 1: the rows as words, no inline assembly there)
_PTX_ONLY = {"batch-fp4-asm", "loop-fp4-asm", "batch-scale-word", "batch-lut", "blocks-lut"}
assert _PTX_ONLY <= set(_TUNE_IDS), f"_PTX_ONLY names no case: {sorted(_PTX_ONLY - set(_TUNE_IDS))}"


@pytest.mark.parametrize("layout", ["random", "runtime", "unaligned"])
@pytest.mark.parametrize("tune", interp_subset(_TUNE_PARAMS, [p for p in _TUNE_PARAMS if p.id not in _PTX_ONLY]))
def test_packed_rows_give_the_same_bytes(device, tune, layout):
    q, win, comp, pw, pc, sel, sink = _case(device, 1, layout=layout)
    if layout == "unaligned":
        pw, pc = _unaligned(pw), _unaligned(pc)
        assert not fp4_words_ok(pc)
    m, H, D = q.shape
    cos = torch.rand(200, 8).to(device)
    sin = torch.rand(200, 8).to(device)
    pos = torch.tensor([3, 150, 77], dtype=torch.int32, device=device)
    outs = {}
    for name, (w, c) in (("bf16", (win, comp)), ("packed", (pw, pc))):
        o_rot = torch.empty(m, H, D, dtype=BF, device=device)
        o = sparse_attn_split(q, w, c, sel, win.shape[0], sink, D**-0.5, rot=(cos, sin, pos, o_rot), **tune)
        outs[name] = (o, o_rot)
    assert torch.equal(_bits(outs["packed"][0]), _bits(outs["bf16"][0]))
    assert torch.equal(_bits(outs["packed"][1]), _bits(outs["bf16"][1]))


def test_packed_twin_gives_the_same_bytes():
    q, win, comp, pw, pc, sel, sink = _case("cpu", 2)
    D = q.shape[2]
    a = sparse_attn_split_torch(q, win, comp, sel, win.shape[0], sink, D**-0.5)
    b = sparse_attn_split_torch(q, pw, pc, sel, win.shape[0], sink, D**-0.5)
    assert torch.equal(_bits(a), _bits(b))


def test_packed_rows_are_checked(device):
    q, win, comp, pw, pc, sel, sink = _case(device, 3)
    with pytest.raises(ValueError, match="comp.dtype = torch.bfloat16; allowed: torch.uint8 \\(packed, as win\\)"):
        sparse_attn_split(q, pw, torch.zeros(5, 36, dtype=BF, device=device), sel, 20, sink, 0.1)
    with pytest.raises(ValueError, match="win.shape = \\(20, 64\\); allowed: \\[Nw, 66\\] \\(packed fp8_e8m0\\)"):
        sparse_attn_split(q, pw[:, :64].contiguous(), pc, sel, 20, sink, 0.1)
    out = torch.full_like(q, 7.0)
    with pytest.raises(ValueError, match="dk = 16; allowed with packed rows: a multiple of 32"):
        sparse_attn_split(q, pw, pc, sel, 20, sink, 0.1, out=out, dk=16)
    assert (out == 7.0).all(), "a refused launch shape writes nothing"


@pytest.mark.parametrize("twin", [False, True], ids=["kernel", "twin"])
@pytest.mark.parametrize("layout", ["random", "runtime", "unaligned"])
def test_prefill_over_packed_compressed_rows_gives_the_same_bytes(device, twin, layout):
    """The prefill regime: window rows bf16 (the chunk's own), compressed rows packed."""
    dev = "cpu" if twin else device
    q, win, comp, pw, pc, sel, sink = _case(dev, 4, layout=layout)
    if layout == "unaligned":
        pc = _unaligned(pc)
    fn = sparse_attn_torch if twin else sparse_attn
    D = q.shape[2]
    a = fn(q, win, comp, sel, win.shape[0], sink, D**-0.5)
    b = fn(q, win, pc, sel, win.shape[0], sink, D**-0.5)
    assert torch.equal(_bits(a), _bits(b))
    empty = fn(q, win, pc[:0], sel.clamp(max=win.shape[0] - 1), win.shape[0], sink, D**-0.5)
    want = fn(q, win, comp[:0], sel.clamp(max=win.shape[0] - 1), win.shape[0], sink, D**-0.5)
    assert torch.equal(_bits(empty), _bits(want))
    Nw, Nc = win.shape[0], comp.shape[0]
    with pytest.raises(ValueError, match=f"comp.shape = \\({Nc}, 33\\); allowed: \\[Nc, 36\\] \\(packed fp4_e4m3\\)"):
        fn(q, win, pc[:, :33].contiguous(), sel, Nw, sink, 0.1)
    with pytest.raises(ValueError, match=f"win.shape = \\({Nw}, 66\\); allowed: \\[Nw, 64\\]"):
        fn(q, pw, pc, sel, Nw, sink, 0.1)
