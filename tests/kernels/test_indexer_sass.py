"""The index scores' production launch shape compiled for sm_90 without a GPU
(`attnv41.bench.sass index`, in a subprocess where Triton does not interpret): the keys
as the MMA's 64 rows at 4 warps make a warpgroup MMA (HGMMA), with no local memory, over
bf16 and packed keys; and `round_bf16` takes the hardware conversion on CUDA unless
`ATTNV41_ROUND_BF16=bits` asks for the bit form (`kernels/_triton.py`); the epilogue's
inner roundings drop the NaN test and select (`inner_cvt`)."""

from __future__ import annotations

import pytest

from kernels.sass_helpers import compiled


def _count(rep: dict, prefix: str) -> int:
    return sum(v for k, v in rep["ops"].items() if k.startswith(prefix))


@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_production_shape_is_a_warpgroup_mma(packed):
    rep = compiled("index", *(["--packed"] if packed else []))["_index_scores_kernel"]
    assert rep["local"] == 0, f"local memory: {rep['local']} bytes"
    assert _count(rep, "HGMMA") > 0 and _count(rep, "HMMA") == 0, {k: v for k, v in rep["ops"].items() if "MMA" in k}
    # the heads-major orientation (keys_m=False) at 2 warps: mma.sync, as before
    old = compiled("index", "--tune", '{"keys_m": false, "num_warps": 2}', *(["--packed"] if packed else []))
    assert _count(old["_index_scores_kernel"], "HMMA") > 0


def test_round_bf16_form_follows_the_switch(monkeypatch):
    cvt = compiled("index")["_index_scores_kernel"]
    monkeypatch.setenv("ATTNV41_ROUND_BF16", "bits")
    bits = compiled("index")["_index_scores_kernel"]
    # (the epilogue's roundings convert two values per instruction: F2FP.BF16.F32.PACK_AB)
    assert _count(cvt, "F2F.BF16.F32") + _count(cvt, "F2FP.BF16") > 0, "the hardware conversion by default"
    assert _count(bits, "F2F") == 0, "the bit form under ATTNV41_ROUND_BF16=bits"
    assert sum(bits["ops"].values()) > sum(cvt["ops"].values())


def test_inner_roundings_drop_the_nan_select():
    """`inner_cvt` (production): only the stored sum's rounding keeps the NaN test (one
    FSETP.NAN per stored pair at most), where the select form tests every dot and product."""
    new = compiled("index", "--packed")["_index_scores_kernel"]
    old = compiled("index", "--packed", "--tune", '{"inner_cvt": false}')["_index_scores_kernel"]
    assert _count(new, "FSETP.NAN") < _count(old, "FSETP.NAN") // 8, (new["ops"], old["ops"])
    assert sum(new["ops"].values()) < sum(old["ops"].values())


def test_scale_word_skips_the_words_round_trip():
    """`scale_word` (production, packed keys of d = 128): each row's four scale bytes as one
    word, so the code words reach the dequantization in their load layout; the scale tile
    of joins (`scale_word=False`) sends them through shared memory first (LDS.128)."""
    args = ("--packed", "--m", "64", "--L", "32768", "--paged", "64")
    new = compiled("index", *args)["_index_scores_kernel"]
    old = compiled("index", *args, "--tune", '{"scale_word": false}')["_index_scores_kernel"]
    # (both keep one 16-bit shared round trip of the scores before their store)
    assert old["ops"].get("LDS.128", 0) > 0 and new["ops"].get("LDS.128", 0) == 0, (new["ops"], old["ops"])
    assert _count(new, "LDG.E.U8") == 0, "the scales as words, not bytes"
    assert sum(new["ops"].values()) < sum(old["ops"].values())


def test_lut_and_bf16_pair_epilogue_take_fewer_instructions():
    """Packed keys by the table-lookup PTX (`lut`: one bf16x2 multiply per two values, the
    scale's, instead of two) and the epilogue in bf16 pairs (`epi2`: round, max with 0 and
    the weight's multiply two values per instruction) compile to fewer instructions than
    the pair-of-words PTX and the fp32 epilogue, with no local memory, at the batched
    launch (B = 64, paged) and at m = 1 over 1M keys."""
    for args in (("--m", "64", "--L", "32768", "--paged", "64"), ("--m", "1")):
        off = compiled("index", "--packed", *args, "--tune", '{"lut": false, "epi2": false}')["_index_scores_kernel"]
        on = compiled("index", "--packed", *args, "--tune", '{"lut": true, "epi2": true}')["_index_scores_kernel"]
        assert on["local"] == 0, on["ops"]
        assert _count(on, "HMUL2") < _count(off, "HMUL2") * 3 // 4, (on["ops"], off["ops"])
        assert _count(on, "HMNMX2") > 0 and _count(on, "FMNMX") == 0, on["ops"]
        assert sum(on["ops"].values()) < sum(off["ops"].values()) - 40, (on["ops"], off["ops"])


def _words_load_layout(ttgir: str) -> tuple[str, str]:
    """(shape, layout text) of the packed code words' load in a TTGIR module: [64, 16] or
    transposed [16, 64] (one_word) int32 pointers."""
    import re  # noqa: PLC0415

    m = re.search(r"tt\.load %\S+, %\S+(?:, %\S+)? : tensor<(64x16|16x64)x!tt\.ptr<i32>, (#blocked\d*)>", ttgir)
    assert m, "no load of 64 x 16 code words"
    lay = re.search(rf"^{re.escape(m.group(2))} = (#ttg\.blocked<.*>)$", ttgir, re.M)
    return m.group(1), lay.group(1)


@pytest.mark.parametrize("tune", ["{}", '{"one_word": true}', '{"row0": true}', '{"row0": true, "one_word": true}'])
def test_paged_code_words_one_per_thread(tune):
    """The paged launch at B = 64 over packed keys (d = 128: 16 code words a row, rows 68
    bytes apart, 4-byte aligned). Production: Triton's coalescing gives a thread four
    contiguous words ([1, 4] over [8, 4] threads: a warp over 8 rows; four 4-byte loads).
    `one_word` (the load over the transposed tensor, the word index opaque) and `row0`
    (the rows as the first one's pointer plus offsets) give one word per thread, a warp
    over two whole rows; no local memory either way."""
    k = compiled("index", "--packed", "--m", "64", "--L", "32768", "--paged", "64", "--tune", tune)
    rep = k["_index_scores_kernel"]
    shape, lay = _words_load_layout(rep["ttgir"])
    assert rep["local"] == 0, rep["ops"]
    if tune == "{}":
        assert shape == "64x16" and "sizePerThread = [1, 4], threadsPerWarp = [8, 4]" in lay, lay
    elif "one_word" in tune:
        assert shape == "16x64" and "sizePerThread = [1, 1], threadsPerWarp = [16, 2]" in lay, lay
        assert "order = [0, 1]" in lay, lay
    else:
        assert shape == "64x16" and "sizePerThread = [1, 1], threadsPerWarp = [2, 16]" in lay, lay
