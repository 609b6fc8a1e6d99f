"""Stand-in for vllm-xpu-kernels' ``_xpu_C`` extension, which vLLM imports to register its
``torch.ops._xpu_C`` kernels. Of those, the DeepSeek sparse attention indexer logits are
registered here, served by triton_xpu_attn (vllm-xpu-kernels' schemas; vLLM's ``_xpu_ops``
calls them):

- ``torch.ops._xpu_C.fp8_mqa_logits(q, kv, kv_scales, weights, cu_seqlen_ks, cu_seqlen_ke)``:
  :func:`triton_xpu_attn.fp8_mqa_logits` with ``clean_logits=True`` (``-inf`` where a row sees no
  key, vllm-xpu-kernels' result);
- ``torch.ops._xpu_C.fp8_paged_mqa_logits(q_fp8, kv_cache_fp8, weights, context_lens,
  block_tables, schedule_metadata, max_model_len)``: :func:`triton_xpu_attn.fp8_paged_mqa_logits`
  over DeepGEMM's page layout, ``clean_logits=True``.

The other ``_xpu_C`` kernels are not registered (a call fails in torch naming the op). Nothing is
registered where ``torch.ops._xpu_C`` already has these ops (the real extension loaded too).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._stand_ins import op_defined

from triton_xpu_attn.ops import mqa_logits as _mqa_logits

NAMESPACE = "_xpu_C"


def _defined(name: str) -> bool:
    return op_defined(NAMESPACE, name)


if not _defined("fp8_mqa_logits"):
    @torch.library.custom_op(f"{NAMESPACE}::fp8_mqa_logits", mutates_args=())
    def fp8_mqa_logits(q: Tensor, kv: Tensor, kv_scales: Tensor, weights: Tensor, cu_seqlen_ks: Tensor,
                       cu_seqlen_ke: Tensor) -> Tensor:
        """``[seq_len, seq_len_kv]`` fp32 indexer logits, ``-inf`` outside each row's key range."""
        return _mqa_logits.fp8_mqa_logits(q, (kv, kv_scales), weights, cu_seqlen_ks, cu_seqlen_ke, True)

    @fp8_mqa_logits.register_fake
    def _(q, kv, kv_scales, weights, cu_seqlen_ks, cu_seqlen_ke):
        return q.new_empty((q.shape[0], kv.shape[0]), dtype=torch.float32)

if not _defined("fp8_paged_mqa_logits"):
    @torch.library.custom_op(f"{NAMESPACE}::fp8_paged_mqa_logits", mutates_args=())
    def fp8_paged_mqa_logits(q_fp8: Tensor, kv_cache_fp8: Tensor, weights: Tensor, context_lens: Tensor,
                             block_tables: Tensor, schedule_metadata: Optional[Tensor], max_model_len: int) -> Tensor:
        """``[batch_size * next_n, max_model_len]`` fp32 indexer logits, ``-inf`` where unseen."""
        return _mqa_logits.fp8_paged_mqa_logits(q_fp8, kv_cache_fp8, weights, context_lens, block_tables,
                                                schedule_metadata, max_model_len, True)

    @fp8_paged_mqa_logits.register_fake
    def _(q_fp8, kv_cache_fp8, weights, context_lens, block_tables, schedule_metadata, max_model_len):
        return q_fp8.new_empty((q_fp8.shape[0] * q_fp8.shape[1], max_model_len), dtype=torch.float32)
