"""triton_xpu_attn: pure-Triton paged-KV attention kernels for LLM serving on Intel XPU, NVIDIA
GPUs and the CPU (Triton interpreter).

Importing the package first runs :mod:`triton_xpu_attn.device`, which selects the Triton
interpreter on a machine without a GPU before any kernel is defined.
"""
from . import device  # noqa: F401  (must come first: sets TRITON_INTERPRET on CPU-only machines)
from .ops.indexer_cache import cp_gather_indexer_k_quant_cache, indexer_k_quant_and_cache
from .ops.kv_cache_gather import gather_and_maybe_dequant_cache, gather_cache
from .ops.kv_cache_store import concat_and_cache_mla, reshape_and_cache, reshape_and_cache_flash
from .ops.local_attention import make_local_attention_virtual_batches, max_local_attention_virtual_batches
from .ops.merge_state import merge_attn_states, merge_state, merge_state_v2
from .ops.mla_decode import flash_mla_decode, flash_mla_decode_get_workspace_size, flash_mla_get_workspace_size
from .ops.mla_prefill import flash_mla_prefill, flash_mla_prefill_get_workspace_size
from .ops.mla_sparse_prefill import flash_mla_sparse_fwd
from .ops.mqa_logits import fp8_mqa_logits, fp8_paged_mqa_logits, get_paged_mqa_logits_metadata
from .ops.mla_sparse_decode import flash_mla_with_kvcache, get_mla_metadata
from .ops.paged_attention import flash_attn_with_kvcache
from .ops.page_table import normalize_page_table, translate_loc_from_full_to_swa
from .ops.swa_spec import prepare_swa_spec_page_table
from .ops.topk import (
    fast_topk_transform_fused,
    fast_topk_transform_ragged_fused,
    fast_topk_v2,
    topk_transform_512,
    topk_transform_512_v2,
)
from .ops.varlen_attention import flash_attn_varlen_func
from .ops.vertical_slash import (
    convert_vertical_slash_indexes,
    convert_vertical_slash_indexes_mergehead,
    sparse_attn_func,
    sparse_attn_varlen_func,
)
from . import custom_ops  # noqa: E402,F401  (registers torch.library ops: torch.ops.triton_xpu_attn.*; a few ms at import)

__version__ = "0.1.0"

__all__ = [
    "concat_and_cache_mla",
    "cp_gather_indexer_k_quant_cache",
    "convert_vertical_slash_indexes",
    "convert_vertical_slash_indexes_mergehead",
    "fast_topk_transform_fused",
    "fast_topk_transform_ragged_fused",
    "fast_topk_v2",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "flash_mla_decode",
    "flash_mla_decode_get_workspace_size",
    "flash_mla_get_workspace_size",
    "flash_mla_prefill",
    "flash_mla_prefill_get_workspace_size",
    "flash_mla_sparse_fwd",
    "fp8_mqa_logits",
    "gather_and_maybe_dequant_cache",
    "gather_cache",
    "fp8_paged_mqa_logits",
    "get_paged_mqa_logits_metadata",
    "flash_mla_with_kvcache",
    "get_mla_metadata",
    "indexer_k_quant_and_cache",
    "make_local_attention_virtual_batches",
    "max_local_attention_virtual_batches",
    "merge_attn_states",
    "merge_state",
    "merge_state_v2",
    "normalize_page_table",
    "prepare_swa_spec_page_table",
    "reshape_and_cache",
    "reshape_and_cache_flash",
    "sparse_attn_func",
    "sparse_attn_varlen_func",
    "topk_transform_512",
    "topk_transform_512_v2",
    "translate_loc_from_full_to_swa",
]
