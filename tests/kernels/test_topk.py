"""The Triton radix selections (`kernels.topk.topk_fixed`, `candidate_mask_fixed`) against
their torch twins in `kernels.select` (themselves equal to the reference), exactly
(torch.equal).

Small tiles (the `tile=` / `tile_blocks=` / `tile_cols=` knobs) put the k-th key, its ties
and −∞ runs across tile edges, so the multi-program passes (atomic histograms, the count
table, the prefix over earlier tiles) are exercised on the interpreter's tiny shapes; one
case per function runs the production tiling. The top-k's one-program-per-row form
(`per_row=True`) runs the same cases. Hostile scores: a handful of values (ties
everywhere), ±0, NaNs of both signs and several payloads, ±∞, all −∞; visible counts 0,
below k, Lb, past Lb, negative; offsets; outputs that are strided views of wider buffers,
poisoned; candidate masks fused into the top-k."""

import zlib

import pytest
import torch

from attnv41.kernels import select
from attnv41.kernels import topk as T
from helpers import interp_subset

MODES = ["randn", "ties", "signed_zeros", "nan", "infs", "all_neg_inf"]
NAN_BITS = [0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0xFFFF]  # ± sign, quiet and signalling payloads


def _scores(gen: torch.Generator, m: int, Lb: int, mode: str) -> torch.Tensor:
    """bf16 [m, Lb] scores of one hostile kind."""
    if mode == "randn":
        return torch.randn(m, Lb, generator=gen).bfloat16()
    if mode == "all_neg_inf":
        return torch.full((m, Lb), float("-inf")).bfloat16()
    pool = {
        "ties": [-2.0, 0.5, 1.0, 3.0],
        "signed_zeros": [0.0, -0.0, 1.0, -1.0],
        "nan": [0.0, -0.0, 1.0, float("-inf"), float("inf")],
        "infs": [float("-inf"), float("inf"), -0.0, 2.0],
    }[mode]
    vals = torch.tensor(pool).bfloat16()
    s = vals[torch.randint(0, len(pool), (m, Lb), generator=gen)]
    if mode == "nan":
        nan = torch.tensor(NAN_BITS, dtype=torch.int32).to(torch.int16)  # wraps to the bit patterns
        where = torch.rand(m, Lb, generator=gen) < 0.1
        pick = nan[torch.randint(0, len(NAN_BITS), (m, Lb), generator=gen)]
        s = torch.where(where, pick, s.view(torch.int16)).view(torch.bfloat16)
    return s


