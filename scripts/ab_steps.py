"""A/B of launch shapes inside the batched decode step (a development tool; CUDA): the
whole step through `BatchGraphs` (as `bench` (f): random weights, a filled context, random
index keys) under variants of the attention's and index scores' launch-shape dicts,
mutated in place before each capture, in turn over several rounds (machine drift shows as
the spread between rounds of one variant).

    python3 scripts/ab_steps.py [--context 32768] [--batches 1,64] [--rounds 2]
    python3 scripts/ab_steps.py --single 4096,32768 --variants 'new;new, single bh=16'

`--single`: the single-sequence runtime's step instead (`DecodeGraphs`, as `bench` (a),
graphs mode, no oracle check) at those contexts (`--device cpu --preset small`: a smoke run).

Prints one Markdown table (median ms/step of each variant, min-max over rounds).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from attnv41.bench.batch import _batch, _random_keys  # noqa: E402
from attnv41.kernels import gemv, indexer, indexer_gluon, tc_mm  # noqa: E402
from attnv41.kernels import sparse_attn_gluon as sg  # noqa: E402
from attnv41.kernels import sparse_attn_split as ss  # noqa: E402
from attnv41.kernels import topk as topk_mod  # noqa: E402
from attnv41.runtime import decode as runtime_decode  # noqa: E402
from attnv41.runtime import ops as runtime_ops  # noqa: E402
from attnv41.runtime.batch_graphs import BatchGraphs  # noqa: E402
from attnv41.runtime.stack import RuntimeStack  # noqa: E402
from attnv41.synthetic import PRESETS, random_weights  # noqa: E402

DICTS = {
    "single": ss._TUNE,
    "batch_small": ss._BATCH_SMALL_TUNE,
    "batch": ss.BATCH_TUNE,
    "gluon": ss._GLUON,
    "gluon_tune": sg.GLUON_TUNE,
    "index": indexer._TUNE,
    "index_paged": indexer._PAGED_TUNE,
    "index_gluon": indexer_gluon.GLUON_INDEX_TUNE,
}
BASE = {k: dict(v) for k, v in DICTS.items()}
# `tc_mm`'s split rule (module constants read at each call): "tc": dict(target=, min_seg=)
TC_BASE = dict(target=tc_mm._TARGET_PROGRAMS, min_seg=tc_mm._MIN_SEG_PRODUCTS, split=tc_mm._SPLIT_FORM)
FINE_BASE = dict(tc_mm._FINE_PLAN)
# the decode GEMV's split rule (`gemv.plan`'s target program count; other GPU bits, fixed per shape)
_F8 = torch.float8_e4m3fn
PLAN_BASE = dict(gemv._PLAN_SEGS)
ACC8_BASE = gemv._ACC_ROWS8
GEMV_BASE = dict(
    target=gemv._TARGET_PROGRAMS, target_fp8=gemv._TARGET_PROGRAMS_FP8, split=gemv._SPLIT_FORM,
    seg_fp8=gemv._SEG_CHUNKS_FP8,
)  # fmt: skip
# the top-k's launch-shape rule (`topk._topk_shape`'s constants; the same selections for any)
TOPK_BASE = dict(narrow=topk_mod._NARROW_POSITIONS, few=topk_mod._FEW_POSITIONS, row=topk_mod._ROW_WIDTH)
OLD = {  # the launch shapes before 2026-12-03 (ninth entry)
    "single": dict(bh=64),
    "batch_small": dict(bh=64),
    "batch": dict(bh=64, dk=128, dk_packed=None, fmt_dots=False),
    "index": dict(fp4_asm=False),
    "index_paged": dict(fp4_asm=False),
}
# (the ninth entry's runs had `_TUNE` at bh = 16 as "new", without `_BATCH_SMALL_TUNE`, and
# "new, batch dk=128 one dot" as today's production over packed rows)


def _index(**kw) -> dict:
    """A variant's index-score options, for both of its launches."""
    return {"index": dict(kw), "index_paged": dict(kw)}


