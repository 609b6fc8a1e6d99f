"""Stand-in for the ``_C_cache_ops`` library of vllm-xpu-kernels' ``_C`` extension, whose KV-cache
ops vLLM's XPU attention backends call as ``torch.ops._C_cache_ops.<op>`` (vLLM's
``_custom_ops``). Registered here with vllm-xpu-kernels' schemas, served by triton_xpu_attn:

- ``reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
  k_scale, v_scale)``: :func:`triton_xpu_attn.reshape_and_cache_flash`;
- ``concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)``:
  :func:`triton_xpu_attn.concat_and_cache_mla`;
- ``reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
  v_scale)``: :func:`triton_xpu_attn.reshape_and_cache` (vllm-xpu-kernels' 8-argument schema;
  vLLM 0.33's ``_custom_ops.reshape_and_cache`` adds an ``interleaved_v`` argument that neither
  schema takes, and its XPU backends do not call it);
- ``gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)`` and the same op
  as ``cp_gather_cache`` (the name vLLM's MLA fp8-prefill path calls; vllm-xpu-kernels registers
  only ``gather_cache``): :func:`triton_xpu_attn.gather_cache`;
- ``indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)`` and
  ``cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)`` (the
  DSA indexer's key cache, vLLM's ``sparse_attn_indexer``):
  :func:`triton_xpu_attn.indexer_k_quant_and_cache`,
  :func:`triton_xpu_attn.cp_gather_indexer_k_quant_cache`;
- ``gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq,
  num_tokens, kv_cache_dtype, scale, seq_starts)``: :func:`triton_xpu_attn.gather_and_maybe_dequant_cache`
  over rows ``[0, num_tokens)`` of ``dst`` and the ``cu_seq_lens.shape[0] - 1`` requests;
  ``token_to_seq`` (each row's request, which vLLM derives from ``cu_seq_lens``) is not read: each
  row finds its request in ``cu_seq_lens`` itself, the same request for vLLM's inputs.

The other ``_C_cache_ops`` kernels (``convert_fp8``, ``swap_blocks``, ``swap_blocks_batch``,
``getMemoryInfo``: copies between devices and host, not attention) are not registered (a call fails
in torch naming the op).
Nothing is registered where ``torch.ops._C_cache_ops`` already has an op (the real extension
loaded too). Importing ``vllm_xpu_kernels._C`` imports this module, as the real extension
registers both libraries.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._stand_ins import op_defined

from triton_xpu_attn.ops import indexer_cache as _indexer_cache
from triton_xpu_attn.ops import kv_cache_gather as _kv_cache_gather
from triton_xpu_attn.ops import kv_cache_store as _kv_cache_store

NAMESPACE = "_C_cache_ops"


def _defined(name: str) -> bool:
    return op_defined(NAMESPACE, name)


if not _defined("reshape_and_cache_flash"):
    @torch.library.custom_op(f"{NAMESPACE}::reshape_and_cache_flash", mutates_args=("key_cache", "value_cache"))
    def reshape_and_cache_flash(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                                slot_mapping: Tensor, kv_cache_dtype: str, k_scale: Tensor, v_scale: Tensor) -> None:
        """Store key / value rows into the paged cache at ``slot_mapping`` (-1: skipped)."""
        _kv_cache_store.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                                k_scale, v_scale)

if not _defined("concat_and_cache_mla"):
    @torch.library.custom_op(f"{NAMESPACE}::concat_and_cache_mla", mutates_args=("kv_cache",))
    def concat_and_cache_mla(kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, kv_cache_dtype: str,
                             scale: Tensor) -> None:
        """Store ``[kv_c | k_pe]`` rows into the paged MLA cache at ``slot_mapping`` (-1: skipped)."""
        _kv_cache_store.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)

if not _defined("gather_and_maybe_dequant_cache"):
    @torch.library.custom_op(f"{NAMESPACE}::gather_and_maybe_dequant_cache", mutates_args=("dst",))
    def gather_and_maybe_dequant_cache(src_cache: Tensor, dst: Tensor, block_table: Tensor, cu_seq_lens: Tensor,
                                       token_to_seq: Tensor, num_tokens: int, kv_cache_dtype: str, scale: Tensor,
                                       seq_starts: Optional[Tensor]) -> None:
        """Gather rows ``[0, num_tokens)`` of ``dst`` from the paged MLA cache (fp8 dequantised)."""
        if not isinstance(token_to_seq, torch.Tensor):
            raise TypeError(f"token_to_seq must be a torch.Tensor, got {type(token_to_seq).__name__}")
        if isinstance(dst, torch.Tensor) and isinstance(num_tokens, int) and 0 <= num_tokens < dst.shape[0]:
            dst = dst[:num_tokens]
        elif isinstance(num_tokens, int) and num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        batch = cu_seq_lens.shape[0] - 1 if isinstance(cu_seq_lens, torch.Tensor) and cu_seq_lens.dim() == 1 else 0
        _kv_cache_gather.gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, max(batch, 0),
                                                        kv_cache_dtype, scale, seq_starts)

if not _defined("reshape_and_cache"):
    @torch.library.custom_op(f"{NAMESPACE}::reshape_and_cache", mutates_args=("key_cache", "value_cache"))
    def reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor,
                          kv_cache_dtype: str, k_scale: Tensor, v_scale: Tensor) -> None:
        """Store key / value rows into vLLM's paged-attention cache layout (-1: skipped)."""
        _kv_cache_store.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                          v_scale)


def _gather_cache(src_cache: Tensor, dst: Tensor, block_table: Tensor, cu_seq_lens: Tensor, batch_size: int,
                  seq_starts: Optional[Tensor]) -> None:
    """Copy each request's cache entries into contiguous rows of ``dst`` (bit for bit)."""
    _kv_cache_gather.gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)


for _name in ("gather_cache", "cp_gather_cache"):
    if not _defined(_name):
        torch.library.custom_op(f"{NAMESPACE}::{_name}", _gather_cache, mutates_args=("dst",))

if not _defined("indexer_k_quant_and_cache"):
    @torch.library.custom_op(f"{NAMESPACE}::indexer_k_quant_and_cache", mutates_args=("kv_cache",))
    def indexer_k_quant_and_cache(k: Tensor, kv_cache: Tensor, slot_mapping: Tensor, quant_block_size: int,
                                  scale_fmt: str) -> None:
        """Quantise indexer keys to fp8 (per-group fp32 scales) into the paged indexer cache."""
        _indexer_cache.indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)

if not _defined("cp_gather_indexer_k_quant_cache"):
    @torch.library.custom_op(f"{NAMESPACE}::cp_gather_indexer_k_quant_cache", mutates_args=("dst_k", "dst_scale"))
    def cp_gather_indexer_k_quant_cache(kv_cache: Tensor, dst_k: Tensor, dst_scale: Tensor, block_table: Tensor,
                                        cu_seq_lens: Tensor) -> None:
        """Gather each request's fp8 indexer keys and scale bytes into contiguous rows."""
        _indexer_cache.cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
