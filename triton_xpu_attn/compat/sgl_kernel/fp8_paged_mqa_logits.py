"""``sgl_kernel.fp8_paged_mqa_logits`` as sgl-kernel-xpu lays it out: ``fp8_paged_mqa_logits_triton``
(which sglang's DeepSeek indexer calls on XPU; the package root re-exports it) and ``FP8_DTYPE``,
served by triton_xpu_attn's paged indexer kernel."""
from __future__ import annotations

from typing import Any

import torch

from triton_xpu_attn import fp8_paged_mqa_logits as _fp8_paged_mqa_logits

FP8_DTYPE = torch.float8_e4m3fn

__all__ = ["FP8_DTYPE", "fp8_paged_mqa_logits_triton"]


def fp8_paged_mqa_logits_triton(
    q_fp8: torch.Tensor,
    kvcache_fp8: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    deep_gemm_metadata: Any,
    max_seq_len: int,
    clean_logits: bool = True,
) -> torch.Tensor:
    """sgl-kernel-xpu's ``fp8_paged_mqa_logits_triton``: :func:`triton_xpu_attn.fp8_paged_mqa_logits`
    over DeepGEMM's cache layout, under upstream's argument names.

    Upstream accepts only ``D`` 128, 64-token pages, ``next_n`` 1 and ``clean_logits=False``
    (asserting otherwise); here any shape the root op takes works, and ``clean_logits=True`` gives
    ``-inf`` at unseen positions (DeepGEMM's meaning) instead of raising.

    Parameters
    ----------
    q_fp8 : torch.Tensor
        ``[B, next_n, H, D]`` fp8 e4m3 queries (``float8_e4m3fn`` or ``uint8`` bytes).
    kvcache_fp8 : torch.Tensor
        ``[pages, page_size, 1, D + 4]`` cache (``uint8`` or an fp8 view): per page, its keys' fp8
        bytes, then their fp32 scales.
    weight : torch.Tensor
        ``[B * next_n, H]`` fp32 head weights.
    seq_lens : torch.Tensor
        ``[B]`` or ``[B, 1]`` int32 lengths (``[B, next_n]``: one per query row).
    page_table : torch.Tensor
        ``[B, max_pages]`` int32 page ids.
    deep_gemm_metadata : Any
        Ignored (as upstream).
    max_seq_len : int
        Columns of the output.
    clean_logits : bool
        ``False``: unseen positions 0; ``True``: ``-inf``.

    Returns
    -------
    torch.Tensor
        ``[B * next_n, max_seq_len]`` fp32.
    """
    del deep_gemm_metadata
    return _fp8_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, None, max_seq_len, clean_logits)
