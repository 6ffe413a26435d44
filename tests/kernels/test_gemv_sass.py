"""The FP8 decode GEMV's sm_90 code keeps the form measured fastest on the H200
(BENCHMARKS.md, 2026-12-02): compiled without a GPU (`attnv41.bench.sass`, Triton's
bundled ptxas and cuobjdump) in a subprocess where Triton does not interpret.

The form: x is quantized in the weight tile's layout, once per thread for the columns it
holds (not once per weight row), and the chunk loop has no barrier (no shared-memory
layout conversion). Triton reached it only with the weight chunk loaded before x; this
test fails if a change of code or compiler loses it, so that the speed is measured again.
"""

from __future__ import annotations

import pytest

from kernels.sass_helpers import compiled


@pytest.mark.parametrize("K,N,split", [(1280, 32768, False), (8192, 5120, True)], ids=["wq_b", "wo_b-split"])
def test_fp8_gemv_quantizes_x_once_per_thread_without_barriers(K, N, split):
    rep = compiled("gemv", "--K", str(K), "--N", str(N), "--dtype", "fp8")["_gemv_kernel"]
    ops = rep["ops"]
    packs = ops.get("F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C", 0)
    bars = ops.get("BAR.SYNC.DEFER_BLOCKING", 0)
    # 16 rows × 256 columns at 2 warps: a thread holds 4 rows of 16 columns; x's 16 values
    # are quantized in 8 pair conversions when shared by the 4 rows (32 when not)
    assert 0 < packs <= 8, (
        f"{packs} e4m3 pack conversions per thread per chunk; want <= 8 (x quantized once per thread)"
    )
    # the lane tree's one barrier (+ two around the split combine); a barrier in the chunk loop makes more
    assert bars <= (3 if split else 1), f"{bars} barriers; want <= {3 if split else 1} (none in the chunk loop)"
    assert rep["local"] == 0, f"{rep['local']} bytes of local memory (spills)"
