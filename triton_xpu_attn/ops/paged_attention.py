"""Paged attention: ``flash_attn_with_kvcache`` (sgl-kernel-xpu compatible), decode and q_len > 1,
and the same kernel over contiguous ragged K/V: ``flash_attn_varlen_func``.

One kernel serves decode, speculative drafts, chunked prefill and (``PAGE_SIZE = 0``, the
contiguous-K/V mode) non-paged ragged prefill, with one copy of the masking and the softmax. A
program owns

* one request and a tile of its queries (``BLOCK_Q`` tokens) times a block of the query heads
  that share one KV head (GQA packing: the rows of the ``tl.dot`` M dimension are
  ``(token, head)`` pairs, so each KV tile is read once for the whole group),
* one KV head,
* one KV split (flash-decoding): the keys a tile of queries can see are cut into splits whose
  partial results are merged, in a fixed order, by ``combine_splits``.

The split count is chosen on the host from shapes only (page-table width, batch, heads, compute
units) and refined per request on the device from its real length, so no launch syncs with the
host and the whole call can be captured in a CUDA/XPU graph.

Key tiles load through pointers (``_tile``: any page size, gathers for pages shorter than
a tile) or, where the config asks for it (``kv_desc``) and Triton has them (>= 3.4; triton-xpu 3.3
compiles the pointer path), through tensor descriptors (``_descriptor_tiles``: a tile of one
page, or of two whole pages with one load each; TMA on Hopper). All share the score/softmax/PV
steps. A slot no query may see (left of a
window, past a request's length, in another request's page) is never loaded: descriptor loads read
whole rows, so the tiles that can hold such slots stay on masked pointer loads.
"""
from __future__ import annotations

import torch

from .._common import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    check_bool,
    check_int,
    check_page_size,
    check_same_device,
    check_tensor,
    dtype_names,
)
from . import append_kv as _append
from . import paged_latent
from . import paged_registry  # noqa: F401  (registers the kernel's XPU compile variants)
from .paged_registry import xpu_launch_shape  # noqa: F401  (read by bench/experiments/xpu_cost_model.py)
# (tiles and the kernel: read from here by tools and tests)
from .paged_config import _heuristic_config, _kv_load, query_heads_per_block, score_chunk, xpu_tiles  # noqa: F401
from .paged_kernel import _PER_REQUEST, _SEARCH, _UNIFORM, _paged_attention_kernel  # noqa: F401
from .paged_launch import _check_heads, _launch, _validate

