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

from .. import device as _device
from .. import tune
from .._common import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    MAX_GRID_DIM_1,
    cdiv,
    check_bool,
    check_int,
    check_page_size,
    check_real,
    check_same_device,
    check_tensor,
    check_window,
    device_guard,
    dtype_names,
    interpreter_float32,
    next_power_of_2,
    validate_lengths_and_pages,
    validate_query_offsets,
    whole_wave_splits,
)
from .merge_state import combine_splits
from . import append_kv as _append
from . import paged_latent
from . import paged_registry  # noqa: F401  (registers the kernel's XPU compile variants)
from .paged_registry import xpu_launch_shape  # noqa: F401  (read by bench/experiments/xpu_cost_model.py)
from .paged_config import (_heuristic_config, _kv_descriptors, _kv_load, query_heads_per_block,  # noqa: F401
                           query_rows_descriptors, score_chunk, xpu_tiles)  # (xpu_tiles: read from here by tools)
from .paged_kernel import (_PER_REQUEST, _SEARCH, _UNIFORM, MAX_HEAD_DIM, MAX_HEAD_DIM_QK,  # noqa: F401
                           _paged_attention_kernel)

# ------------------------------------------------------------------------------------------
# launcher
# ------------------------------------------------------------------------------------------

#: (device, dtypes, constexprs) -> programs of the split kernel the device runs at once (or None)
_RESIDENT_PROGRAMS: dict = {}

#: arguments of sgl-kernel-xpu's signature that would change the result and are not implemented:
#: anything but None raises, naming the argument (never silently dropped). Arguments that change
#: nothing on their own are accepted and ignored instead: ``rotary_seqlens`` and
#: ``rotary_interleaved`` without ``rotary_cos`` (sglang's XPU backend passes ``rotary_seqlens``),
#: and the hints ``max_seqlen_k``, ``scheduler_metadata``, ``pack_gqa``, ``sm_margin``.
_UNSUPPORTED = {
    "qv": "qv (absorbed-MLA extend) is not supported: use flash_mla_decode for MLA",
    "q_descale": "q_descale is not supported: pass q in fp16/bf16/fp32",
}

def _validate(cache_seqlens, page_table, page_size, num_pages, cu_seqlens_q, uniform_q_len, total_q,
              max_q=None) -> None:
    """validate=True: the checks that need the lengths and page ids on the host."""
    validate_lengths_and_pages("cache_seqlens", cache_seqlens, page_table, page_size, num_pages)
    lens = cache_seqlens.long().cpu()
    if cu_seqlens_q is not None:
        cu = cu_seqlens_q.long().cpu()
        q_lens = cu[1:] - cu[:-1]
        if int(cu[0]) < 0 or (q_lens < 0).any() or int(cu[-1]) > total_q:
            raise ValueError(f"cu_seqlens_q must be non-decreasing from >= 0 up to at most total_q = {total_q}")
        validate_query_offsets(cu, max_q)
    else:
        q_lens = torch.full_like(lens, uniform_q_len)
    if (q_lens > lens).any():
        b = int((q_lens > lens).nonzero()[0])
        raise ValueError(f"request {b} has {int(q_lens[b])} queries but only {int(lens[b])} keys (cache_seqlens includes the new tokens)")


