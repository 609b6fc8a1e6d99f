"""``sgl_kernel`` as sglang's XPU attention backend imports it (sgl-kernel-xpu's names and
signatures), served by triton_xpu_attn. Made importable as ``sgl_kernel`` by
:func:`triton_xpu_attn.compat.install`.

Names (sglang 0.5.23, ``sglang/srt/layers/attention/xpu_backend.py`` and its import chain):
``flash_mla_decode``, ``flash_mla_decode_get_workspace_size`` (old name
``flash_mla_get_workspace_size`` kept), ``flash_mla_prefill``,
``flash_mla_prefill_get_workspace_size``, ``merge_state`` (v1: base-2 LSEs) and ``merge_state_v2``,
``flash_mla_sparse_fwd`` (DeepSeek sparse attention prefill: sglang 0.5.23's DeepSeek-V4 backend
imports it from the root on XPU; sgl-kernel-xpu also defines it in the submodule
``sgl_kernel.attention``, provided here too),
the DeepSeek indexer logits ``fp8_mqa_logits``, ``fp8_paged_mqa_logits`` (submodule
``sgl_kernel.nsa``) and ``fp8_paged_mqa_logits_triton`` (submodule ``sgl_kernel.fp8_paged_mqa_logits``;
sglang's DeepSeek indexer imports it from the root on XPU), ``flash_mla_with_kvcache`` (DeepSeek sparse attention
decode over paged caches: the DeepSeek-V4 backend imports it from the root on XPU; also in
``sgl_kernel.attention``), the submodule ``sgl_kernel.flash_mla`` (CUDA sgl-kernel's path of
``flash_mla_with_kvcache`` and ``get_mla_metadata``, which the backend imports off XPU),
``store_cache_xpu`` (imported by
``mem_cache/memory_pool.py`` on XPU), the submodule ``sgl_kernel.flash_attn``
(``flash_attn_varlen_func``, ``flash_attn_with_kvcache``), and DeepSeek sparse attention's indexer
top-k (``fast_topk_v2``, ``fast_topk_transform_fused``, ``fast_topk_transform_ragged_fused``,
``topk_transform_512``, ``topk_transform_512_v2``: sglang's DSA backend imports them from the root;
sgl-kernel-xpu defines them in the submodule ``sgl_kernel.top_k``, provided too), and vertical/slash
sparse attention (submodule ``sgl_kernel.sparse_flash_attn``: ``sparse_attn_func``,
``sparse_attn_varlen_func``, ``convert_vertical_slash_indexes``, ``_mergehead``; re-exported from the
root as sgl-kernel-xpu does; sglang's dual-chunk backend imports the submodule).
"""
from __future__ import annotations

import torch

from triton_xpu_attn import flash_mla_decode_get_workspace_size

from . import attention  # noqa: F401  (sgl_kernel.attention is a submodule, as in sgl-kernel-xpu)
from .attention import (  # the root re-exports them, as sgl-kernel-xpu's does
    flash_mla_decode,
    flash_mla_get_workspace_size,
    flash_mla_prefill,
    flash_mla_prefill_get_workspace_size,
    flash_mla_sparse_fwd,
    flash_mla_with_kvcache,
    merge_state,
    merge_state_v2,
)
from . import flash_attn  # noqa: F401  (sgl_kernel.flash_attn is a submodule, as in sgl-kernel-xpu)
from . import fp8_paged_mqa_logits as _fp8_paged_module  # noqa: F401  (submodule, as in sgl-kernel-xpu)
from . import nsa  # noqa: F401  (sgl_kernel.nsa is a submodule, as in sgl-kernel-xpu)
from .fp8_paged_mqa_logits import fp8_paged_mqa_logits_triton
from .nsa import fp8_mqa_logits, fp8_paged_mqa_logits
from . import flash_mla  # noqa: F401  (sgl_kernel.flash_mla: CUDA sgl-kernel's module of the same functions)
from . import sparse_flash_attn  # noqa: F401  (sgl_kernel.sparse_flash_attn, as in sgl-kernel-xpu)
from .sparse_flash_attn import (  # the root re-exports them, as sgl-kernel-xpu's does
    convert_vertical_slash_indexes,
    convert_vertical_slash_indexes_mergehead,
    sparse_attn_func,
    sparse_attn_varlen_func,
)
from . import top_k  # noqa: F401  (sgl_kernel.top_k is a submodule, as in sgl-kernel-xpu)
from .top_k import (  # the root re-exports them, as sgl-kernel-xpu's does
    fast_topk_transform_fused,
    fast_topk_transform_ragged_fused,
    fast_topk_v2,
    topk_transform_512,
    topk_transform_512_v2,
)
from .._stand_ins import unprovided