def _attn(**kw) -> dict:
    """A variant's attention options, for the batched shapes (m = 1 with its 16-head blocks) and the single-sequence one."""
    return {"batch": dict(kw), "batch_small": dict(bh=16, **kw), "single": dict(kw)}


VARIANTS = {
    "new": {},
    # (forty-eighth entry) packed index keys through the Gluon kernel (cp.async stages)
    "index gluon": {"index_paged": dict(gluon=True)},
    "index gluon mid": {"index_paged": dict(gluon=True), "index_gluon": dict(mid=True)},
    # (forty-ninth entry) the Gluon kernel converting one code word per thread
    "index gluon one_word": {"index_paged": dict(gluon=True), "index_gluon": dict(one_word=True)},
    "index gluon one_word sub16": {"index_paged": dict(gluon=True), "index_gluon": dict(one_word=True, sub=16)},
    "index gluon direct": {"index_paged": dict(gluon=True), "index_gluon": dict(stages=0, maxnreg=80)},
    "index gluon direct sub4": {"index_paged": dict(gluon=True), "index_gluon": dict(stages=0, sub=4, maxnreg=80)},
    # (fifty-first entry) the Gluon kernel's keys straight into the MMA's A fragment
    "index gluon afrag": {"index_paged": dict(gluon=True), "index_gluon": dict(stages=0, afrag=True, slice_out=True)},
    "index gluon afrag sub4": {
        "index_paged": dict(gluon=True),
        "index_gluon": dict(stages=0, afrag=True, slice_out=True, sub=4),
    },
    "index gluon afrag ahead row0": {
        "index_paged": dict(gluon=True),
        "index_gluon": dict(stages=0, afrag=True, slice_out=True, ahead=True, row0=True),
    },
    "index gluon afrag sub16": {
        "index_paged": dict(gluon=True),
        "index_gluon": dict(stages=0, afrag=True, slice_out=True, sub=16),
    },
    # (fiftieth entry) the Triton index kernel's code words one per thread
    "index one_word": {"index_paged": dict(one_word=True)},
    "index row0": {"index_paged": dict(row0=True)},
    "index row0 one_word": {"index_paged": dict(row0=True, one_word=True)},
    # (fifteenth entry) the one-pass Gluon attention (opt-in) on, from other batch sizes
    "gluon on": {"gluon": dict(on=True)},
    "gluon from m=16": {"gluon": dict(on=True, min_m=16)},
    "gluon on without pdl": {"gluon": dict(on=True), "gluon_tune": dict(pdl=False)},
    "old": OLD,
    "new, single bh=16": {"single": dict(bh=16)},
    "new, batch m=1 bh=64": {"batch_small": dict(bh=64)},
    "new, index fp32 dequant": {"index": dict(fp4_asm=False), "index_paged": dict(fp4_asm=False)},
    "new, batch packed dk=32 fmt_dots": {"batch": dict(dk_packed=32, fmt_dots=True)},
    # (tenth entry) the attention's logits as rows · qᵀ and its PTX dequantization
    "attn asm": {"batch": dict(fp4_asm=True), "batch_small": dict(bh=16, fp4_asm=True)},
    "attn keys_m": {"batch": dict(keys_m=True), "batch_small": dict(bh=16, keys_m=True)},
    "attn keys_m asm": {
        "batch": dict(keys_m=True, fp4_asm=True),
        "batch_small": dict(bh=16, keys_m=True, fp4_asm=True),
    },
    "single asm": {"single": dict(fp4_asm=True)},
    "single keys_m": {"single": dict(keys_m=True)},
    "single keys_m asm": {"single": dict(keys_m=True, fp4_asm=True)},
    # (after the tenth entry's first call, fp4_asm on in `_TUNE`)
    "attn fp32 dequant": {"single": dict(fp4_asm=False)},
    "batch packed dk=64": {"batch": dict(dk_packed=64)},
    "batch packed dk=64 keys_m": {"batch": dict(dk_packed=64, keys_m=True)},
    # (after the tenth entry's second call: BATCH_TUNE packed dk = 64 with keys_m)
    "batch packed dk=128 heads-major": {"batch": dict(dk_packed=128, keys_m_packed=False)},
    # (eleventh entry) the logits kernel over sub-blocks of 64 / rsplit rows (same bytes)
    "single rsplit=2": {"single": dict(rsplit=2)},
    "single rsplit=4": {"single": dict(rsplit=4)},
    "batch m=1 rsplit=4": {"batch_small": dict(bh=16, rsplit=4)},
    "batch m=1 bh=64 rsplit=4": {"batch_small": dict(bh=64, rsplit=4)},
    "batch rsplit=2": {"batch": dict(rsplit=2)},
    "batch combine warps=8": {"batch": dict(warps_b=8)},
    "batch combine d=64": {"batch": dict(comb_d=64)},
    # (after call 2: BATCH_TUNE's loop combine in 8 warps over bf16 rows) the previous shape
    "batch combine warps=4": {"batch": dict(warps_b=4)},
    # register caps over packed rows (ptxas .maxnreg: two 8-warp combines per SM, four logits programs)
    "batch packed combine 8 warps cap 128": {"batch": dict(warps_b_packed=8, maxnreg_b_packed=128)},
    "batch packed logits cap 128": {"batch": dict(maxnreg_a_packed=128)},
    "batch packed both caps": {"batch": dict(warps_b_packed=8, maxnreg_b_packed=128, maxnreg_a_packed=128)},
    # 96 registers: five logits programs of 4 warps per SM, the 640 programs of B = 64 in one wave
    "batch packed logits cap 96": {"batch": dict(maxnreg_a_packed=96)},
    # (after the eleventh entry) a register cap on the index scores over packed keys: 92
    # registers → 80 (no spill; 6 programs per SM instead of 5) or 64 (2 spilled values; 8)
    "index packed cap 80": {"index": dict(maxnreg_packed=80), "index_paged": dict(maxnreg_packed=80)},
    "index packed cap 64": {"index": dict(maxnreg_packed=64), "index_paged": dict(maxnreg_packed=64)},
    # (twelfth entry) the index epilogue's inner roundings with the NaN test and select
    # again (production before: `inner_cvt=False`), and the cap of 80 on top of production
    "index nan-select": {"index": dict(inner_cvt=False), "index_paged": dict(inner_cvt=False)},
    "index packed uncapped": {"index": dict(maxnreg_packed=None), "index_paged": dict(maxnreg_packed=None)},
    "index paged packed sub 4": {"index_paged": dict(sub_packed=4)},
    "index paged packed sub 8": {"index_paged": dict(sub_packed=8)},
    "index paged packed sub 4 stages 3": {"index_paged": dict(sub_packed=4, num_stages=3)},
    "index paged packed sub 4 uncapped": {"index_paged": dict(sub_packed=4, maxnreg_packed=None)},
    "index scale tile": {"index": dict(scale_word=False), "index_paged": dict(scale_word=False)},
    # (thirty-third entry) packed keys by the table-lookup PTX (`packed_rows`, WORDS = 4) and
    # the index epilogue in bf16 pairs (`epi2`), alone and together; the attention's packed
    # rows by the table lookup
    "index lut": {"index": dict(lut=True), "index_paged": dict(lut=True)},
    "index epi2": {"index": dict(epi2=True), "index_paged": dict(epi2=True)},
    "index lut epi2": {"index": dict(lut=True, epi2=True), "index_paged": dict(lut=True, epi2=True)},
    "index pairs fp32 epilogue": {"index": dict(lut=False, epi2=False), "index_paged": dict(lut=False, epi2=False)},
    "attn lut": {"batch": dict(lut=True), "batch_small": dict(bh=16, lut=True), "single": dict(lut=True)},
    "index lut epi2, attn lut": {**_index(lut=True, epi2=True), **_attn(lut=True)},
    # (thirty-fourth entry) the per-kernel winners on packed data together: the bf16-pair
    # epilogue alone (4-5 % faster over packed keys on an H100) and the attention's lut
    "index epi2, attn lut": {**_index(epi2=True), **_attn(lut=True)},
    # (thirty-fourth entry) the logits kernel's chunk loop per row format (packed rows: their
    # loads pipelined), at the cap of 96 registers and at 128 (no spills offline)
    # (fifty-first entry) the batched logits over packed rows by the Gluon kernel (A fragments)
    "attn gluon logits": {"batch": dict(gluon_logits=True)},
    "attn gluon logits q2 cap128": {"batch": dict(gluon_logits=dict(q_stages=2, maxnreg=128))},
    "attn gluon logits q2 cap96": {"batch": dict(gluon_logits=dict(q_stages=2, maxnreg=96))},
    "index triton": {"index_paged": dict(gluon=False)},
    "index triton attn gluon logits q2 cap96": {
        "index_paged": dict(gluon=False),
        "batch": dict(gluon_logits=dict(q_stages=2, maxnreg=96)),
    },
    "attn fmt loops": _attn(fmt_loops=True),
    "attn fmt loops off": _attn(fmt_loops=False),  # (thirty-fifth entry) `_TUNE`'s fmt_loops back off
    "attn fmt loops 128": {**_attn(fmt_loops=True), "batch": dict(fmt_loops=True, maxnreg_a_packed=128)},
    # (thirty-sixth entry) both forms that cut the packed logits kernel's work per chunk, on the H200
    "attn lut fmt loops": _attn(lut=True, fmt_loops=True),
    "attn scale word": {
        "batch": dict(scale_word=True),
        "batch_small": dict(scale_word=True),
        "single": dict(scale_word=True),
    },
    # (fourteenth entry) the block combine gathers its rows while the logits kernel runs (PDL)
    "attn early rows": {"single": dict(early_rows=True)},
    "batch packed logits 96 combine 8 warps 128": {
        "batch": dict(warps_b_packed=8, maxnreg_b_packed=128, maxnreg_a_packed=96)
    },
    # (twenty-third entry) finer split-K in the batched projections (`tc_mm.plan`'s target
    # program count and segment floor; default 128 / 10)
    "tc 264/4": {"tc": dict(target=264, min_seg=4)},
    "tc 528/4": {"tc": dict(target=528, min_seg=4)},
    "tc 528/2": {"tc": dict(target=528, min_seg=2)},
    "tc 1056/4": {"tc": dict(target=1056, min_seg=4)},
    # the fine split of one weight kind only (`tc_mm._FINE_PLAN`; before the two split levels,
    # the twenty-third entry's first calls, it was the only split: the same plans at m <= 64)
    "tc fp8 264/4": {"fine": {"fp8": (264, 4)}},
    "tc fp8 200/4": {"fine": {"fp8": (200, 4)}},
    "tc fp8 264/6": {"fine": {"fp8": (264, 6)}},
    "tc fp8 396/5": {"fine": {"fp8": (396, 5)}},
    "one level": {"fine": {}},
    "fine fp8 + group 396/5": {"fine": {"fp8": (396, 5), "group": (396, 5)}},
    "fine group 396/5": {"fine": {"group": (396, 5)}},
    "tc fp8 640/8": {"fine": {"fp8": (640, 8)}},
    "tc fp8 1024/5": {"fine": {"fp8": (1024, 5)}},
    "tc fp8 1024/4": {"fine": {"fp8": (1024, 4)}},
    "tc fp8 320/5": {"fine": {"fp8": (320, 5)}},
    "tc fp32 264/4": {"fine": {"fp32": (264, 4)}},
    "tc bf16 264/4": {"fine": {"bf16": (264, 4)}},
    "tc bf16 200/8": {"fine": {"bf16": (200, 8)}},
    "tc fp8 264/4 fp32 264/4": {"fine": {"fp32": (264, 4), "fp8": (264, 4)}},
    "tc bf16 128/16": {"fine": {"bf16": (128, 16)}},
    # (twenty-eighth entry) the single-sequence decode GEMV's split rule: more K segments
    "gemv 2048": {"gemv": dict(target=2048)},
    "gemv 4096": {"gemv": dict(target=4096)},
    "gemv 16384": {"gemv": dict(target=16384)},
    # (the chunks-ahead and word-form variants of that entry: commit acd56e1, knobs removed)
    # (twenty-ninth entry) split weights' partials added by a launch of their own (same
    # bits), and FP8 weights at one chunk per program (other bits)
    "gemv release": {"gemv": dict(split="release")},
    "single release": {"single": dict(counter_release=True)},
    "gemv release, single release": {"gemv": dict(split="release"), "single": dict(counter_release=True)},
    "gemv sum": {"gemv": dict(split="launch")},
    "gemv fp8 16384": {"rule_only": True, "gemv": dict(seg_fp8=None, target_fp8=16384)},
    "gemv fp8 16384 release": {"rule_only": True, "gemv": dict(seg_fp8=None, target_fp8=16384, split="release")},
    "gemv fp8 16384 sum": {"rule_only": True, "gemv": dict(seg_fp8=None, target_fp8=16384, split="launch")},
    "gemv fp8 4096 sum": {"rule_only": True, "gemv": dict(seg_fp8=None, target_fp8=4096, split="launch")},
    # (thirtieth entry) production became "launch" with FP8 at 16,384: the rule before
    "gemv counter": {"rule_only": True, "gemv": dict(seg_fp8=None, target_fp8=None, split="counter")},
    # (thirtieth entry) the batched products' split partials added by a launch of their own (same bits)
    "tc launch": {"tc": dict(split="launch")},
    "tc counter": {"tc": dict(split="counter")},
    # (thirty-sixth entry) reindex layers over every visible row again (runtime/ops.compacts off)
    "full reindex": {"compact": False},
    # (thirty-ninth entry) the top-k's shape before its rule by positions: tile 4096, 8 warps
    "topk fixed shape": {"topk": dict(narrow=0, few=1 << 62, row=0)},
    # (forty-third entry, built, untimed) the top-k's one program per row for rows up to 16K /
    # 32K positions (production: the tiled passes at every width, "topk tiled")
    "topk tiled": {"topk": dict(row=0)},
    "topk row 16K": {"topk": dict(row=1 << 14)},
    "topk row 32K": {"topk": dict(row=1 << 15)},
    # (thirty-ninth entry, built untimed) the decode steps' second stream under capture
    "side stream": {"side": True},
    # (fortieth entry) production captures decode steps with the second stream: one stream
    "one stream": {"side": False},
    # (fortieth entry) wkv's product on the second stream (with the window row's chain) or not
    # (production: not)
    "wkv beside": {"side_wkv": True},
    "wkv with wq_a": {"side_wkv": False},
    # (fortieth entry) an index source's index path on the second stream beside wq_b, or not
    # (production: not)
    "index beside": {"side_index": True},
    "index after wq_b": {"side_index": False},
    # (forty-first entry) single FP8 weights' split counts against the rule's one chunk per
    # program (`gemv._PLAN_SEGS`; other bits: the sums' order follows the plan; "rule_only":
    # over the rule alone, as measured before production took wo_b 8, wq_b 1, indexer.wq_b 1)
    "wo_b 4": {"rule_only": True, "segs": {(5120, 8192, _F8): 4}},
    "wo_b 8": {"rule_only": True, "segs": {(5120, 8192, _F8): 8}},
    "wo_b 16": {"rule_only": True, "segs": {(5120, 8192, _F8): 16}},
    "wo_a 4": {"rule_only": True, "segs": {(8192, 4096, _F8): 4}},
    "wo_a 8": {"rule_only": True, "segs": {(8192, 4096, _F8): 8}},
    "wq_b 1": {"rule_only": True, "segs": {(32768, 1280, _F8): 1}},
    "x 10": {"rule_only": True, "segs": {(1280, 5120, _F8): 10, (512, 5120, _F8): 10}},
    "x 5": {"rule_only": True, "segs": {(1280, 5120, _F8): 5, (512, 5120, _F8): 5}},
    "wo_b 8 wo_a 8 wq_b 1": {
        "rule_only": True,
        "segs": {(5120, 8192, _F8): 8, (8192, 4096, _F8): 8, (32768, 1280, _F8): 1},
    },
    # (forty-first entry) FP8 segments by a chunk cap (`gemv._SEG_CHUNKS_FP8`, off), and the
    # rule alone (one chunk per program, production before the entry)
    "fp8 one chunk": {"rule_only": True, "gemv": dict(seg_fp8=None)},
    "fp8 seg 4": {"rule_only": True, "gemv": dict(seg_fp8=4)},
    "fp8 seg 8": {"rule_only": True, "gemv": dict(seg_fp8=8)},
    # over one chunk per program, single weights' splits and pairs (the rule's did not add up)
    "oc wo_b 8": {"rule_only": True, "gemv": dict(seg_fp8=None), "segs": {(5120, 8192, _F8): 8}},
    "oc wq_b 1": {"rule_only": True, "gemv": dict(seg_fp8=None), "segs": {(32768, 1280, _F8): 1}},
    "oc wo_b 8 wq_b 1": {
        "rule_only": True,
        "gemv": dict(seg_fp8=None),
        "segs": {(5120, 8192, _F8): 8, (32768, 1280, _F8): 1},
    },
    "oc wo_b 8 wo_a 4": {
        "rule_only": True,
        "gemv": dict(seg_fp8=None),
        "segs": {(5120, 8192, _F8): 8, (8192, 4096, _F8): 4},
    },
    "oc wo_b 8 x 5": {
        "rule_only": True,
        "gemv": dict(seg_fp8=None),
        "segs": {(5120, 8192, _F8): 8, (1280, 5120, _F8): 5, (512, 5120, _F8): 5, (32, 5120, _F8): 5},
    },
    # over production: indexer.wq_b split (one chunk per program) again
    "indexer.wq_b split": {"segs": {(4096, 1280, _F8): 5}},
    # (forty-second entry) over production: fewer segments for the launches whose split
    # needs a sum launch (the x launch, wo_a, wo_b); "acc8": the FP8 row tile's launch shape
    # (`gemv._ACC_ROWS8`: rows per program at m = 1; not the bits)
    "x 1": {"segs": {(1280, 5120, _F8): 1, (512, 5120, _F8): 1}},
    "x 2": {"segs": {(1280, 5120, _F8): 2, (512, 5120, _F8): 2}},
    "x 4": {"segs": {(1280, 5120, _F8): 4, (512, 5120, _F8): 4}},
    "x 1 hw 1": {
        "segs": {(1280, 5120, _F8): 1, (512, 5120, _F8): 1, (32, 5120, _F8): 1, (32, 5120, torch.bfloat16): 1}
    },
    "x 1 acc8 8": {"segs": {(1280, 5120, _F8): 1, (512, 5120, _F8): 1}, "acc8": 8},
    "acc8 8": {"acc8": 8},
    # (forty-second entry) the index head weights scaled by a kernel of their own after the
    # index-query chain, as before the entry (the single-sequence runtime's op table)
    "hw apart": {"hw_apart": True},
    "wo_a 1": {"segs": {(8192, 4096, _F8): 1}},
    "wo_a 2": {"segs": {(8192, 4096, _F8): 2}},
    "wo_b 2": {"segs": {(5120, 8192, _F8): 2}},
    "x 1 wo_a 1": {"segs": {(1280, 5120, _F8): 1, (512, 5120, _F8): 1, (8192, 4096, _F8): 1}},
    # bf16 weights' splits (their rule: `_TARGET_PROGRAMS`, unchanged)
    "bf16 wo_b 8": {"segs": {(5120, 8192, torch.bfloat16): 8}},
    "bf16 wo_a 4": {"segs": {(8192, 4096, torch.bfloat16): 4}},
    "bf16 x 5": {"segs": {(1280, 5120, torch.bfloat16): 5, (512, 5120, torch.bfloat16): 5}},
}