def _as_scale(name: str, scale, batch: int, num_kv_heads: int, device) -> torch.Tensor | None:
    """A descale as a float32 tensor addressed with (b, kv_head) strides (0 along a broadcast dim).

    Accepted, as vLLM and sgl-kernel pass them: a Python number or one-element tensor (every
    sequence and head); ``[B]`` (per sequence); ``[B, H_kv]``; and in two dims any size-1 dim or a
    dim of stride 0 (a single value expanded, e.g. ``k_scale.expand(num_seqs, H)`` with H not the
    KV head count: Intel's kernel reads its first element). Anything else is ambiguous and raises,
    naming the argument."""
    if scale is None:
        return None
    if not isinstance(scale, torch.Tensor):
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"{name} must be a float, a 1-element tensor or a [B, H_kv] tensor")
        return torch.full((1, 1), float(scale), dtype=torch.float32, device=device).expand(batch, num_kv_heads)
    check_tensor(name, scale, dtypes=FLOAT_DTYPES)
    if scale.device != device:
        raise ValueError(f"{name} is on {scale.device} but q is on {device}")
    if scale.numel() == 1:
        return scale.reshape(1, 1).to(torch.float32).expand(batch, num_kv_heads)
    if scale.ndim == 1 and scale.shape[0] == batch:
        scale = scale[:, None]
    if scale.ndim == 2:
        picked = scale
        for dim, size in ((0, batch), (1, num_kv_heads)):
            if scale.shape[dim] == size:
                continue
            if scale.shape[dim] == 1 or scale.stride(dim) == 0:  # one value along this dim
                picked = picked.narrow(dim, 0, 1)
            else:
                picked = None
                break
        if picked is not None:
            return picked.to(torch.float32).expand(batch, num_kv_heads)
    raise ValueError(f"{name} must be a scalar, [{batch}] (per sequence), or [{batch}, {num_kv_heads}] with any "
                     f"dim of size 1 or stride 0 (one value expanded), got {list(scale.shape)} with strides "
                     f"{list(scale.stride())}: ambiguous")


def _as_alibi_slopes(alibi_slopes, batch: int, num_q_heads: int) -> torch.Tensor | None:
    """ALiBi slopes as FlashAttention takes them: a float32 tensor ``[Hq]`` (every request) or
    ``[B, Hq]``; a last dim that is not contiguous is copied (the kernel reads it with stride 1,
    rows with ``stride(0)``: 0 for ``[Hq]`` or an expanded ``[B, Hq]``)."""
    if alibi_slopes is None:
        return None
    check_tensor("alibi_slopes", alibi_slopes, dtypes=(torch.float32,))
    if tuple(alibi_slopes.shape) not in ((num_q_heads,), (batch, num_q_heads)):
        raise ValueError(f"alibi_slopes must have shape [{num_q_heads}] (Hq) or [{batch}, {num_q_heads}] (B, Hq), "
                         f"got {list(alibi_slopes.shape)}")
    if alibi_slopes.shape[-1] > 1 and alibi_slopes.stride(-1) != 1:
        alibi_slopes = alibi_slopes.contiguous()
    return alibi_slopes


def _check_heads(q: torch.Tensor, k_name: str, num_kv_heads: int, head_dim: int, head_dim_v: int) -> None:
    """q's head dim equals K's, both head dims are supported (D up to MAX_HEAD_DIM_QK, Dv up to
    MAX_HEAD_DIM), and Hq is a multiple of H_kv."""
    if q.shape[-1] != head_dim:
        raise ValueError(f"q's head dim ({q.shape[-1]}) must equal {k_name}'s ({head_dim})")
    for name, dim, most in (("head dim D", head_dim, MAX_HEAD_DIM_QK), ("value head dim Dv", head_dim_v, MAX_HEAD_DIM)):
        if dim % 8 or not 8 <= dim <= most:
            raise ValueError(f"{name} must be a multiple of 8 from 8 to {most}, got {dim}")
    if q.shape[-2] % num_kv_heads != 0:
        raise ValueError(f"the query heads ({q.shape[-2]}) must be a multiple of the KV heads ({num_kv_heads})")


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


