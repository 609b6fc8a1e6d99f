"""Non-paged ragged attention: ``flash_attn_varlen_func`` (sgl-kernel-xpu compatible).

No kernel of its own: it runs the paged-attention kernel (:mod:`.paged_attention`) in its
contiguous-K/V mode (``PAGE_SIZE = 0``), where request ``b``'s keys are the rows
``cu_seqlens_k[b] + key`` of ``k``/``v`` instead of page-table lookups. Masking, softmax, sinks,
softcap, GQA packing, KV splits and the prefill tiles are the paged path's, so both ops agree by
construction and tune through the same config buckets (``q="varlen"``, see the launcher).
"""
from __future__ import annotations

import torch

from .._common import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    check_bool,
    check_int,
    check_same_device,
    check_tensor,
    validate_query_offsets,
)
from .paged_kernel import _PER_REQUEST, _SEARCH
from .paged_launch import _check_heads, _launch

_UNSUPPORTED = {
    "qv": "qv (absorbed-MLA extend) is not supported: concatenate it into q/k beforehand",
    "q_descale": "q_descale is not supported: pass q in fp16/bf16/fp32",
}


def _validate(cu_seqlens_q, cu_seqlens_k, seqused_k, total_q: int, total_k: int, max_q: int | None,
              seqused_q=None) -> None:
    """validate=True: the checks that need the lengths on the host."""
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, total_q), ("cu_seqlens_k", cu_seqlens_k, total_k)):
        c = cu.long().cpu()
        if int(c[0]) < 0 or bool((c[1:] < c[:-1]).any()) or int(c[-1]) > total:
            raise ValueError(f"{name} must be non-decreasing from >= 0 up to at most {total} (the rows of "
                             f"{'q' if name == 'cu_seqlens_q' else 'k'}), got {c.tolist()}")
    validate_query_offsets(cu_seqlens_q.long().cpu(), max_q)
    for name, seqused, cu in (("seqused_q", seqused_q, cu_seqlens_q), ("seqused_k", seqused_k, cu_seqlens_k)):
        if seqused is None:
            continue
        slices = (cu[1:] - cu[:-1]).long().cpu()
        used = seqused.long().cpu()
        bad = (used < 0) | (used > slices)
        if bad.any():
            b = int(bad.nonzero()[0])
            raise ValueError(f"{name}[{b}] = {int(used[b])} lies outside [0, {int(slices[b])}] (request {b}'s "
                             f"slice of {'cu_seqlens_q' if name == 'seqused_q' else 'cu_seqlens_k'})")


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    sinks: torch.Tensor | None = None,
    causal: bool = False,
    qv: torch.Tensor | None = None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    softcap: float = 0.0,
    num_splits: int = 0,
    pack_gqa=None,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
    *,
    out: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    validate: bool = False,
):
    """Attention of ragged queries over ragged, contiguous (non-paged) keys and values.

    Drop-in for sgl-kernel-xpu's ``flash_attn_varlen_func`` (same parameter names and order): the
    extend / prefill attention of sglang's XPU backend (causal over the new tokens; non-causal
    over a chunk of the prefix cache with ``return_softmax_lse=True`` for ``merge_state_v2``).
    Causal masks and windows are bottom-right aligned: query ``t`` of request ``b`` sits at
    position ``kv_len_b - q_len_b + t``; with ``q_len > kv_len`` the first rows of a causal
    request see no key (0, LSE ``-inf``), as in FlashAttention.

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, Hq, D]`` fp16, bf16 or fp32; last dim contiguous, other strides free.
    k, v : torch.Tensor
        ``[total_k, H_kv, D]`` and ``[total_k, H_kv, Dv]``, q's dtype or fp8
        (``float8_e4m3fn``/``float8_e5m2``, then with ``k_descale``/``v_descale``). Any strides
        with ``stride(-1) == 1``: views of a packed ``qkv`` buffer or a padded head stride work
        without a copy. ``D != Dv`` is allowed (DeepSeek MLA extend: 192 / 128). Offsets are 64-bit.
    cu_seqlens_q, cu_seqlens_k : torch.Tensor
        ``[B + 1]`` int32 cumulative lengths: request ``b`` owns rows ``cu_seqlens_q[b] ..
        cu_seqlens_q[b+1] - 1`` of ``q`` and ``cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1`` of
        ``k``/``v``. Rows of ``q`` past ``cu_seqlens_q[B]`` (padding) give 0 and LSE ``-inf``.
    max_seqlen_q : int or None
        Longest query length (a promise, as in FlashAttention: it sizes the grid; rows beyond it
        are not computed, ``validate=True`` checks it; a value above ``total_q`` counts as
        ``total_q``). None or 0: requests are found by a binary search on the device instead.
    max_seqlen_k : int or None
        Longest key length: a hint for the split count only (any value gives correct results);
        None or 0 means ``total_k``.
    seqused_q : torch.Tensor, optional
        ``[B]`` int32: request ``b`` uses only the first ``seqused_q[b]`` rows of its slice of
        ``q`` (FlashAttention-3 semantics: the causal and window alignment use ``seqused_q[b]`` as
        the query length); the slice's other rows give 0 and LSE ``-inf``. A value outside
        ``[0, slice]`` is clamped to it (``validate=True`` reports it).
    seqused_k : torch.Tensor, optional
        ``[B]`` int32: request ``b`` uses only the first ``seqused_k[b]`` keys of its slice
        (FlashAttention semantics: the slice starts at ``cu_seqlens_k[b]``, the causal alignment
        uses ``seqused_k[b]`` as the key length). A value beyond the slice is clamped to it (the
        kernel never reads another request's keys; ``validate=True`` reports it).
    softmax_scale : float, optional
        Scale of ``q . k``; default ``D ** -0.5``.
    sinks : torch.Tensor, optional
        ``[Hq]`` float logits (natural log, unscaled) that join each row's softmax denominator.
    causal : bool
        Bottom-right aligned causal mask.
    qv, q_descale
        Not supported: anything but ``None`` raises ``ValueError`` (never silently dropped).
    k_descale, v_descale : float or torch.Tensor, optional
        Dequantisation factors of fp8 ``k``/``v``: a scalar or ``[B, H_kv]``.
    window_size : tuple[int, int]
        ``(left, right)``, inclusive: a query at position i sees keys ``[i - left, i + right]``;
        -1 means unbounded. ``(W, 0)`` sees ``W + 1`` keys.
    softcap : float
        If > 0, logits become ``softcap * tanh(logits / softcap)`` before masking.
    num_splits : int
        KV splits: 0 = automatic, 1 = none, n > 1 = at most n (as ``flash_attn_with_kvcache``).
    pack_gqa, sm_margin
        Hints accepted for compatibility and ignored (GQA packing is always on).
    return_softmax_lse : bool
        Also return the LSE ``[Hq, total_q]`` fp32 (natural log, sinks included).
    out : torch.Tensor, optional
        ``[total_q, Hq, Dv]`` destination in q's dtype (last dim contiguous); keyword only (an
        extension: vLLM's varlen call passes one).
    alibi_slopes : torch.Tensor, optional
        ``[Hq]`` or ``[B, Hq]`` float32 ALiBi slopes, keyword only (FlashAttention's argument;
        vLLM's varlen call passes it): the logit of query position ``i`` (bottom-right aligned)
        and key ``j`` gets ``-slope * |i - j|`` after ``softmax_scale`` and the softcap, as
        ``flash_attn_with_kvcache``.
    validate : bool
        Check with a host sync (not for graph capture) that the cumulative lengths are
        non-decreasing within ``q``/``k``, ``max_seqlen_q`` covers every request and
        ``seqused_k`` lies within each slice; ``ValueError`` otherwise.

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, torch.Tensor]
        ``out [total_q, Hq, Dv]`` in q's dtype, and with ``return_softmax_lse`` also
        ``lse [Hq, total_q]`` fp32 (as ``flash_attn_with_kvcache``; callers unpacking
        ``out, lse, *rest`` work unchanged). Rows that see no key give 0 and LSE ``-inf``.
    """
    for name, value in (("qv", qv), ("q_descale", q_descale)):
        if value is not None:
            raise ValueError(f"{name}: {_UNSUPPORTED[name]}")

    # ---- shapes and dtypes ----
    check_tensor("q", q, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    check_tensor("k", k, dtypes=(q.dtype,) + FP8_DTYPES, ndim=3, last_dim_contiguous=True)
    check_tensor("v", v, dtypes=(k.dtype,), ndim=3, last_dim_contiguous=True)
    total_k, num_kv_heads, head_dim = k.shape
    if tuple(v.shape[:2]) != (total_k, num_kv_heads):
        raise ValueError(f"v must have shape [{total_k}, {num_kv_heads}, Dv] like k, got {list(v.shape)}")
    _check_heads(q, "k", num_kv_heads, head_dim, v.shape[2])

    check_tensor("cu_seqlens_q", cu_seqlens_q, dtypes=(torch.int32,), ndim=1)
    if cu_seqlens_q.shape[0] < 1:
        raise ValueError("cu_seqlens_q must have B + 1 >= 1 entries, got an empty tensor")
    batch = cu_seqlens_q.shape[0] - 1
    check_tensor("cu_seqlens_k", cu_seqlens_k, dtypes=(torch.int32,), shape=(batch + 1,))
    for name, seqused in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if seqused is not None:
            check_tensor(name, seqused, dtypes=(torch.int32,), shape=(batch,))
    max_q = check_int(max_seqlen_q, "max_seqlen_q", minimum=0, allow_none=True) or None  # 0: not given
    max_k = check_int(max_seqlen_k, "max_seqlen_k", minimum=0, allow_none=True) or None
    device = check_same_device(
        q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_q=seqused_q, seqused_k=seqused_k,
        sinks=sinks, alibi_slopes=alibi_slopes, out=out,
    )
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    if check_bool(validate, "validate"):
        _validate(cu_seqlens_q, cu_seqlens_k, seqused_k, q.shape[0], total_k, max_q, seqused_q)
    # keys per request: seqused_k, else cu_seqlens_k[1:] - a view, no launch: the kernel takes
    # min(this, the slice length), and cu_seqlens_k[b + 1] >= the slice length of request b
    kv_lens = seqused_k.contiguous() if seqused_k is not None else cu_seqlens_k[1:]
    return _launch(
        q, k, v, device=device, batch=batch, page_table=None, kv_lens=kv_lens, cu_seqlens_k=cu_seqlens_k,
        max_kv_len=min(max_k, total_k) if max_k is not None else total_k,
        mapping=_PER_REQUEST if max_q is not None else _SEARCH, cu_seqlens_q=cu_seqlens_q, uniform_q_len=0,
        max_q=max_q, softmax_scale=softmax_scale, sinks=sinks, causal=causal, window_size=window_size,
        softcap=softcap, k_descale=k_descale, v_descale=v_descale, num_splits=num_splits,
        return_softmax_lse=return_softmax_lse, out=out,
        seqused_q=seqused_q.contiguous() if seqused_q is not None else None, alibi_slopes=alibi_slopes,
    )
