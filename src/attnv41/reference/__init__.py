"""Plain-PyTorch reference of DeepSeek-V4.1 attention (attention-v41.md), written for
clarity. Imports nothing from the runtime or the kernels."""

from .compressor import compress_latents, compress_pool, compress_project
from .indexer import candidate_mask, index_scores, topk_select, visible_rows
from .layer import INDEX_KEY_MODES, RefLayerState, RefShared, RefStack, RefTables, RefTrace, layer_forward
from .norm import linear, rms_norm
from .qdq import e2m1_round, fp4_e4m3_qdq, fp4_e8m0_qdq, fp8_qdq, pow2_ceil
from .rope import apply_rope, rope_freqs, rope_table, yarn_range
from .sparse_attn import sparse_attn, sparse_attn_exact

__all__ = [
    "INDEX_KEY_MODES",
    "RefLayerState",
    "RefShared",
    "RefStack",
    "RefTables",
    "RefTrace",
    "apply_rope",
    "candidate_mask",
    "compress_latents",
    "compress_pool",
    "compress_project",
    "e2m1_round",
    "fp4_e4m3_qdq",
    "fp4_e8m0_qdq",
    "fp8_qdq",
    "index_scores",
    "layer_forward",
    "linear",
    "pow2_ceil",
    "rms_norm",
    "rope_freqs",
    "rope_table",
    "sparse_attn",
    "sparse_attn_exact",
    "topk_select",
    "visible_rows",
    "yarn_range",
]