def apply(over: dict) -> None:
    for k, d in DICTS.items():
        d.clear()
        d.update(BASE[k])
        d.update(over.get(k, {}))
    tc = {**TC_BASE, **over.get("tc", {})}
    tc_mm._TARGET_PROGRAMS, tc_mm._MIN_SEG_PRODUCTS, tc_mm._SPLIT_FORM = tc["target"], tc["min_seg"], tc["split"]
    tc_mm._FINE_PLAN = dict(over.get("fine", FINE_BASE))  # {weight kind: (target, min_seg)}: the fine split
    runtime_ops.COMPACT_REINDEX = over.get("compact", True)
    g = {**GEMV_BASE, **over.get("gemv", {})}
    # the second stream needs both split forms "launch" (runtime/decode.py): off with the others
    runtime_decode.SIDE_STREAM = over.get("side", g["split"] == "launch" and tc["split"] == "launch")
    runtime_decode.SIDE_WKV = over.get("side_wkv", False)
    runtime_decode.SIDE_INDEX = over.get("side_index", False)
    gemv._TARGET_PROGRAMS, gemv._TARGET_PROGRAMS_FP8, gemv._SPLIT_FORM = g["target"], g["target_fp8"], g["split"]
    # production's per-shape splits (`gemv._PLAN_SEGS`), or with "rule_only" none (the rule alone)
    gemv._PLAN_SEGS = {**({} if over.get("rule_only") else PLAN_BASE), **over.get("segs", {})}
    gemv._SEG_CHUNKS_FP8 = g["seg_fp8"]
    gemv._ACC_ROWS8 = over.get("acc8", ACC8_BASE)
    tk = {**TOPK_BASE, **over.get("topk", {})}
    topk_mod._NARROW_POSITIONS, topk_mod._FEW_POSITIONS, topk_mod._ROW_WIDTH = tk["narrow"], tk["few"], tk["row"]