def store_cache_xpu(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
) -> None:
    """Write new tokens' K/V rows into a token pool (sgl-kernel-xpu's ``store_cache_xpu``).

    Parameters
    ----------
    k, v : torch.Tensor
        ``[N, row]`` new rows (``row = H_kv * D``), the caches' dtype.
    k_cache, v_cache : torch.Tensor
        ``[slots, row]`` one layer of sglang's token pool.
    indices : torch.Tensor
        ``[N]`` int32/int64 slots; ``-1`` means "not this rank's row, skip" (decode context
        parallelism). Those rows go to slot 0, sglang's reserved padding slot, so no host sync is
        needed (the call stays graph-capturable).
    """
    for name, cache, rows in (("k", k_cache, k), ("v", v_cache, v)):
        if rows.dim() != 2 or cache.dim() != 2 or rows.shape[1] != cache.shape[1]:
            raise ValueError(
                f"{name}: expected [N, row] rows and a [slots, row] cache with one row width, got "
                f"{list(rows.shape)} and {list(cache.shape)}"
            )
        if rows.shape[0] != indices.shape[0]:
            raise ValueError(f"indices has {indices.shape[0]} entries but {name} has {rows.shape[0]} rows")
    slots = torch.where(indices >= 0, indices, torch.zeros_like(indices)).to(torch.int64)
    k_cache.index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.index_copy_(0, slots, v.to(v_cache.dtype))


# Non-attention kernels that sglang's modules import at module level on XPU (layernorm.py,
# quantization/fp8_kernel.py, moe/.../fused_moe.py, activation): importable, NotImplementedError on call.
_NON_ATTENTION = {
    "rmsnorm": "RMS norm",
    "fused_add_rmsnorm": "RMS norm",
    "gemma_rmsnorm": "RMS norm",
    "gemma_fused_add_rmsnorm": "RMS norm",
    "silu_and_mul": "activation",
    "silu_and_mul_clamp": "activation",
    "moe_sum_reduce": "MoE reduction",
    "sgl_per_tensor_quant_fp8": "fp8 quantization",
    "sgl_per_token_quant_fp8": "fp8 quantization",
}
globals().update({name: unprovided("sgl_kernel", name, what) for name, what in _NON_ATTENTION.items()})

__all__ = [
    "attention",
    "convert_vertical_slash_indexes",
    "convert_vertical_slash_indexes_mergehead",
    "fast_topk_transform_fused",
    "fast_topk_transform_ragged_fused",
    "fast_topk_v2",
    "flash_attn",
    "flash_mla_decode",
    "flash_mla_decode_get_workspace_size",
    "flash_mla_get_workspace_size",
    "flash_mla_prefill",
    "flash_mla_prefill_get_workspace_size",
    "flash_mla_sparse_fwd",
    "fp8_mqa_logits",
    "fp8_paged_mqa_logits",
    "fp8_paged_mqa_logits_triton",
    "flash_mla_with_kvcache",
    "flash_mla",
    "merge_state",
    "merge_state_v2",
    "nsa",
    "sparse_attn_func",
    "sparse_attn_varlen_func",
    "sparse_flash_attn",
    "store_cache_xpu",
    "top_k",
    "topk_transform_512",
    "topk_transform_512_v2",
]