#: arguments of sgl-kernel-xpu's signature that would change the result and are not implemented:
#: anything but None raises, naming the argument (never silently dropped). Arguments that change
#: nothing on their own are accepted and ignored instead: ``rotary_seqlens`` and
#: ``rotary_interleaved`` without ``rotary_cos`` (sglang's XPU backend passes ``rotary_seqlens``),
#: and the hints ``max_seqlen_k``, ``scheduler_metadata``, ``pack_gqa``, ``sm_margin``.
_UNSUPPORTED = {
    "qv": "qv (absorbed-MLA extend) is not supported: use flash_mla_decode for MLA",
    "q_descale": "q_descale is not supported: pass q in fp16/bf16/fp32",
}


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    *,
    cache_seqlens: torch.Tensor | int,
    page_table: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k_new: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    rotary_seqlens: torch.Tensor | None = None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    softmax_scale: float | None = None,
    sinks: torch.Tensor | None = None,
    causal: bool = False,
    window_size=(-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    rotary_interleaved: bool = True,
    scheduler_metadata=None,
    num_splits: int = 0,
    pack_gqa=None,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
    out: torch.Tensor | None = None,
    validate: bool = False,
):
    """Attention of new query tokens over a paged KV cache (decode, drafts, chunked prefill),
    optionally appending new keys / values (with rotary embedding) into the cache in the same call.

    Drop-in for sgl-kernel-xpu's ``flash_attn_with_kvcache`` (same keyword names). The causal mask
    and windows are bottom-right aligned: query ``t`` of a request with ``q_len`` queries sits at
    position ``cache_seqlens[b] - q_len + t``.

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, Hq, D]`` ragged queries with ``cu_seqlens_q``, or ``[B, S, Hq, D]`` (S = 1 is
        decode). fp16, bf16 or fp32; last dim contiguous, other strides free. D and Dv are
        multiples of 8, D up to 576 (past 512 the score dot takes the channels past 512 as a
        second chunk), Dv up to 512.
    k_cache, v_cache : torch.Tensor
        ``[num_pages, page_size, H_kv, D]`` and ``[num_pages, page_size, H_kv, Dv]``, q's dtype or
        fp8 (``float8_e4m3fn``/``float8_e5m2``, then with ``k_descale``/``v_descale``). Any strides
        with ``stride(-1) == 1``: K and V may be slices of one buffer, a layer of a multi-layer pool,
        or a ``view(-1, 1, H_kv, D)`` of a paged pool (token-granular tables). ``page_size`` is a
        power of two from 1 to 2048. Offsets are 64-bit: caches beyond 2^31 elements work. An MLA
        latent cache (``H_kv = 1``, ``v_cache = k_cache[..., :Dv]``, vLLM's MLA call: D = 576,
        Dv = 512) in q's dtype with pages of at most 256 tokens, and no window, soft-cap, sinks or
        descales, runs on the MLA kernels (``flash_mla_decode`` / ``flash_mla_prefill``: each
        cache row read once); anything else on the paged kernel.
        With ``page_table=None``: a contiguous cache ``[B_cache, S, H_kv, D]`` / ``[.., Dv]``
        (request ``b`` reads row ``cache_batch_idx[b]``, or ``b``), whose dim 0 stride is a whole
        number of token rows.
    k, v : torch.Tensor, optional
        New tokens to append (FlashAttention-3's AppendKV): ``[B, S_new, H_kv, D]`` /
        ``[B, S_new, H_kv, Dv]``, or ragged ``[total_new, H_kv, D]`` with ``cu_seqlens_k_new``; q's
        dtype (or, into an fp8 cache, the cache's dtype: copied as is); last dim contiguous. Token
        ``i`` of request ``b`` is written in place at position ``cache_seqlens[b] + i`` of its
        cache row (into an fp8 cache as ``x / descale``, saturated); the attention then covers
        ``cache_seqlens[b] + new_len`` keys. A token whose position lies past the row (table width
        x page size, or ``S``), whose row or page id lies outside the table / pool writes nothing.
    qv, q_descale
        Accepted for signature compatibility; anything but ``None`` raises ``ValueError`` naming
        the argument (not implemented, never silently dropped).
    rotary_cos, rotary_sin : torch.Tensor, optional
        ``[seqlen_ro, rotary_dim / 2]`` (only with ``k``): the first ``rotary_dim`` channels of the
        new keys rotate at positions ``rotary_seqlens[b] + i``, the queries (a rotated copy) at
        ``rotary_seqlens[b] + t`` when causal or local, else all at ``rotary_seqlens[b]``
        (FlashAttention-3); a position outside ``[0, seqlen_ro)`` is not rotated.
    cache_batch_idx : torch.Tensor, optional
        ``[B]`` int32: cache row of each request (a row of ``page_table``, or of a contiguous
        cache); an entry outside gives the request no key (output 0) and writes nothing.
    cache_leftpad : torch.Tensor, optional
        ``[B]`` int32: first valid key position of each row (keys before it are never read;
        clamped into ``[0, cache_seqlens + new_len]``). With a paged cache its pages must hold
        consecutive tokens (``stride(0) == page_size * stride(1)``).
    cu_seqlens_k_new : torch.Tensor, optional
        ``[B + 1]`` int32 offsets of each request's new tokens in a 3-D ``k`` / ``v``.
    cache_seqlens : torch.Tensor or int
        ``[B]`` int32: KV length of each request already in the cache; without ``k`` that includes
        the new tokens (an int means all). Not modified by an append.
    page_table : torch.Tensor, optional
        ``[B, max_pages]`` int32 (``[rows, max_pages]`` with ``cache_batch_idx``),
        **page-granular**: physical page of each logical page. ``cache_seqlens[b] <= max_pages *
        page_size`` is required (``validate=True`` checks it; the kernel clamps longer lengths to
        the table rather than read past it). None: ``k_cache`` is a contiguous cache.
    cu_seqlens_q : torch.Tensor, optional
        ``[B + 1]`` int32 cumulative query lengths; required with a 3-D ``q``.
    max_seqlen_q : int, optional
        Longest query length of the batch (a promise, as in FlashAttention). When given it sizes
        the grid directly (a value above ``total_q`` counts as ``total_q``); otherwise requests
        are found by a binary search on the device.
    max_seqlen_k, scheduler_metadata, pack_gqa, sm_margin
        Hints accepted for compatibility and ignored (GQA packing is always on).
    rotary_seqlens : torch.Tensor, optional
        ``[B]`` int32 rotary position of each request's first new token (default
        ``cache_seqlens``); ignored without ``rotary_cos`` (sglang's XPU backend passes it on every
        call).
    rotary_interleaved : bool
        Rotate channel pairs ``(2j, 2j + 1)`` (True) or ``(j, j + rotary_dim / 2)`` (GPT-NeoX).
    k_descale, v_descale : float or torch.Tensor, optional
        Dequantisation factors of an fp8 cache: a scalar, ``[B]`` or ``[B, H_kv]`` (a dim of size 1
        or stride 0 broadcasts: vLLM's ``scale.expand(num_seqs, H)``). The K factor folds into the
        softmax scale; the V factor multiplies the output.
    softmax_scale : float, optional
        Scale of ``q . k``; default ``D ** -0.5``.
    sinks : torch.Tensor, optional
        ``[Hq]`` float logits (natural log, unscaled) that join each row's softmax denominator.
    causal : bool
        Bottom-right aligned causal mask.
    window_size : tuple[int, int]
        ``(left, right)``, inclusive: a query at position i sees keys ``[i - left, i + right]``;
        -1 means unbounded. ``(W, 0)`` sees ``W + 1`` keys.
    softcap : float
        If > 0, logits become ``softcap * tanh(logits / softcap)`` before masking.
    alibi_slopes : torch.Tensor, optional
        ``[Hq]`` or ``[B, Hq]`` float32 ALiBi slopes (FlashAttention's): the logit of query
        position ``i`` (bottom-right aligned, as the causal mask) and key ``j`` gets
        ``-slope * |i - j|``, added after ``softmax_scale`` and the softcap, unscaled; masks and
        windows still apply, and the LSE includes the bias. (FlashAttention-2's causal kernel adds
        ``slope * j`` instead: the same output, its LSE larger by ``slope * i``.)
    num_splits : int
        KV splits: 0 = automatic (from compute units, batch, heads and the table width), 1 = none,
        n > 1 = at most n (each request uses fewer when it is short). The automatic count is cut
        to whole waves of the programs the device runs at once (CUDA: the compiled kernel's occupancy).
    return_softmax_lse : bool
        Also return the LSE ``[Hq, total_q]`` fp32 (natural log, sinks included).
    out : torch.Tensor, optional
        ``[total_q, Hq, Dv]`` destination in q's dtype (last dim contiguous).
    validate : bool
        Check, with a host sync (not for graph capture), that ``cu_seqlens_q`` is non-decreasing
        within ``q``, every request's queries fit in its KV length, every ``cache_seqlens`` fits in
        the page-table width, and every page id that will be read lies in ``[0, num_pages)``;
        raise ``ValueError`` otherwise. Without it a length beyond the table is clamped to the
        table (the kernel never reads past it) and page ids are trusted.

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, torch.Tensor]
        ``out [total_q, Hq, Dv]`` in q's dtype (always ragged 3-D), and with
        ``return_softmax_lse`` also ``lse [Hq, total_q]`` fp32. Rows that see no key (empty
        requests, padding) give 0 and LSE ``-inf``.
    """
    for name, value in (("qv", qv), ("q_descale", q_descale)):
        if value is not None:
            raise ValueError(f"{name}: {_UNSUPPORTED[name]}")
    if (k is not None or v is not None or page_table is None or cache_batch_idx is not None
            or cache_leftpad is not None or rotary_cos is not None or rotary_sin is not None
            or cu_seqlens_k_new is not None):
        return _append.append_and_attend(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens=cache_seqlens, page_table=page_table,
            cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k_new=cu_seqlens_k_new, max_seqlen_q=max_seqlen_q, rotary_seqlens=rotary_seqlens,
            k_descale=k_descale, v_descale=v_descale, softmax_scale=softmax_scale, sinks=sinks, causal=causal,
            window_size=window_size, softcap=softcap, rotary_interleaved=rotary_interleaved, num_splits=num_splits,
            return_softmax_lse=return_softmax_lse, out=out, validate=validate, alibi_slopes=alibi_slopes,
        )

    # ---- shapes and dtypes ----
    check_tensor("q", q, dtypes=FLOAT_DTYPES, ndim=(3, 4), last_dim_contiguous=True)
    check_tensor("k_cache", k_cache, ndim=4, last_dim_contiguous=True)
    if k_cache.dtype != q.dtype and k_cache.dtype not in FP8_DTYPES:
        raise TypeError(
            f"k_cache's dtype ({dtype_names([k_cache.dtype])}) does not match q's ({dtype_names([q.dtype])}): the cache must "
            f"have q's dtype or be fp8 ({dtype_names(FP8_DTYPES)}) with k_descale/v_descale"
        )
    check_tensor("v_cache", v_cache, dtypes=(k_cache.dtype,), ndim=4, last_dim_contiguous=True)
    num_pages, page_size, num_kv_heads, head_dim = k_cache.shape
    check_page_size(page_size, "page_size (k_cache.shape[1])")
    if tuple(v_cache.shape[:3]) != (num_pages, page_size, num_kv_heads):
        raise ValueError(
            f"v_cache must have shape [{num_pages}, {page_size}, {num_kv_heads}, Dv] like k_cache, got {list(v_cache.shape)}"
        )
    head_dim_v = v_cache.shape[3]
    num_q_heads = q.shape[-2]
    _check_heads(q, "k_cache", num_kv_heads, head_dim, head_dim_v)

    check_tensor("page_table", page_table, dtypes=(torch.int32,), ndim=2, last_dim_contiguous=True)
    batch = page_table.shape[0]
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    check_tensor("cache_seqlens", cache_seqlens, dtypes=(torch.int32,), ndim=1)
    if cache_seqlens.shape[0] != batch:
        raise ValueError(
            f"page_table has {batch} rows but cache_seqlens has {cache_seqlens.shape[0]} entries: both need one per request"
        )
    if not cache_seqlens.is_contiguous():
        cache_seqlens = cache_seqlens.contiguous()

    if q.dim() == 4:
        if cu_seqlens_q is not None:
            raise ValueError("cu_seqlens_q must not be given with a 4-D q [B, S, Hq, D]")
        if q.shape[0] != batch:
            raise ValueError(f"q has {q.shape[0]} requests but page_table has {batch} rows")
        uniform_q_len = q.shape[1]
        max_q = uniform_q_len
        q = q.reshape(batch * uniform_q_len, num_q_heads, head_dim)  # a view whenever strides allow
        mapping = _UNIFORM
    else:
        if cu_seqlens_q is None:
            raise ValueError("cu_seqlens_q ([B + 1] int32) is required with a 3-D q [total_q, Hq, D]")
        check_tensor("cu_seqlens_q", cu_seqlens_q, dtypes=(torch.int32,), ndim=1)
        if cu_seqlens_q.shape[0] != batch + 1:
            raise ValueError(
                f"len(cu_seqlens_q) must be B + 1 = {batch + 1} (B from page_table and cache_seqlens), got {cu_seqlens_q.shape[0]}"
            )
        if not cu_seqlens_q.is_contiguous():
            cu_seqlens_q = cu_seqlens_q.contiguous()
        uniform_q_len = 0
        max_q = check_int(max_seqlen_q, "max_seqlen_q", minimum=0, allow_none=True) or None
        mapping = _PER_REQUEST if max_q is not None else _SEARCH
    total_q = q.shape[0]

    device = check_same_device(
        q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table, cache_seqlens=cache_seqlens,
        cu_seqlens_q=cu_seqlens_q, sinks=sinks, alibi_slopes=alibi_slopes, out=out,
    )
    if check_bool(validate, "validate"):
        _validate(cache_seqlens, page_table, page_size, num_pages, cu_seqlens_q, uniform_q_len, total_q, max_q)
    if paged_latent.takes_latent_route(q, k_cache, v_cache, window_size=window_size, softcap=softcap, sinks=sinks,
                                       k_descale=k_descale, v_descale=v_descale, alibi_slopes=alibi_slopes):
        # an MLA latent cache (V = K's first Dv channels): the MLA kernels read each row once
        return paged_latent.latent_attention(
            q.view(batch, uniform_q_len, num_q_heads, head_dim) if mapping == _UNIFORM else q, k_cache, v_cache,
            cache_seqlens=cache_seqlens, page_table=page_table, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_q,
            softmax_scale=softmax_scale, causal=check_bool(causal, "causal"),
            num_splits=check_int(num_splits, "num_splits", minimum=0),
            return_softmax_lse=check_bool(return_softmax_lse, "return_softmax_lse"), out=out)
    return _launch(
        q, k_cache, v_cache, device=device, batch=batch, page_table=page_table, kv_lens=cache_seqlens,
        cu_seqlens_k=None, max_kv_len=page_table.shape[1] * page_size, mapping=mapping, cu_seqlens_q=cu_seqlens_q,
        uniform_q_len=uniform_q_len, max_q=max_q, softmax_scale=softmax_scale, sinks=sinks, causal=causal,
        window_size=window_size, softcap=softcap, k_descale=k_descale, v_descale=v_descale, num_splits=num_splits,
        return_softmax_lse=return_softmax_lse, out=out, alibi_slopes=alibi_slopes,
    )