def _table(title: str, col: str, res: dict) -> None:
    """The Markdown table of res {(variant, context or batch, caches): [ms per round]}."""
    print(f"\n### {title}\n")
    print(f"| variant | {col} | caches | ms/step (median) | min-max |")
    print("|---|---|---|---|---|")
    for (name, x, kvf), v in res.items():
        v = sorted(v)
        print(f"| {name} | {x} | {kvf} | {v[len(v) // 2]:.3f} | {v[0]:.3f}-{v[-1]:.3f} |")


def _hw_apart(chain):
    """`index_q_chain` with its head weights scaled by `hw.mul_` after it (two kernels, the
    same bits): the runtime before the forty-second entry."""

    def run(iq, cos, sin, pos, out, nonfinite=None, hw=None, hw_scale=1.0):
        chain(iq, cos, sin, pos, out, nonfinite)
        if hw is not None:
            hw.mul_(hw_scale)
        return out

    return run


def _wo_a(a) -> str:
    """wo_a's storage: `--wo-a`, or with auto as bench builds its stacks (FP8 bytes with FP8 weights)."""
    return a.wo_a if a.wo_a != "auto" else ("fp8" if a.weights == "fp8" else "bf16")


def single(a, dev) -> int:
    from attnv41.bench.common import measure_ceilings  # noqa: PLC0415
    from attnv41.bench.stack import bench_decode_one  # noqa: PLC0415

    ctxs = [int(c) for c in a.single.split(",")]
    cfg = PRESETS[a.preset](max_tokens=16, max_seq=max(ctxs) + 256)
    res: dict = {}
    ceil = measure_ceilings(dev, quick=True)
    for kvf in a.kv.split(","):
        w = random_weights(cfg, 0, dev, weights=a.weights)
        stack = RuntimeStack(cfg, w, device=dev, kv_format=kvf, wo_a=_wo_a(a))
        base_ops = stack.attn.ops
        apart_ops = dataclasses.replace(base_ops, index_q_chain=_hw_apart(base_ops.index_q_chain))
        for _ in range(a.rounds):
            for name in a.variants.split(";"):
                apply(copy.deepcopy(VARIANTS[name]))
                stack.attn.ops = apart_ops if VARIANTS[name].get("hw_apart") else base_ops
                for r in bench_decode_one(stack, ctxs, ceil, reps=a.steps, oracle_steps=0, modes=("graphs",), rounds=1):
                    res.setdefault((name, r["context"], kvf), []).append(r["ms"])
                    print(f"{name} {r['context']} {kvf}: {r['ms']:.3f} ms", flush=True)
        del stack
        gc.collect()
    apply({})
    _table(
        f"single-sequence decode step, DecodeGraphs, {a.weights} weights, wo_a {_wo_a(a)} ({a.steps} steps, {a.rounds} rounds)",
        "context",
        res,
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--kv", default="bf16,packed")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--variants", default=";".join(VARIANTS), help="names separated by ;")
    ap.add_argument("--single", default="", help="contexts: time the single-sequence runtime's DecodeGraphs step")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="flash")
    ap.add_argument("--weights", default="bf16", choices=("bf16", "fp8"), help="the step's weights")
    ap.add_argument("--wo-a", default="auto", choices=("auto", "bf16", "fp8"), help="wo_a's storage (auto: as bench)")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if a.single:
        return single(a, dev)
    ctx = a.context
    batches = [int(b) for b in a.batches.split(",")]
    cfg = PRESETS["flash"](max_tokens=max(batches), max_seq=ctx + 256)
    stack = RuntimeStack(cfg, random_weights(cfg, 0, dev, weights=a.weights), device=dev, wo_a=_wo_a(a))
    names = a.variants.split(";")
    res: dict = {}
    for _ in range(a.rounds):
        for name in names:
            apply(copy.deepcopy(VARIANTS[name]))
            for B in batches:
                for kvf in a.kv.split(","):
                    gen = torch.Generator(device=dev).manual_seed(0)
                    bt = _batch(stack, B, ctx + a.steps + 8, B, kvf)
                    for sl in range(B):
                        bt.pool.assume(sl, ctx)
                    _random_keys(bt, gen)
                    g = BatchGraphs(bt, stack.weights, sizes=(B,))
                    xs = g.x_in[:, :B]
                    xs.copy_(torch.randn(xs.shape, generator=gen, device=dev).to(torch.bfloat16))
                    slots, lens = list(range(B)), [1] * B
                    for _ in range(2):
                        g.step(xs, slots, lens)
                    torch.cuda.synchronize(dev)
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    for _ in range(a.steps):
                        g.step(xs, slots, lens)
                    e1.record()
                    torch.cuda.synchronize(dev)
                    ms = e0.elapsed_time(e1) / a.steps
                    res.setdefault((name, B, kvf), []).append(ms)
                    print(f"{name} B={B} {kvf}: {ms:.3f} ms", flush=True)
                    del g, bt, xs
                    gc.collect()
    apply({})
    _table(
        f"batched decode step at {ctx}, BatchGraphs, {a.weights} weights, wo_a {_wo_a(a)} ({a.steps} steps, {a.rounds} rounds)",
        "batch",
        res,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