def _launch(q, k, v, *, device, batch, page_table, kv_lens, cu_seqlens_k, max_kv_len, mapping, cu_seqlens_q,
            uniform_q_len, max_q, softmax_scale, sinks, causal, window_size, softcap, k_descale, v_descale,
            num_splits, return_softmax_lse, out, seqused_q=None, alibi_slopes=None):
    """The attention both public functions run once their layout arguments are checked.

    ``q`` is ragged 3-D. ``k``/``v`` are a paged cache ``[pages, P, H_kv, D]`` read through
    ``page_table`` (``cu_seqlens_k`` None), or contiguous ``[total_k, H_kv, D]`` rows read from
    ``cu_seqlens_k[b]`` on (``page_table`` None): the kernel's contiguous-K/V mode. ``kv_lens``
    ``[B]`` int32 are the keys of each request (clamped in the kernel to the table / the slice);
    ``max_kv_len`` bounds them on the host (for the split count only). ``seqused_q`` ``[B]`` int32
    (ragged q only): the rows of each request's slice in use (``flash_attn_varlen_func``).
    ``alibi_slopes``: ``[Hq]`` or ``[B, Hq]`` float32, or None.
    """
    contiguous = page_table is None
    num_q_heads, head_dim = q.shape[1], k.shape[-1]
    num_kv_heads, head_dim_v = k.shape[-2], v.shape[-1]
    group_size = num_q_heads // num_kv_heads
    total_q = q.shape[0]
    page_size = 0 if contiguous else k.shape[1]  # 0: the kernel's contiguous-K/V mode

    # the argument contract (_common): every scalar checked once, here, for both public ops
    left, right = check_window(window_size)
    softcap = check_real(softcap, "softcap", minimum=0.0)
    causal = check_bool(causal, "causal")
    return_softmax_lse = check_bool(return_softmax_lse, "return_softmax_lse")
    softmax_scale = check_real(softmax_scale, "softmax_scale", allow_none=True)
    num_splits = check_int(num_splits, "num_splits", minimum=0)
    if sinks is not None:
        check_tensor("sinks", sinks, dtypes=FLOAT_DTYPES, shape=(num_q_heads,))
        sinks = sinks.contiguous()
    alibi = _as_alibi_slopes(alibi_slopes, batch, num_q_heads)
    k_scale = _as_scale("k_descale", k_descale, batch, num_kv_heads, device)
    v_scale = _as_scale("v_descale", v_descale, batch, num_kv_heads, device)
    if out is None:
        out = torch.empty((total_q, num_q_heads, head_dim_v), dtype=q.dtype, device=device)
    else:
        check_tensor("out", out, dtypes=(q.dtype,), shape=(total_q, num_q_heads, head_dim_v), last_dim_contiguous=True)
    lse = torch.empty((num_q_heads, total_q), dtype=torch.float32, device=device) if return_softmax_lse else None
    if total_q == 0 or batch == 0 or k.numel() == 0:  # no query, or no key anywhere: nothing to launch
        if lse is not None:
            lse.fill_(float("-inf"))
        out.zero_()
        return (out, lse) if return_softmax_lse else out
    scale = head_dim**-0.5 if softmax_scale is None else softmax_scale

    # ---- tiling: (token, head) rows of one KV head's query group ----
    decode_like = max_q is not None and max_q <= 16
    heads_per_block = query_heads_per_block(group_size, max_q)
    num_head_blocks = cdiv(group_size, heads_per_block)

    def query_tiling(block_m: int) -> tuple[int, int, int]:
        """(BLOCK_Q, query programs, tiles per request) for a tile of ``block_m`` rows."""
        if decode_like and next_power_of_2(max_q) * heads_per_block <= block_m:
            block_q = next_power_of_2(max_q)  # every query of a request in one tile: KV read once
        else:
            block_q = max(1, block_m // heads_per_block)
        block_q = max(block_q, 16 // heads_per_block)  # tl.dot needs M >= 16
        if mapping == _SEARCH:
            return block_q, cdiv(total_q, block_q) + batch, 0
        # no request has more rows of q than q has: an absurd max_seqlen_q (2^31 - 1) must not size
        # the grid (a request longer than q is impossible input: its rows past the tiles are NaN)
        tiles = cdiv(min(max_q, total_q), block_q) if max_q else 1
        return block_q, batch * tiles, tiles

    compute_units = _device.compute_units(device)
    _, programs_guess, _ = query_tiling(64)
    work = tune.work_bucket(programs_guess * num_kv_heads * num_head_blocks, compute_units)
    # bucket family: one query per request, a few (drafts: their own tiles), or query-tiled prefill
    # (contiguous K/V: "varlen" prefill buckets, page field 256 - its tiles read contiguous rows
    # like a page larger than any tile; files tuned before varlen had buckets give it their
    # largest page's prefill entry)
    q_kind = ("decode" if max_q == 1 else "draft") if decode_like else ("varlen" if contiguous else "prefill")
    fallback = {"draft": {"q": "decode"}, "varlen": {"q": "prefill"}}.get(q_kind)  # files tuned before those buckets
    config = tune.lookup(
        "paged_attention",
        dict(d=head_dim, dv=head_dim_v, g=next_power_of_2(group_size), p=256 if contiguous else page_size,
             q=q_kind, w=work, dtype=str(k.dtype).replace("torch.", "")),
        _heuristic_config(decode_like, head_dim, work, page_size, max_q, k.dtype in FP8_DTYPES, head_dim_v,
                          q.element_size()),
        device=device,
        fallback=fallback,
        # prefill tiles keep Q and 2-3 stages of K/V tiles in shared memory: one tuned at D = 128
        # can overflow at D = 256 (H100: the tuned 64 x 64 / 3-stage varlen tile needs 237 KB).
        # Decode keeps the nearest entry (that rule there: 0.87-1.51x, experiments/size_fields.txt)
        # (above D = 256 decode too: a D = 256 decode tile at D = 512 may not fit at all)
        no_larger=() if decode_like and max(head_dim, head_dim_v) <= 256 else ("d", "dv"),
    )
    heads_per_block = query_heads_per_block(group_size, max_q, config)  # the config may ask for 2D q / out
    num_head_blocks = cdiv(group_size, heads_per_block)
    block_q, num_q_programs, tiles_per_request = query_tiling(config["BLOCK_M"])

    # ---- KV splits: from shapes only (no host sync); refined per request on the device ----
    if left >= 0:
        max_kv_len = min(max_kv_len, left + block_q + config["BLOCK_N"])
    # output channels a program computes: the whole row, or BLOCK_DV-wide slices of it on as many
    # programs (a config's V split: the score dot repeats on each)
    full_dv = max(16, next_power_of_2(head_dim_v))
    block_dv = min(int(config.get("BLOCK_DV") or full_dv), full_dv)
    num_dv = cdiv(head_dim_v, block_dv)
    programs = num_q_programs * num_kv_heads * num_head_blocks * num_dv
    if num_splits == 0:
        splits = cdiv(config["waves"] * compute_units, programs)
        splits = min(splits, config["max_splits"], cdiv(max_kv_len, config["min_split_tokens"]))
    else:
        splits = min(num_splits, max(1, cdiv(max_kv_len, config["BLOCK_N"])), MAX_GRID_DIM_1)  # grid axis 2
    splits = max(1, splits)
    min_split_tokens = config["min_split_tokens"] if num_splits == 0 else config["BLOCK_N"]
    pad_rows = mapping != _UNIFORM  # rows past cu_seqlens_q[B] get defined values
    # the interpreter's bf16 arithmetic is wrong: bf16 runs in fp32 there (no copy when compiled)
    dest = out
    q, k, v, out = interpreter_float32(q, k, v, out)
    if contiguous:
        k_strides, v_strides = (0, k.stride(0), k.stride(1)), (0, v.stride(0), v.stride(1))
        table_args = (cu_seqlens_k, 0, 0, k.shape[0])  # no page table (a placeholder, never read); k's rows
    else:
        k_strides, v_strides = k.stride()[:3], v.stride()[:3]
        table_args = (page_table, page_table.stride(0), page_table.shape[1], k.shape[0])  # pool: the cache's pages
    # (host descriptors span whole rows: not with a V split)
    # D past MAX_HEAD_DIM: 512-channel tiles and a tail chunk of the score dot (the kernel's D_TAIL)
    d_tail = max(16, next_power_of_2(head_dim - MAX_HEAD_DIM)) if head_dim > MAX_HEAD_DIM else 0
    kv_descriptors = _kv_descriptors(k, v, page_size, config if num_dv == 1 else {**config, "kv_desc": False}, device)
    kv_load = _kv_load(page_size, config, kv_descriptors, (k, v))
    if kv_load == 3:
        _device.ensure_scratch_allocator(device)  # descriptors made on the device (CUDA: global scratch)
    kv_descriptors = kv_descriptors or (None, None)
    lse_arg = lse if lse is not None else out

    def launch_args(partial_out, partial_lse, po_strides, pl_strides, num_kv_splits):
        """The kernel's runtime arguments; partials may be dtypes (a compile without launch)."""
        return (
            q, q.stride(0), q.stride(1),
            k, *k_strides,
            v, *v_strides,
            *kv_descriptors,
            *table_args,
            kv_lens,
            cu_seqlens_q if cu_seqlens_q is not None else kv_lens,
            cu_seqlens_k if cu_seqlens_k is not None else kv_lens,
            seqused_q if seqused_q is not None else kv_lens,
            *((k_scale, *k_scale.stride()) if k_scale is not None else (q, 0, 0)),
            *((v_scale, *v_scale.stride()) if v_scale is not None else (q, 0, 0)),
            sinks if sinks is not None else q,
            *((alibi, alibi.stride(0) if alibi.dim() == 2 else 0) if alibi is not None else (None, None)),
            out, out.stride(0), out.stride(1),
            lse_arg, lse_arg.stride(0) if lse is not None else 0, lse_arg.stride(1) if lse is not None else 0,
            partial_out, *po_strides,
            partial_lse, *pl_strides,
            batch, total_q, num_q_programs, uniform_q_len, tiles_per_request, num_head_blocks,
            group_size, head_dim, head_dim_v,
            scale, float(softcap), left, right,
            num_kv_splits, min_split_tokens,
        )

    # the query programs move to the grid's second axis, which holds fewer
    heads_first = bool(config.get("heads_first", 0)) and num_q_programs + int(pad_rows) <= MAX_GRID_DIM_1
    # compile-time arguments, SPLIT_KV aside (it follows the final split count)
    constexprs = dict(
        Q_MAPPING=mapping,
        PAD_ROWS=pad_rows,
        BLOCK_Q=block_q,
        HEADS_PER_BLOCK=heads_per_block,
        BLOCK_N=config["BLOCK_N"],
        BLOCK_D=MAX_HEAD_DIM if d_tail else max(16, next_power_of_2(head_dim)),  # tl.dot's K is at least 16
        BLOCK_DV=block_dv,
        NUM_DV=num_dv,
        PAGE_SIZE=page_size,
        CAUSAL=bool(causal),
        HAS_SOFTCAP=softcap > 0,
        HAS_SINKS=sinks is not None,
        HAS_K_DESCALE=k_scale is not None,
        HAS_V_DESCALE=v_scale is not None,
        WRITE_LSE=lse is not None,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        KV_LOAD=kv_load,
        HOIST_GATHER=not decode_like,
        SCORE_CHUNK=score_chunk(config, kv_load, head_dim, d_tail),
        INTEL_GPU=_device.backend() == "xpu",  # code-generation choices for Intel's compiler (the kernel says which)
        HAS_SEQUSED_Q=seqused_q is not None,
        PREFETCH_PAGES=bool(config.get("PREFETCH_PAGES", 0)),
        LAUNCH_DEPENDENTS=_device.programmatic_launch(device),
        HEADS_FIRST=heads_first,
        QO_DESC=query_rows_descriptors(kv_load, block_q, heads_per_block, q, out),
        # qk_scale applied inside the softmax's exponent, one FMA a score (a positive factor
        # commutes with the row max; softcap and K descales keep scaled scores). H100 prefill
        # 0.94-0.99x the time, decode unchanged (bench/results/NVIDIA_H100_80GB_HBM3/experiments/
        # scale_in_exp.txt). Not on Intel GPUs: IGC spilled 64-192 B a thread on the PVC varlen and
        # 16-token-page prefill tiles with it (0 without)
        SCALE_IN_EXP=softcap <= 0 and k_scale is None and scale > 0 and _device.backend() != "xpu",
        HAS_ALIBI=alibi is not None,
        **tune.launch_options(config),
        **({"D_TAIL": d_tail} if d_tail else {}),
    )
    if (kv_load == 2 and _device.backend() == "xpu") or kv_load == 3:
        # triton-xpu 3.3's pipeliner asserts on block pointers whose address comes from a loaded
        # page id (shared/notes/xpu_native.md), and Triton 3.6's cannot predicate a descriptor
        # made in the loop ("pipeliner doesn't know how to predicate ttng.tensormap_create"): one stage
        constexprs["num_stages"] = 1

    def split_partials(num_kv_splits: int, where):
        """Each split's normalised output [total_q, Hq, splits, Dv] and LSE [total_q, Hq, splits],
        fp32, on ``where`` ("meta": their strides only)."""
        return (torch.empty((total_q, num_q_heads, num_kv_splits, head_dim_v), dtype=torch.float32, device=where),
                torch.empty((total_q, num_q_heads, num_kv_splits), dtype=torch.float32, device=where))

    if num_splits == 0 and splits > 1:
        # automatic splits fill whole waves of what the device runs at once (the compiled split
        # kernel's occupancy, looked up once per specialisation; unknown on XPU: kept as is). The
        # kernel is compiled at the count before the cut: a count's divisibility may change
        # Triton's integer specialisation of the split strides, not registers or shared memory.
        key = (device, q.dtype, k.dtype, tuple(constexprs.items()))
        if key not in _RESIDENT_PROGRAMS:
            def compile_split_kernel():  # compiled (or fetched from Triton's cache), not launched
                po, pl = split_partials(splits, "meta")
                with device_guard(device):
                    return _paged_attention_kernel.warmup(
                        *launch_args(torch.float32, torch.float32, po.stride()[:3], pl.stride()[:2], splits),
                        grid=(1, 1, 1), SPLIT_KV=True, **constexprs,
                    )
            _RESIDENT_PROGRAMS[key] = _device.resident_programs(compile_split_kernel, device)
        splits = whole_wave_splits(splits, programs, _RESIDENT_PROGRAMS[key])
    split_kv = splits > 1

    if split_kv:
        partial_out, partial_lse = split_partials(splits, device)
        po_strides, pl_strides = partial_out.stride()[:3], partial_lse.stride()[:2]
    else:
        partial_out = partial_lse = out  # placeholders, never touched
        po_strides, pl_strides = (out.stride(0), out.stride(1), 0), (out.stride(0), out.stride(1))

    grid = (num_q_programs + int(pad_rows), num_kv_heads * num_head_blocks * num_dv, splits)
    if heads_first:
        grid = (grid[1], grid[0], splits)
    with device_guard(device):
        _paged_attention_kernel[grid](*launch_args(partial_out, partial_lse, po_strides, pl_strides, splits), SPLIT_KV=split_kv, **constexprs)
        if split_kv:
            combine_splits(partial_out, partial_lse, out, lse.T if lse is not None else None, sinks, compute_units,
                           after_partials_kernel=True)
    if out is not dest:
        dest.copy_(out)
    return (dest, lse) if return_softmax_lse else dest
