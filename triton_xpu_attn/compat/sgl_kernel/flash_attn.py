"""``sgl_kernel.flash_attn`` with sgl-kernel-xpu's signatures and return conventions.

Adaptations on top of :func:`triton_xpu_attn.flash_attn_with_kvcache` /
:func:`triton_xpu_attn.flash_attn_varlen_func`:

- every argument is positional-or-keyword in sgl-kernel-xpu's order;
- with ``return_softmax_lse=True`` the result is sgl-kernel-xpu's 4-tuple
  ``(out, softmax_lse, out_accum, softmax_lse_accum)``; the split accumulators are internal to our
  kernels, so the last two are ``None`` (sglang unpacks ``o, lse, *rest = result``);
- ``bidirectional_block_ids`` (Gemma-3 image blocks, sgl-kernel-xpu's prefill mask) is accepted
  only as ``None``: anything else raises ``ValueError`` (not implemented, never dropped);
- ``alibi_slopes`` (``[Hq]`` or ``[B, Hq]`` float32, FlashAttention's ALiBi) is an extension,
  keyword only, after sgl-kernel-xpu's parameters.
"""
from __future__ import annotations

import triton_xpu_attn as _root


def _sgl_result(result, return_softmax_lse: bool):
    if not return_softmax_lse:
        return result
    out, lse = result[0], result[1]
    return out, lse, None, None


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    rotary_seqlens=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    softmax_scale=None,
    sinks=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
    out=None,
    bidirectional_block_ids=None,
    *,
    alibi_slopes=None,
):
    """sgl-kernel-xpu's ``flash_attn_with_kvcache``: see
    :func:`triton_xpu_attn.flash_attn_with_kvcache` for every argument (AppendKV ``k`` / ``v`` /
    ``cu_seqlens_k_new`` with rotary, ``cache_batch_idx``, ``cache_leftpad``, and a contiguous
    cache with ``page_table=None`` included). ``cache_seqlens`` is required (sglang always passes
    it). ``softcap=None`` means 0.

    Returns ``out [total_q, Hq, Dv]``, or with ``return_softmax_lse`` the 4-tuple
    ``(out, lse [Hq, total_q] fp32, None, None)``.
    """
    if bidirectional_block_ids is not None:
        raise ValueError(
            "bidirectional_block_ids: bidirectional image-block attention (Gemma-3 multimodal prefill) "
            "is not supported by triton_xpu_attn"
        )
    if cache_seqlens is None:
        raise ValueError("cache_seqlens ([B] int32 KV lengths) is required")
    result = _root.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, qv, rotary_cos, rotary_sin,
        cache_seqlens=cache_seqlens, page_table=page_table, cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, rotary_seqlens=rotary_seqlens,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, softmax_scale=softmax_scale,
        sinks=sinks, causal=causal, window_size=window_size, softcap=0.0 if softcap is None else softcap,
        rotary_interleaved=rotary_interleaved, scheduler_metadata=scheduler_metadata, num_splits=num_splits,
        pack_gqa=pack_gqa, sm_margin=sm_margin, return_softmax_lse=return_softmax_lse, out=out,
        alibi_slopes=alibi_slopes,
    )
    return _sgl_result(result, return_softmax_lse)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    sinks=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    softcap=0.0,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
    *,
    alibi_slopes=None,
):
    """sgl-kernel-xpu's ``flash_attn_varlen_func`` (ragged, non-paged q/k/v): see
    :func:`triton_xpu_attn.flash_attn_varlen_func` for every argument.

    Returns ``out [total_q, Hq, Dv]``, or with ``return_softmax_lse`` the 4-tuple
    ``(out, lse [Hq, total_q] fp32, None, None)``.
    """
    result = _root.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        seqused_q=seqused_q, seqused_k=seqused_k, softmax_scale=softmax_scale, sinks=sinks, causal=causal,
        qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, window_size=window_size,
        softcap=0.0 if softcap is None else softcap, num_splits=num_splits, pack_gqa=pack_gqa, sm_margin=sm_margin,
        return_softmax_lse=return_softmax_lse, alibi_slopes=alibi_slopes,
    )
    return _sgl_result(result, return_softmax_lse)


__all__ = ["flash_attn_varlen_func", "flash_attn_with_kvcache"]