def _visible(gen: torch.Generator, m: int, Lb: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """visible counts: row 0 the whole bucket, then 0, below k, past Lb, negative, random."""
    fixed = [Lb, 0, max(0, k - 1) // 2, Lb + 5, -3]
    vis = torch.randint(0, Lb + 1, (m,), generator=gen)
    for i in range(min(m, len(fixed))):
        vis[i] = fixed[i]
    return vis.to(dtype)


def _neg_inf_past(scores: torch.Tensor, vis: torch.Tensor) -> torch.Tensor:
    """What the index source writes: −∞ past each row's visible count."""
    cols = torch.arange(scores.shape[1])[None, :]
    return scores.masked_fill(cols >= vis.long()[:, None], float("-inf"))


def _equal(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{name}: {got.dtype} {tuple(got.shape)} vs twin {want.dtype} {tuple(want.shape)}"
    )
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:5].tolist()
        raise AssertionError(f"{name}: {int((got != want).sum())} entries differ from the twin, first at {bad}")


def _topk_in_view(scores, vis, k, offset, device, mask=None, **knobs):
    """Triton top-k into a poisoned column slice of a wider buffer; returns (out, buffer outside)."""
    m = scores.shape[0]
    buf = torch.full((m + 1, k + 5), -9, dtype=torch.int32, device=device)
    out = buf[1:, 3 : k + 3]  # strided in dim 0, offset in dim 1
    dm = None if mask is None else mask.to(device)
    assert T.topk_fixed(scores.to(device), vis.to(device), k, offset, out, dm, **knobs) is out
    buf = buf.cpu()
    outside = torch.cat([buf[0], buf[1:, :3].flatten(), buf[1:, k + 3 :].flatten()])
    return out.cpu(), outside


def _twin_topk(scores, vis, k, offset, mask=None):
    s = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    want = torch.full((scores.shape[0], k), -9, dtype=torch.int32)
    return select.topk_fixed(s, vis, k, offset, want)


# ---------------------------------------------------------------- topk_fixed


TOPK_CASES = [  # (m, Lb, k, tile): tile None = the production tiling
    pytest.param(1, 1, 1, 16, id="m1-Lb1-k1"),
    pytest.param(3, 7, 3, 16, id="m3-Lb7-k3"),
    pytest.param(1, 300, 1, 64, id="m1-Lb300-k1-5tiles"),
    pytest.param(2, 300, 300, 64, id="m2-Lb300-k=Lb-5tiles"),
    pytest.param(2, 301, 128, 64, id="m2-Lb301-k128-5tiles"),
    pytest.param(1, 2048 + 13, 512, 512, id="m1-Lb2061-k512-5tiles"),
    pytest.param(1, 5000, 512, None, id="m1-Lb5000-k512-production"),
]
# the interpreter: Lb 300, 301 in 3 tiles of 128 (a first, a middle, a ragged last; 60 % of 5's programs)
if not torch.cuda.is_available():
    TOPK_CASES[2:5] = [pytest.param(*c.values[:3], 128, id=c.id.replace("5tiles", "3tiles")) for c in TOPK_CASES[2:5]]


FORMS = ["tiled", "row"]


def _form(form: str, tile) -> dict:
    """topk_fixed's knobs for a form: the tiled passes at `tile` (None: the production
    tile), or one program per row."""
    return dict(per_row=True) if form == "row" else dict(tile=tile, per_row=False)


@pytest.mark.parametrize("m,Lb,k,tile", TOPK_CASES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("form", FORMS)
def test_topk_matches_twin(device, m, Lb, k, tile, mode, form):
    gen = torch.Generator().manual_seed(zlib.crc32(f"topk,{m},{Lb},{k},{mode}".encode()))
    scores = _scores(gen, m, Lb, mode)
    vis = _visible(gen, m, Lb, k, torch.int32 if Lb % 2 else torch.int64)
    offset = [0, 11, 2**31 - 1 - (Lb - 1)][Lb % 3]  # includes the largest offset allowed
    for name, s in (("raw", scores), ("neg_inf_past", _neg_inf_past(scores, vis))):
        if name != "raw" and device != "cuda" and torch.equal(s.view(torch.int16), scores.view(torch.int16)):
            continue  # the interpreter: no visible count below Lb (m = 1), so raw's call again
        got, outside = _topk_in_view(s, vis, k, offset, device, **_form(form, tile))
        _equal(f"topk {name}", got, _twin_topk(s, vis, k, offset))
        assert bool((outside == -9).all()), f"topk {name}: wrote outside its view"


# (interpreter: not m1-Lb2061-k512, run through the same steps as m2-Lb301-k128 at a wider tile:
# several tiles, the last ragged, a k between 1 and Lb)
SKIP_CASES = interp_subset(TOPK_CASES[1:], [c for c in TOPK_CASES[1:] if c.id != "m1-Lb2061-k512-5tiles"])


@pytest.mark.parametrize("m,Lb,k,tile", SKIP_CASES)
@pytest.mark.parametrize("mode", ["ties", "nan", "all_neg_inf"])
@pytest.mark.parametrize("form", FORMS)
def test_topk_neg_inf_past_reads_nothing_past_visible(device, m, Lb, k, tile, mode, form):
    """neg_inf_past=True: every position ≥ visible[t] counts as −∞ unread, whole tiles past it
    counted without a read: on the index source's scores (−∞ there) the same result as
    without it; on raw scores the result on scores.masked_fill(past, −∞); with a mask too.
    Visible counts of every kind (0, below k, Lb, past Lb, negative, random) over small tiles."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"topk-skip,{m},{Lb},{k},{mode}".encode()))
    scores = _scores(gen, max(m, 5), Lb, mode)  # ≥ 5 rows: every fixed visible kind
    vis = _visible(gen, scores.shape[0], Lb, k, torch.int64)
    past = _neg_inf_past(scores, vis)
    poisoned = scores.clone()
    cols = torch.arange(Lb)[None, :] >= vis[:, None]
    poisoned[cols] = float("nan")  # unread: a NaN past visible would rank above +∞ if it were
    inputs = {"neg_inf_past": past, "raw": scores, "nan_past": poisoned}
    # (interpreter: not raw, whose loads, only below visible, are nan_past's: the same steps; nan_past
    # is the raw scores that a read past visible would change)
    for name in interp_subset(list(inputs), ["neg_inf_past", "nan_past"]):
        got, outside = _topk_in_view(inputs[name], vis, k, 7, device, **_form(form, tile), neg_inf_past=True)
        _equal(f"topk skip {name}", got, _twin_topk(past, vis, k, 7))
        assert bool((outside == -9).all()), f"topk skip {name}: wrote outside its view"
    mask = torch.rand(scores.shape, generator=gen) < 0.5
    got, _ = _topk_in_view(poisoned, vis, k, 0, device, mask=mask, **_form(form, tile), neg_inf_past=True)
    _equal("topk skip mask", got, _twin_topk(past, vis, k, 0, mask))


MASK_TOPK_CASES = [
    pytest.param(3, 40, 17, 16, id="m3-Lb40-k17"),
    pytest.param(1, 2048 + 13, 512, 512, id="m1-Lb2061-k512"),
]


@pytest.mark.parametrize("m,Lb,k,tile", MASK_TOPK_CASES)
@pytest.mark.parametrize("mode", ["ties", "nan"])
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0], ids=["none-kept", "sparse", "all-kept"])
@pytest.mark.parametrize("form", FORMS)
def test_topk_fused_mask_is_masked_fill(device, m, Lb, k, tile, mode, density, form):
    """mask=… equals the twin on scores.masked_fill(~mask, −∞), a strided mask included."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"topk-mask,{m},{Lb},{k},{mode},{density}".encode()))
    scores = _neg_inf_past(_scores(gen, m, Lb, mode), _visible(gen, m, Lb, k, torch.int64))
    vis = _visible(gen, m, Lb, k, torch.int64)
    wide = torch.rand(m, Lb + 3, generator=gen) < density
    mask = wide[:, 2 : Lb + 2]  # a column slice: strided rows
    got, _ = _topk_in_view(scores, vis, k, 4, device, mask=mask, **_form(form, tile))
    _equal("topk mask", got, _twin_topk(scores, vis, k, 4, mask))


@pytest.mark.parametrize("form", FORMS)
def test_topk_strided_scores_and_many_rows(device, monkeypatch, form):
    """Scores a strided view (every other column of a wider buffer); rows past the grid's
    row limit are launched in chunks (the limit shrunk to 2 here)."""
    monkeypatch.setattr(T, "_MAX_GRID_ROWS", 2)
    gen = torch.Generator().manual_seed(3)
    wide = _scores(gen, 5, 2 * 97, "ties")
    scores = wide[:, ::2]
    vis = _visible(gen, 5, 97, 40, torch.int64)
    tile = 16 if device == "cuda" else 32  # the interpreter: 4 tiles, not 7
    got, outside = _topk_in_view(scores, vis, 40, 6, device, **_form(form, tile))
    _equal("topk strided", got, _twin_topk(scores.contiguous(), vis, 40, 6))
    assert bool((outside == -9).all()), "topk strided: wrote outside its view"


@pytest.mark.parametrize("form", FORMS)
def test_topk_ties_take_lower_positions_across_tiles(device, form):
    """All entries equal but a few: the k − (few) lowest positions fill up, over tile edges."""
    Lb, k = 100, 50
    scores = torch.zeros(1, Lb).bfloat16()
    scores[0, [7, 63, 99]] = 1.0
    scores[0, 5] = -0.0  # ties with +0
    got, _ = _topk_in_view(scores, torch.tensor([Lb]), k, 0, device, **_form(form, 16))
    want = list(range(48)) + [63, 99]  # position 7 is among the ones: zeros fill 0 … 47 but 7
    assert got[0].tolist() == want, f"topk ties: {got[0].tolist()}"


@pytest.mark.parametrize("form", FORMS)
def test_topk_visible_below_k_gives_minus_one_tail(device, form):
    scores = _neg_inf_past(torch.randn(2, 64).bfloat16(), torch.tensor([5, 0]))
    got, _ = _topk_in_view(scores, torch.tensor([5, 0]), 9, 100, device, **_form(form, 16))
    assert got[0].tolist() == [100, 101, 102, 103, 104] + [-1] * 4, f"topk tail: {got[0].tolist()}"
    assert got[1].tolist() == [-1] * 9, f"topk visible 0: {got[1].tolist()}"


def test_topk_patched_block_is_used(device, monkeypatch):
    """tile=None reads `_BLOCK` at call time (tests/kernels/test_select.py patches it) when
    the row is wider than `_ROW_WIDTH` (read at call time too)."""
    monkeypatch.setattr(T, "_ROW_WIDTH", 0)
    monkeypatch.setattr(T, "_BLOCK", 16)
    gen = torch.Generator().manual_seed(8)
    scores, vis = _scores(gen, 2, 50, "ties"), torch.tensor([50, 20])
    got, _ = _topk_in_view(scores, vis, 30, 1, device)
    _equal("topk patched", got, _twin_topk(scores, vis, 30, 1))


def test_topk_launch_shape_is_a_function_of_rows_and_width(monkeypatch):
    """The production (tile, warps) by the call's positions m·Lb: up to 128K tiles of 2,048
    at 8 warps, up to 1M tiles of 2,048 at 4 warps, beyond 4,096 at 4 warps; the narrow tile
    never exceeds a patched `_BLOCK`."""
    assert T._topk_shape(1, 1) == (2048, 8)
    assert T._topk_shape(1, 131072) == (2048, 8)
    assert T._topk_shape(4, 32768) == (2048, 8)
    assert T._topk_shape(1, 131073) == (2048, 4)
    assert T._topk_shape(1, 1 << 20) == (2048, 4)
    assert T._topk_shape(64, 4096) == (2048, 4)
    assert T._topk_shape(2, 1 << 20) == (4096, 4)
    assert T._topk_shape(64, 32768) == (4096, 4)
    monkeypatch.setattr(T, "_BLOCK", 16)
    assert T._topk_shape(1, 50) == (16, 8)
    assert T._topk_shape(64, 1 << 20) == (16, 4)


def test_topk_per_row_is_a_function_of_the_width(monkeypatch):
    """One program per row for rows of at most `_ROW_WIDTH` positions (read at call time),
    whatever m; never wider than the form takes."""
    assert 0 <= T._ROW_WIDTH <= T._ROW_LIMIT
    monkeypatch.setattr(T, "_ROW_WIDTH", 16384)
    assert T._topk_per_row(1) and T._topk_per_row(16384)
    assert not T._topk_per_row(16385) and not T._topk_per_row(1 << 20)
    monkeypatch.setattr(T, "_ROW_WIDTH", 0)
    assert not T._topk_per_row(1)


@pytest.mark.parametrize("mode", ["ties", "nan", "all_neg_inf"])
def test_topk_forms_agree_and_rows_are_independent(device, monkeypatch, mode):
    """Each row alone under one program per row, the rows together under it, the tiled
    passes (small tiles) and the production choice select the same positions: a token's
    selection does not depend on m nor on the form."""
    monkeypatch.setattr(T, "_ROW_WIDTH", 300)
    gen = torch.Generator().manual_seed(zlib.crc32(f"topk-forms,{mode}".encode()))
    scores, vis = _scores(gen, 5, 300, mode), torch.tensor([300, 123, 7, 0, 299])
    want = _twin_topk(scores, vis, 40, 5)
    tile = 32 if device == "cuda" else 64  # the interpreter: 5 tiles (half the programs of 10)
    for name, kw in (("row", dict(per_row=True)), ("tiled", dict(tile=tile)), ("production", {})):
        many, _ = _topk_in_view(scores, vis, 40, 5, device, **kw)
        _equal(f"topk {name}, 5 rows", many, want)
    for t in range(5):
        one, _ = _topk_in_view(scores[t : t + 1], vis[t : t + 1], 40, 5, device)
        _equal(f"topk row {t} alone", one, want[t : t + 1])


def test_topk_production_shapes_agree(device, monkeypatch):
    """One row under the narrow rule and the same row among others (the wide rule) select the
    same positions: the shape rule keeps a token's result independent of m."""
    monkeypatch.setattr(T, "_ROW_WIDTH", 0)
    monkeypatch.setattr(T, "_NARROW_TILE", 64)
    monkeypatch.setattr(T, "_BLOCK", 128)
    monkeypatch.setattr(T, "_NARROW_POSITIONS", 300)
    monkeypatch.setattr(T, "_FEW_POSITIONS", 300)
    gen = torch.Generator().manual_seed(9)
    scores, vis = _scores(gen, 3, 300, "ties"), torch.tensor([300, 123, 7])
    assert T._topk_shape(1, 300) == (64, 8) and T._topk_shape(3, 300) == (128, 4)
    many, _ = _topk_in_view(scores, vis, 40, 5, device)
    for t in range(3):
        one, _ = _topk_in_view(scores[t : t + 1], vis[t : t + 1], 40, 5, device)
        _equal(f"topk row {t} alone vs among 3", one, many[t : t + 1])
    _equal("topk rule", many, _twin_topk(scores, vis, 40, 5))


def test_topk_no_rows(device):
    out = torch.empty(0, 4, dtype=torch.int32, device=device)
    scores = torch.empty(0, 10, dtype=torch.bfloat16, device=device)
    assert T.topk_fixed(scores, torch.empty(0, dtype=torch.int64, device=device), 4, 0, out) is out


# ---------------------------------------------------------------- candidate_mask_fixed


MASK_CASES = [  # (m, Lb, cand_blocks, cand_block, tile_blocks, tile_cols); None = production
    pytest.param(1, 1, 1, 1, 16, 16, id="m1-Lb1-b1x1"),
    pytest.param(3, 13, 3, 4, 16, 16, id="m3-Lb13-b3x4-partial"),
    pytest.param(2, 10, 2, 64, 16, 64, id="m2-Lb10-b2x64-one-block"),
    pytest.param(2, 300, 5, 7, 8, 32, id="m2-Lb300-b5x7-6tiles-2steps"),
    pytest.param(2, 2048 + 13, 20, 8, 64, 512, id="m2-Lb2061-b20x8-5tiles"),
    pytest.param(1, 2048 + 13, 2048, 8, 64, 512, id="m1-Lb2061-b2048x8-all-blocks"),
    pytest.param(2, 700, 2, 300, 16, 8192, id="m2-Lb700-b2x300"),
    pytest.param(1, 5000, 64, 8, None, None, id="m1-Lb5000-b64x8-production"),
]
if not torch.cuda.is_available():  # the interpreter: the 64-column block in 4 column steps of 16, not 16 of 4
    MASK_CASES[2] = pytest.param(2, 10, 2, 64, 16, 256, id="m2-Lb10-b2x64-one-block")


def _mask_in_view(scores, vis, blocks, bs, device, **knobs):
    m, Lb = scores.shape
    buf = torch.ones(m, Lb + 4, dtype=torch.bool, device=device)  # poison: every entry is written
    out = buf[:, 1 : Lb + 1]
    assert T.candidate_mask_fixed(scores.to(device), vis.to(device), blocks, bs, out, **knobs) is out
    buf = buf.cpu()
    return out.cpu(), torch.cat([buf[:, :1], buf[:, Lb + 1 :]], dim=1)


# (interpreter: not m2-Lb2061-b20x8, run through the same steps as m2-Lb300-b5x7 (which adds a
# second column step per block): top blocks cut across 5-6 tiles, the last tile and block ragged)
@pytest.mark.parametrize(
    "m,Lb,blocks,bs,tb,cols", interp_subset(MASK_CASES, [c for c in MASK_CASES if c.id != "m2-Lb2061-b20x8-5tiles"])
)
@pytest.mark.parametrize("mode", MODES)
def test_candidate_mask_matches_twin(device, m, Lb, blocks, bs, tb, cols, mode):
    gen = torch.Generator().manual_seed(zlib.crc32(f"mask,{m},{Lb},{blocks},{bs},{mode}".encode()))
    scores = _scores(gen, m, Lb, mode)
    vis = _visible(gen, m, Lb, blocks * bs, torch.int32 if Lb % 2 else torch.int64)
    for name, s in (("raw", scores), ("neg_inf_past", _neg_inf_past(scores, vis))):
        if name != "raw" and device != "cuda" and torch.equal(s.view(torch.int16), scores.view(torch.int16)):
            continue  # the interpreter: no visible count below Lb (m = 1), so raw's call again
        got, outside = _mask_in_view(s, vis, blocks, bs, device, tile_blocks=tb, tile_cols=cols)
        want = select.candidate_mask_fixed(s, vis, blocks, bs, torch.ones(m, Lb, dtype=torch.bool))
        _equal(f"mask {name}", got, want)
        assert bool(outside.all()), f"mask {name}: wrote outside its view"


def test_candidate_mask_many_rows_and_pinned_ties(device, monkeypatch):
    """Rows launched in chunks; the pinned block ties with real +∞ blocks (lower block first)."""
    monkeypatch.setattr(T, "_MAX_GRID_ROWS", 2)
    scores = torch.zeros(5, 64).bfloat16()
    scores[:, [3, 20, 41]] = float("inf")
    vis = torch.tensor([64, 30, 1, 0, 64])
    got, _ = _mask_in_view(scores, vis, 2, 4, device, tile_blocks=4, tile_cols=16)
    want = select.candidate_mask_fixed(scores, vis, 2, 4, torch.ones(5, 64, dtype=torch.bool))
    _equal("mask pinned", got, want)


def test_candidate_mask_nan_block_takes_a_place_unkept(device):
    scores = torch.tensor([[float("nan"), 0.0, 1.0, 2.0]]).bfloat16()
    got, _ = _mask_in_view(scores, torch.tensor([4]), 1, 2, device)
    assert not got.any(), f"mask nan: {got.tolist()}"


# ---------------------------------------------------------------- argument checks


def _topk_args(**over):
    a = dict(
        scores=torch.zeros(2, 10).bfloat16(),
        visible=torch.tensor([3, 10]),
        k=4,
        offset=0,
        out=torch.full((2, 4), -9, dtype=torch.int32),
    )
    a.update(over)
    return a


TOPK_BAD = [
    pytest.param(dict(scores=torch.zeros(2, 10)), "scores must be bf16", id="scores-fp32"),
    pytest.param(dict(visible=torch.tensor([3])), "visible must be int32/int64", id="visible-shape"),
    pytest.param(dict(k=0), r"k = 0; allowed: 1\.\.10", id="k-0"),
    pytest.param(dict(k=11), r"k = 11; allowed: 1\.\.10", id="k-over-Lb"),
    pytest.param(dict(offset=2**31), r"offset = 2147483648; allowed: 0\.\.", id="offset-overflow"),
    pytest.param(dict(out=torch.zeros(2, 4, dtype=torch.int64)), "out must be torch.int32", id="out-int64"),
    pytest.param(dict(mask=torch.ones(2, 10, dtype=torch.uint8)), "mask must be None or torch.bool", id="mask-u8"),
    pytest.param(dict(mask=torch.ones(2, 9, dtype=torch.bool)), r"shape \[2, 10\]", id="mask-shape"),
    pytest.param(dict(tile=24), "tile = 24; allowed: a power of two in 16..65536", id="tile-not-pow2"),
    pytest.param(dict(tile=8), r"tile = 8; allowed: 16\.\.65536", id="tile-small"),
    pytest.param(dict(num_warps=3), "num_warps = 3; allowed: 1, 2, 4, 8, 16", id="warps-3"),
    pytest.param(dict(neg_inf_past=1), "neg_inf_past = 1; allowed: True, False", id="skip-int"),
    pytest.param(dict(per_row=1), "per_row = 1; allowed: None, True, False", id="per-row-int"),
    pytest.param(dict(per_row=True, tile=16), "tile = 16 with per_row = True; allowed: None", id="per-row-tile"),
    pytest.param(
        dict(scores=torch.zeros(2, 32769).bfloat16(), k=4, per_row=True),
        r"Lb \(one program per row\) = 32769; allowed: 1\.\.32768",
        id="per-row-too-wide",
    ),
]


@pytest.mark.parametrize("over,msg", TOPK_BAD)
def test_topk_rejects_bad_arguments(over, msg):
    a = _topk_args(**over)
    before = a["out"].clone()
    with pytest.raises((ValueError, TypeError), match=msg):
        T.topk_fixed(**a)
    assert torch.equal(a["out"], before), "topk: out written before the argument check"


MASK_BAD = [
    pytest.param(dict(cand_blocks=0), r"cand_blocks = 0; allowed: 1\.\.", id="blocks-0"),
    pytest.param(dict(cand_block=True), "cand_block must be an int", id="block-bool"),
    pytest.param(dict(out=torch.ones(2, 10, dtype=torch.uint8)), "out must be torch.bool", id="out-uint8"),
    pytest.param(dict(tile_blocks=6), "tile_blocks = 6; allowed: a power of two", id="tile-blocks-6"),
    pytest.param(dict(tile_blocks=32, tile_cols=16), r"tile_cols = 16; allowed: 32\.\.", id="cols-below-blocks"),
]


@pytest.mark.parametrize("over,msg", MASK_BAD)
def test_candidate_mask_rejects_bad_arguments(over, msg):
    a = dict(
        scores=torch.zeros(2, 10).bfloat16(),
        visible=torch.tensor([3, 10], dtype=torch.int32),
        cand_blocks=2,
        cand_block=4,
        out=torch.ones(2, 10, dtype=torch.bool),
    )
    a.update(over)
    before = a["out"].clone()
    with pytest.raises((ValueError, TypeError), match=msg):
        T.candidate_mask_fixed(**a)
    assert torch.equal(a["out"], before), "mask: out written before the argument check"


# ---------------------------------------------------------------- CUDA graph capture


@pytest.mark.gpu
@pytest.mark.parametrize("Lb,per_row", [(40000, None), (16384, True)], ids=["production", "per-row"])
def test_selections_capture_in_a_cuda_graph(Lb, per_row):
    """Captured once at the production launch shape (a row of 40,000: the tiled passes) or
    one program per row at its candidate production width, replayed over fresh scores and
    visible counts: no host sync, the workspace zeroed inside the graph (a second replay of
    the same inputs gives the same result), equal to the twins."""
    dev, m, k = "cuda", 3, 512
    scores = torch.zeros(m, Lb, dtype=torch.bfloat16, device=dev)
    vis = torch.zeros(m, dtype=torch.int32, device=dev)
    top = torch.full((m + 2, k + 3), -9, dtype=torch.int32, device=dev)[1 : m + 1, 2 : k + 2]
    fused = torch.full((m, k), -9, dtype=torch.int32, device=dev)
    cand = torch.empty(m, Lb, dtype=torch.bool, device=dev)

    def step():
        T.topk_fixed(scores, vis, k, 7, top, per_row=per_row)
        T.candidate_mask_fixed(scores, vis, 2048, 8, cand)
        T.topk_fixed(scores, vis, k, 7, fused, cand, per_row=per_row)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture: compilation, allocator
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for seed, mode in enumerate(MODES):
        gen = torch.Generator().manual_seed(seed)
        s = _scores(gen, m, Lb, mode)
        v = _visible(gen, m, Lb, k, torch.int32)
        s = _neg_inf_past(s, v) if seed % 2 else s
        scores.copy_(s)
        vis.copy_(v)
        for rep in range(2):
            graph.replay()
            torch.cuda.synchronize()
            want_mask = select.candidate_mask_fixed(s, v, 2048, 8, torch.ones(m, Lb, dtype=torch.bool))
            _equal(f"graph topk {mode} #{rep}", top.cpu(), _twin_topk(s, v, k, 7))
            _equal(f"graph mask {mode} #{rep}", cand.cpu(), want_mask)
            _equal(f"graph fused {mode} #{rep}", fused.cpu(), _twin_topk(s, v, k, 7, want_mask))
