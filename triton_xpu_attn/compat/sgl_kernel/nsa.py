"""``sgl_kernel.nsa`` as sgl-kernel-xpu lays it out (``python/sgl_kernel/nsa.py``): the DeepSeek
sparse attention indexer logits, served by triton_xpu_attn's kernels.

sgl-kernel-xpu's results, restated: positions a row does not see hold 0 whatever
``clean_logits`` says (its wrapper documents the flag as unused), and its paged op reads the
cache as per-token records (each token's ``D`` fp8 key bytes, then its fp32 scale), the layout
its SYCL kernel and tests use. (``sgl_kernel.fp8_paged_mqa_logits_triton`` reads DeepGEMM's
per-page layout instead: a page's keys, then its scales; both agree at one-token pages.)
"""
from __future__ import annotations

from typing import Optional

import torch

from triton_xpu_attn import fp8_mqa_logits as _fp8_mqa_logits
from triton_xpu_attn import fp8_paged_mqa_logits as _fp8_paged_mqa_logits

__all__ = ["fp8_mqa_logits", "fp8_paged_mqa_logits"]


def fp8_mqa_logits(
    q_fp8: torch.Tensor,
    kv_fp8: tuple,
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    clean_logits: bool = False,
) -> torch.Tensor:
    """sgl-kernel-xpu's ``fp8_mqa_logits``: :func:`triton_xpu_attn.fp8_mqa_logits` with unseen
    positions 0 (``clean_logits`` accepted and ignored, as upstream).

    Parameters
    ----------
    q_fp8 : torch.Tensor
        ``[Nq, H, D]`` fp8 e4m3 queries (``uint8`` or ``float8_e4m3fn``).
    kv_fp8 : tuple[torch.Tensor, torch.Tensor]
        ``(k_fp8 [Nk, D]`` fp8 e4m3 keys, ``k_scale [Nk]`` fp32 scales).
    weights : torch.Tensor
        ``[Nq, H]`` fp32 head weights.
    ks, ke : torch.Tensor
        ``[Nq]`` int32: row ``i`` sees keys ``[ks[i], ke[i])``.
    clean_logits : bool
        Ignored (upstream: unused).

    Returns
    -------
    torch.Tensor
        ``[Nq, Nk]`` fp32 logits, 0 outside each row's range.
    """
    return _fp8_mqa_logits(q_fp8, kv_fp8, weights, ks, ke, False)


def _fp8_mqa_logits_impl(q_fp8, k_fp8, k_scale, weights, ks, ke) -> torch.Tensor:
    """sgl-kernel-xpu's module-level helper of the same name (keys and scales apart), which its
    tests call: :func:`fp8_mqa_logits`."""
    return _fp8_mqa_logits(q_fp8, (k_fp8, k_scale), weights, ks, ke, False)


def fp8_paged_mqa_logits(
    q_fp8: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata: Optional[torch.Tensor],
    max_seq_len: int,
    clean_logits: bool = False,
) -> torch.Tensor:
    """sgl-kernel-xpu's ``fp8_paged_mqa_logits``: :func:`triton_xpu_attn.fp8_paged_mqa_logits` over
    per-token cache records, unseen positions 0 (``clean_logits`` accepted and ignored).

    Parameters
    ----------
    q_fp8 : torch.Tensor
        ``[B, next_n, H, D]`` or ``[B, H, D]`` fp8 e4m3 queries (``uint8`` or ``float8_e4m3fn``).
    kv_cache : torch.Tensor
        ``[pages, page_size, 1, D + 4]`` ``uint8``: each token's ``D`` key bytes, then its fp32 scale.
    weights : torch.Tensor
        ``[B * next_n, H]`` fp32 head weights.
    seq_lens : torch.Tensor
        ``[B]`` or ``[B, 1]`` int32 lengths (``[B, next_n]``: one per query row).
    block_tables : torch.Tensor
        ``[B, max_pages]`` int32 page ids.
    schedule_metadata : torch.Tensor, optional
        Ignored (as upstream on XPU).
    max_seq_len : int
        Columns of the output.
    clean_logits : bool
        Ignored (upstream: unused, the output is zero-filled).

    Returns
    -------
    torch.Tensor
        ``[B * next_n, max_seq_len]`` fp32.
    """
    return _fp8_paged_mqa_logits(q_fp8, kv_cache, weights, seq_lens, block_tables, schedule_metadata, max_seq_len,
                                 False, kv_layout="token")
