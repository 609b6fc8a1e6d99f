"""``vllm_xpu_kernels.flash_attn_interface.flash_attn_varlen_func`` (vLLM's XPU attention call)
served by triton_xpu_attn's ops:

- paged (``block_table`` + ``seqused_k``): :func:`triton_xpu_attn.flash_attn_with_kvcache`, with
  ``k``/``v`` the ``[num_blocks, block_size, H_kv, D]`` caches; ``s_aux`` are the sinks. vLLM's
  MLA call (``k`` the ``[num_blocks, block_size, 1, R + Dr]`` latent cache, ``v`` its narrow view
  ``k[..., :R]``) is one of these: the op runs it on the MLA kernels (its latent route);
- non-paged (``cu_seqlens_k``): :func:`triton_xpu_attn.flash_attn_varlen_func`.

Unsupported arguments raise ``ValueError`` naming them; nothing is silently dropped.
"""
from __future__ import annotations

import torch

import triton_xpu_attn as _root

__all__ = ["flash_attn_varlen_func"]

#: device copies of host slope tensors: (id, version, device) -> (the host tensor, its copy)
_SLOPES: dict = {}


def _slopes_on(slopes: torch.Tensor, device) -> torch.Tensor:
    """``slopes`` on ``device``. vLLM's FlashAttentionImpl keeps its ALiBi slopes as a host tensor
    (vllm-xpu-kernels never reads them): copied once per tensor and version, so later calls (graph
    capture included) reuse the copy instead of copying from host memory again."""
    key = (id(slopes), slopes._version, str(device))
    hit = _SLOPES.get(key)
    if hit is None or hit[0] is not slopes:
        hit = _SLOPES[key] = (slopes, slopes.to(device))
    return hit[1]


def flash_attn_varlen_func(
    q,
    k,
    v,
    max_seqlen_q,
    cu_seqlens_q,
    max_seqlen_k,
    cu_seqlens_k=None,
    seqused_k=None,
    q_v=None,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=None,
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    return_softmax_lse=False,
    out=None,
    scheduler_metadata=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    num_splits: int = 0,
    fa_version: int = 2,
    s_aux=None,
    num_splits_kv=None,
    is_mix_batch: bool = True,
    host_kv_lens=None,
):
    """vllm-xpu-kernels' ``flash_attn_varlen_func``.

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, Hq, D]`` ragged queries (``cu_seqlens_q [B + 1]`` int32, ``max_seqlen_q``).
    k, v : torch.Tensor
        Paged: ``[num_blocks, block_size, H_kv, D / Dv]`` caches (with ``block_table`` and
        ``seqused_k``); MLA: the latent cache ``[num_blocks, block_size, 1, R + Dr]`` and
        ``k[..., :R]``. Non-paged: ``[total_k, H_kv, D / Dv]`` with ``cu_seqlens_k``.
    max_seqlen_q, max_seqlen_k : int
        Longest query / key length of the batch.
    cu_seqlens_k, seqused_k : torch.Tensor, optional
        ``[B + 1]`` cumulative key lengths (non-paged) or ``[B]`` key lengths (paged).
    host_kv_lens : sequence of int or torch.Tensor, optional
        Key lengths on the host; used as ``seqused_k`` when that is not given.
    softmax_scale, causal, softcap, alibi_slopes : as in :func:`triton_xpu_attn.flash_attn_with_kvcache`
        (``softcap`` None means 0; ``alibi_slopes`` ``[Hq]`` or ``[B, Hq]`` float32, a host tensor
        copied to q's device once, as vLLM passes them; with the MLA latent cache they keep the call
        on the paged kernel).
    window_size : (int, int) or None
        Inclusive ``(left, right)``; None means ``(-1, -1)``.
    block_table : torch.Tensor, optional
        ``[B, max_blocks]`` int32 page-granular table: the paged mode.
    return_softmax_lse : bool
        Also return the LSE ``[Hq, total_q]`` fp32.
    out : torch.Tensor, optional
        ``[total_q, Hq, Dv]`` destination.
    k_descale, v_descale : optional
        fp8 cache dequantisation factors (paged and non-paged MHA).
    num_splits, num_splits_kv : int, optional
        KV split count (0 / None: automatic); ``num_splits_kv`` wins when given.
    s_aux : torch.Tensor, optional
        ``[Hq]`` attention sinks.
    deterministic : bool
        Accepted: our kernels reduce in a fixed order (no atomics), so every call is deterministic.
    is_mix_batch : bool
        Routing hint of vllm-xpu-kernels (prefill and decode rows in two launches); ours runs a
        mixed batch in one launch, so it changes nothing.
    q_v, dropout_p, return_attn_probs, scheduler_metadata, q_descale, fa_version
        Not supported: ``q_v``, ``scheduler_metadata``, ``q_descale`` other than
        None, ``dropout_p`` other than 0, ``return_attn_probs=True`` or ``fa_version`` other than 2
        raise ``ValueError``.

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, torch.Tensor]
        ``out [total_q, Hq, Dv]``, and with ``return_softmax_lse`` ``(out, lse [Hq, total_q])``.
    """
    for name, value, ok in (
        ("q_v", q_v, q_v is None),
        ("dropout_p", dropout_p, not dropout_p),
        ("return_attn_probs", return_attn_probs, not return_attn_probs),
        ("scheduler_metadata", scheduler_metadata, scheduler_metadata is None),
        ("q_descale", q_descale, q_descale is None),
        ("fa_version", fa_version, fa_version == 2),
    ):
        if not ok:
            raise ValueError(f"{name}={value!r} is not supported by triton_xpu_attn's flash_attn_varlen_func")
    window_size = (-1, -1) if window_size is None else window_size  # entries checked by the op (ints >= -1)
    softcap = 0.0 if softcap is None else softcap
    splits = num_splits if num_splits_kv is None else num_splits_kv
    if seqused_k is None and host_kv_lens is not None:
        seqused_k = torch.as_tensor(host_kv_lens, dtype=torch.int32).to(q.device, non_blocking=True)
    if isinstance(alibi_slopes, torch.Tensor) and isinstance(q, torch.Tensor) and alibi_slopes.device != q.device:
        alibi_slopes = _slopes_on(alibi_slopes, q.device)

    if block_table is None:
        if cu_seqlens_k is None:
            raise ValueError("cu_seqlens_k ([B + 1] int32) is required without block_table (non-paged k/v)")
        return _root.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=seqused_k,
            softmax_scale=softmax_scale, sinks=s_aux, causal=causal, k_descale=k_descale, v_descale=v_descale,
            window_size=window_size, softcap=softcap, num_splits=splits, return_softmax_lse=return_softmax_lse,
            out=out, alibi_slopes=alibi_slopes,
        )

    if seqused_k is None:
        raise ValueError("seqused_k ([B] int32 KV lengths) or host_kv_lens is required with block_table")
    if cu_seqlens_k is not None:
        raise ValueError("cu_seqlens_k must be None with block_table (paged lengths come from seqused_k)")
    return _root.flash_attn_with_kvcache(
        q, k, v, cache_seqlens=seqused_k, page_table=block_table, cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, k_descale=k_descale, v_descale=v_descale,
        softmax_scale=softmax_scale, sinks=s_aux, causal=causal, window_size=window_size, softcap=softcap,
        num_splits=splits, return_softmax_lse=return_softmax_lse, out=out, alibi_slopes=alibi_slopes,
    )

