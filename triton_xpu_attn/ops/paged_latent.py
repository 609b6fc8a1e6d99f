"""The latent-cache route of ``flash_attn_with_kvcache``: a call whose K/V are an MLA latent
cache (one KV head, ``k_cache [pages, P, 1, R + Dr]``, ``v_cache`` a view of the first ``R``
channels of the same rows, as vLLM's MLA backends pass them) runs on the MLA kernels
(``flash_mla_decode`` / ``flash_mla_prefill``), which read each cache row once for both dots;
the paged kernel would read the ``R`` value channels a second time. Calls the MLA kernels do
not cover (windows, soft-capping, sinks, descales, an fp8 cache, pages past 256 tokens) stay on
the paged kernel, whose head dims reach 576."""
from __future__ import annotations

import torch

from .._common import check_real, check_tensor, check_window
from .mla_decode import flash_mla_decode, flash_mla_get_workspace_size
from .mla_prefill import flash_mla_prefill

#: the MLA kernels' largest page (their page sizes are powers of two from 1 to this)
_MLA_MAX_PAGE = 256


def is_latent_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """One KV head, and ``v_cache`` a view of the first ``Dv < D`` channels of ``k_cache``'s
    rows (same storage, same base, same page / token / head strides)."""
    return (
        k_cache.dim() == 4 and v_cache.dim() == 4 and k_cache.shape[2] == 1 and v_cache.shape[-1] < k_cache.shape[-1]
        and v_cache.data_ptr() == k_cache.data_ptr() and tuple(v_cache.stride()[:3]) == tuple(k_cache.stride()[:3])
        and tuple(v_cache.shape[:3]) == tuple(k_cache.shape[:3])
    )


def takes_latent_route(q, k_cache, v_cache, *, window_size, softcap, sinks, k_descale, v_descale,
                       alibi_slopes=None) -> bool:
    """Whether ``flash_attn_with_kvcache`` runs this (checked) call on the MLA kernels: a latent
    cache in q's dtype, pages of at most 256 tokens, a non-empty batch, and none of the options
    the MLA kernels lack (window, soft-cap, sinks, descales, ALiBi)."""
    return (
        is_latent_cache(k_cache, v_cache) and k_cache.dtype == q.dtype and k_cache.shape[1] <= _MLA_MAX_PAGE
        and k_cache.shape[0] > 0 and q.numel() > 0
        and check_window(window_size) == (-1, -1) and check_real(softcap, "softcap", minimum=0.0) == 0.0
        and sinks is None and k_descale is None and v_descale is None and alibi_slopes is None
    )


def latent_attention(q, k_cache, v_cache, *, cache_seqlens, page_table, cu_seqlens_q, max_seqlen_q, softmax_scale,
                     causal, num_splits, return_softmax_lse, out):
    """``flash_attn_with_kvcache`` on the MLA kernels (``takes_latent_route``): one query per
    request through ``flash_mla_decode`` (its automatic KV splits with ``num_splits`` 0), as do
    4-D causal drafts ``[B, S, Hq, D]``; other ragged or non-causal queries through
    ``flash_mla_prefill``. Same results and layouts as the paged kernel: ``out [total_q, Hq, Dv]``,
    LSE ``[Hq, total_q]``."""
    head_dim_v = v_cache.shape[-1]
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else check_real(softmax_scale, "softmax_scale")
    batch, page_size = page_table.shape[0], k_cache.shape[1]
    num_heads = q.shape[-2]
    total_q = q.shape[0] * (q.shape[1] if q.dim() == 4 else 1)
    if out is not None:
        check_tensor("out", out, dtypes=(q.dtype,), shape=(total_q, num_heads, head_dim_v), last_dim_contiguous=True)
    q_len = q.shape[1] if q.dim() == 4 else 1
    decode = (q.dim() == 4 and (q_len == 1 or causal)) or (
        q.dim() == 3 and max_seqlen_q == 1 and q.shape[0] == batch)
    if decode:
        queries = q if q_len > 1 else q.reshape(batch, num_heads, q.shape[-1])
        splits = -1 if num_splits == 0 else num_splits
        size = flash_mla_get_workspace_size(page_table.shape[1] * page_size, batch, num_heads, page_size, splits,
                                            q_len=q_len, head_dim_v=head_dim_v, device=q.device)
        workspace = torch.empty(size, dtype=torch.uint8, device=q.device)
        result = flash_mla_decode(queries, None, k_cache, cache_seqlens, page_table, workspace, scale, splits,
                                  return_lse=return_softmax_lse, head_dim_v=head_dim_v)
    else:
        if q.dim() == 4:  # uniform query lengths as offsets (no host read of a device value)
            cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device) * q_len
            max_seqlen_q = q_len
            q = q.reshape(total_q, num_heads, q.shape[-1])
        result = flash_mla_prefill(q, None, k_cache, cu_seqlens_q, cache_seqlens, max_seqlen_q, page_table, None,
                                   scale, causal, return_lse=return_softmax_lse, head_dim_v=head_dim_v)
    o, lse = (result[0], result[1]) if return_softmax_lse else (result, None)
    o = o.reshape(total_q, num_heads, head_dim_v)
    if out is not None:
        out.copy_(o)
        o = out
    if not return_softmax_lse:
        return o
    return o, lse.reshape(total_q, num_heads).transpose(0, 1).contiguous()  # the paged kernel's layout
