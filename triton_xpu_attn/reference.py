"""Plain-PyTorch references for every op of the package: the contract the kernels are held to.

Written for clarity, not speed: loops over requests, float64 arithmetic by default
(``dtype=torch.float32`` on devices without float64). Conventions, shared by all kernels:

* Paged KV caches are ``[num_pages, page_size, H_kv, D]``; page tables are **page-granular**
  (``page_table[b, p]`` = physical page of logical page ``p`` of request ``b``).
* Causal masks and windows are **bottom-right aligned**: query ``t`` of a request with ``q_len``
  queries and ``kv_len`` keys sits at absolute position ``kv_len - q_len + t``.
* ``window_size = (left, right)`` is inclusive: key ``j`` is visible to a query at position ``i``
  iff ``i - left <= j <= i + right`` (``-1`` = unbounded on that side; ``causal`` forces
  ``right = 0``). ``(W, 0)`` therefore sees ``W + 1`` keys.
* Softcap ``cap * tanh(s / cap)`` is applied to the scaled logits **before** masking.
* ALiBi slopes (``[Hq]`` or ``[B, Hq]``) add ``-slope * |i - j|`` to the logit of a query at
  absolute position ``i`` and key ``j``, after the scale and the softcap (FlashAttention's
  ``attn_bias_from_alibi_slopes`` without its causal shortcut); the LSE includes the bias.
* Sinks are per-query-head logits (natural log, not scaled) that join the softmax denominator
  only; the LSE includes them.
* LSE is the natural-log log-sum-exp of the scaled (and capped) logits, ``[Hq, total_q]``.
* A query with no visible key (zero-length sequence, padding row, or a window that excludes
  every key) outputs 0 with LSE ``-inf``, sinks notwithstanding; never NaN.
"""
from __future__ import annotations

import math

import numpy as np
import torch


def _as_float(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(torch.float32).to(dtype) if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else x.to(dtype)


def _descale(scale, b: int, num_kv_heads: int, dtype, device) -> torch.Tensor:
    """Per-KV-head dequant factor for request ``b`` from a scalar or ``[B, H_kv]`` scale."""
    if scale is None:
        return torch.ones(num_kv_heads, dtype=dtype, device=device)
    s = torch.as_tensor(scale, dtype=dtype, device=device)
    if s.numel() == 1:
        return s.reshape(1).expand(num_kv_heads)
    return s.reshape(-1, num_kv_heads)[b]


def gather_paged(cache: torch.Tensor, page_table_row: torch.Tensor, length: int) -> torch.Tensor:
    """Rows ``0..length-1`` of one request from a paged cache ``[num_pages, P, ...]``."""
    page_size = cache.shape[1]
    num_pages = -(-length // page_size)
    pages = page_table_row[:num_pages].long()
    return cache[pages].reshape(num_pages * page_size, *cache.shape[2:])[:length]


def visible_keys(q_len: int, kv_len: int, causal: bool, window_size, device=None) -> torch.Tensor:
    """``[q_len, kv_len]`` bool: which keys each query of one request sees (bottom-right aligned)."""
    left, right = window_size
    if causal:
        right = 0
    pos_q = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    j = torch.arange(kv_len, device=device)[None, :]
    mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= pos_q - left
    if right >= 0:
        mask &= j <= pos_q + right
    return mask


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None = None,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size=(-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    k_descale=None,
    v_descale=None,
    alibi_slopes: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
):
    """Attention of ragged queries over a paged KV cache.

    ``q`` is ``[total_q, Hq, D]`` with ``cu_seqlens_q [B+1]``, or ``[B, S, Hq, D]``.
    Returns ``(out [total_q, Hq, Dv], lse [Hq, total_q])`` in ``dtype``.
    """
    if q.dim() == 4:
        batch, s = q.shape[:2]
        cu_seqlens_q = torch.arange(batch + 1, device=q.device) * s
        q = q.reshape(batch * s, *q.shape[2:])
    total_q, num_q_heads, head_dim = q.shape
    num_kv_heads, head_dim_v = k_cache.shape[2], v_cache.shape[3]
    group = num_q_heads // num_kv_heads
    scale = head_dim**-0.5 if softmax_scale is None else softmax_scale
    device = q.device
    out = torch.zeros(total_q, num_q_heads, head_dim_v, dtype=dtype, device=device)
    lse = torch.full((num_q_heads, total_q), -math.inf, dtype=dtype, device=device)
    cu = cu_seqlens_q.tolist()
    for b in range(len(cu) - 1):
        q0, q_len, kv_len = cu[b], cu[b + 1] - cu[b], int(cache_seqlens[b])
        if q_len == 0 or kv_len == 0:
            continue
        k = _as_float(gather_paged(k_cache, page_table[b], kv_len), dtype)
        v = _as_float(gather_paged(v_cache, page_table[b], kv_len), dtype)
        k = k * _descale(k_descale, b, num_kv_heads, dtype, device)[None, :, None]
        v = v * _descale(v_descale, b, num_kv_heads, dtype, device)[None, :, None]
        k = k.repeat_interleave(group, dim=1)  # [kv_len, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        qb = q[q0 : q0 + q_len].to(dtype)  # [q_len, Hq, D]
        s = torch.einsum("qhd,khd->hqk", qb, k) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        if alibi_slopes is not None:
            slopes = alibi_slopes.to(dtype=dtype, device=device)
            slopes = slopes if slopes.dim() == 1 else slopes[b]
            pos_q = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
            distance = (pos_q - torch.arange(kv_len, device=device)[None, :]).abs().to(dtype)
            s = s - slopes[:, None, None] * distance[None]
        mask = visible_keys(q_len, kv_len, causal, window_size, device)[None]
        s = s.masked_fill(~mask, -math.inf)
        if sinks is not None:
            sink_col = sinks.to(dtype)[:, None, None].expand(num_q_heads, q_len, 1)
            s_full = torch.cat([s, sink_col], dim=-1)
        else:
            s_full = s
        row_lse = torch.logsumexp(s_full, dim=-1)  # [Hq, q_len]
        p = torch.exp(s - row_lse[..., None])
        o = torch.einsum("hqk,khd->qhd", p, v)
        has_key = mask.any(-1)  # [1, q_len]
        row_lse = torch.where(has_key, row_lse, torch.full_like(row_lse, -math.inf))
        o = torch.where(has_key.T[:, :, None], o, torch.zeros_like(o))
        out[q0 : q0 + q_len] = o
        lse[:, q0 : q0 + q_len] = row_lse
    return out, lse


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_k: torch.Tensor | None = None,
    seqused_q: torch.Tensor | None = None,
    **options,
):
    """Attention of ragged queries over ragged contiguous keys (``flash_attn_varlen_func``).

    ``q [total_q, Hq, D]``, ``k [total_k, H_kv, D]``, ``v [total_k, H_kv, Dv]``; request ``b``
    owns rows ``cu_seqlens_k[b]..`` of k/v, of which it uses the first ``seqused_k[b]`` (clamped
    to its slice) or all, and of its query rows the first ``seqused_q[b]`` (clamped likewise;
    masks align to them, the other rows give 0 and LSE -inf) or all. Expressed as
    :func:`paged_attention` over pages of one token with a table pointing at each request's rows,
    so both share one mask and softmax. ``options`` as there; returns
    ``(out [total_q, Hq, Dv], lse [Hq, total_q])``.
    """
    if seqused_q is not None:
        cu_q = [int(x) for x in cu_seqlens_q]
        counts = [max(0, min(int(u), e - s)) for u, s, e in zip(seqused_q, cu_q[:-1], cu_q[1:])]
        rows = torch.tensor([r for s, n in zip(cu_q[:-1], counts) for r in range(s, s + n)], dtype=torch.long)
        used_cu = torch.tensor([0] + torch.tensor(counts, dtype=torch.long).cumsum(0).tolist(), dtype=torch.long)
        out_used, lse_used = varlen_attention(q[rows], k, v, used_cu, cu_seqlens_k, seqused_k, **options)
        out = torch.zeros((q.shape[0], *out_used.shape[1:]), dtype=out_used.dtype)
        lse = torch.full((lse_used.shape[0], q.shape[0]), -math.inf, dtype=lse_used.dtype)
        out[rows] = out_used
        lse[:, rows] = lse_used
        return out, lse
    cu_k = [int(x) for x in cu_seqlens_k]
    slices = [e - s for s, e in zip(cu_k[:-1], cu_k[1:])]
    used = slices if seqused_k is None else [max(0, min(int(u), n)) for u, n in zip(seqused_k, slices)]
    table = torch.zeros(len(slices), max(used, default=0), dtype=torch.long, device=k.device)
    for b, n in enumerate(used):
        table[b, :n] = torch.arange(cu_k[b], cu_k[b] + n, device=k.device)
    return paged_attention(
        q, k[:, None], v[:, None], torch.tensor(used, dtype=torch.long), table, cu_seqlens_q, **options
    )


def merge_state_v2(v_a, s_a, v_b, s_b, dtype: torch.dtype = torch.float64):
    """Merge two attention states (base e): ``v_a, v_b [N, H, Dv]``, ``s_a, s_b [N, H]``.

    Non-finite LSEs count as ``-inf`` (an empty state), whose value is ignored whatever it holds
    (NaN included). Both empty -> ``v = 0``, ``s = -inf``.
    """
    s_a = s_a.to(dtype)
    s_b = s_b.to(dtype)
    s_a = torch.where(torch.isfinite(s_a), s_a, torch.full_like(s_a, -math.inf))
    s_b = torch.where(torch.isfinite(s_b), s_b, torch.full_like(s_b, -math.inf))
    m = torch.maximum(s_a, s_b)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w_a = torch.exp(s_a - m_safe)
    w_b = torch.exp(s_b - m_safe)
    d = w_a + w_b
    d_safe = torch.where(d > 0, d, torch.ones_like(d))
    # an empty state (weight 0) adds nothing whatever its value holds (0 * NaN would be NaN)
    part_a = torch.where(w_a[..., None] > 0, v_a.to(dtype) * w_a[..., None], torch.zeros((), dtype=dtype))
    part_b = torch.where(w_b[..., None] > 0, v_b.to(dtype) * w_b[..., None], torch.zeros((), dtype=dtype))
    v = (part_a + part_b) / d_safe[..., None]
    s = torch.where(d > 0, torch.log(d_safe) + m_safe, torch.full_like(d, -math.inf))
    return v, s


def merge_attn_states(prefix_output, prefix_lse, suffix_output, suffix_lse, prefill_tokens_with_context=None,
                      dtype: torch.dtype = torch.float64):
    """vLLM's ``merge_attn_states``: outputs ``[T, H, D]``, LSEs ``[H, T]`` (heads first). Tokens
    ``[0, prefill_tokens_with_context)`` (all when None) merge as :func:`merge_state_v2`; the rest
    take the suffix as it is. Returns ``(output [T, H, D], lse [H, T])`` before any output scale."""
    t = prefix_output.shape[0]
    rows = t if prefill_tokens_with_context is None else int(prefill_tokens_with_context)
    v, s = merge_state_v2(prefix_output, prefix_lse.T, suffix_output, suffix_lse.T, dtype)
    v[rows:] = suffix_output[rows:].to(dtype)
    s[rows:] = suffix_lse.T[rows:].to(dtype)
    return v, s.T


def merge_state(v_a, s_a, v_b, s_b, dtype: torch.dtype = torch.float64):
    """:func:`merge_state_v2` with base-2 LSEs in and out (sgl-kernel's ``merge_state``, v1)."""
    v, s = merge_state_v2(v_a, s_a.to(dtype) * math.log(2), v_b, s_b.to(dtype) * math.log(2), dtype)
    return v, s / math.log(2)


def normalize_page_table(req_to_token, req_pool_indices, seq_lens, page_size, max_pages=None, full_to_swa=None):
    """Page-granular table from a token-granular ``req_to_token`` (int32 ``[B, max_pages]``):
    ``req_to_token[req_pool_indices][:, ::P][:, :max_pages] // P`` (Python's floor division) on
    every column that expression has, whatever ``seq_lens`` says, and 0 past ``req_to_token``'s
    width. ``full_to_swa`` translates each slot first (index -1 wraps to the last entry, as torch
    indexing does; a slot outside the mapping gives -1). ``seq_lens`` only sizes the default width,
    each length clamped to ``[0, req_to_token.shape[1]]`` (the width sglang's expression has)."""
    seq_lens = [int(x) for x in seq_lens]
    width = req_to_token.shape[1]
    if max_pages is None:
        max_pages = -(-max([min(max(n, 0), width) for n in seq_lens], default=0) // page_size)
    out = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    for b in range(len(seq_lens)):
        row = req_to_token[int(req_pool_indices[b])]
        for p in range(min(-(-width // page_size), max_pages)):
            slot = int(row[p * page_size])
            if full_to_swa is not None:
                index = slot + len(full_to_swa) if slot < 0 else slot
                slot = int(full_to_swa[index]) if 0 <= index < len(full_to_swa) else -1
            out[b, p] = slot // page_size
    return out


def translate_loc_from_full_to_swa(full_to_swa, locs):
    """``full_to_swa[locs]`` as int32 (index -1 reads the mapping's last entry, -1)."""
    return full_to_swa.cpu()[locs.cpu().long()].to(torch.int32)


# ---- local attention virtual batches ----


def make_local_attention_virtual_batches(
    attn_chunk_size, query_start_loc, seq_lens, block_table, page_size, max_virtual_batches=None
):
    """vLLM's host algorithm (numpy, vectorised as vLLM/sglang run it; the benchmark's baseline).

    ``query_start_loc [B+1]`` and ``seq_lens [B]`` are array-likes on the host; ``block_table`` is a
    page-granular ``[B, max_pages]`` torch tensor (any device). Returns ``(seqlens_q_local [V],
    cu_seqlens_q_local [V+1], seqlens_k_local [V])`` as int32 numpy arrays and ``block_table_local
    [V, C // P]`` int32 on ``block_table``'s device (gathered there with index arrays copied from
    the host, as vLLM does). No clamp of the chunk to ``max(seq_lens)`` (sglang's), and a request
    with ``seq_lens == 0`` has 0 keys (vLLM would say ``C``). ``max_virtual_batches = M`` pads the
    outputs to ``M`` virtual batches (lengths 0, ``cu`` at its last value, table rows 0) or keeps
    only the first ``M`` when ``V > M``.
    """
    C, P = int(attn_chunk_size), int(page_size)
    assert C % P == 0, "attn_chunk_size must be a multiple of page_size"
    qsl = np.asarray(query_start_loc, dtype=np.int64)
    seq = np.asarray(seq_lens, dtype=np.int64)
    q = qsl[1:] - qsl[:-1]
    first = np.minimum(C - (seq - q) % C, q)
    last_k = np.where(seq > 0, C + seq % -C, 0)  # keys in the last chunk, 1..C (0 without keys)
    nblk = 1 + -(-(q - first) // C)
    cu_blocks = np.cumsum(nblk)
    V = int(cu_blocks[-1]) if len(nblk) else 0
    a = np.arange(V) - np.repeat(cu_blocks - nblk, nblk)  # index within the request
    r = np.repeat(nblk, nblk) - a - 1  # index from the request's end
    seqlens_q = np.where(a == 0, np.repeat(first, nblk), np.minimum(np.repeat(q - first, nblk) - C * (a - 1), C))
    cu_q = np.concatenate([[0], np.cumsum(seqlens_q)])
    seqlens_k = np.full(V, C, dtype=np.int64)
    seqlens_k[cu_blocks - 1] = last_k
    k_start = np.repeat(seq, nblk) - (r * C + np.repeat(last_k, nblk))  # absolute, a multiple of C
    pages_per_chunk = C // P
    max_pages = block_table.shape[1]
    cols = (k_start // P)[:, None] + np.arange(pages_per_chunk)[None, :]
    cols = np.clip(cols, 0, max(max_pages - 1, 0)).reshape(-1)
    rows = np.repeat(np.arange(len(nblk)), nblk * pages_per_chunk)
    device = block_table.device
    if max_pages == 0:
        table = torch.zeros(V, pages_per_chunk, dtype=torch.int32, device=device)
    else:
        index_rows = torch.from_numpy(rows).to(device)
        index_cols = torch.from_numpy(cols).to(device)
        table = block_table[index_rows, index_cols].view(V, pages_per_chunk).to(torch.int32)
    if max_virtual_batches is not None:
        M = int(max_virtual_batches)
        pad = max(M - V, 0)
        seqlens_q = np.concatenate([seqlens_q[:M], np.zeros(pad, dtype=np.int64)])
        seqlens_k = np.concatenate([seqlens_k[:M], np.zeros(pad, dtype=np.int64)])
        cu_q = np.concatenate([cu_q[: M + 1], np.full(pad, cu_q[-1], dtype=np.int64)])
        table = torch.cat([table[:M], torch.zeros(pad, pages_per_chunk, dtype=torch.int32, device=device)])
    return seqlens_q.astype(np.int32), cu_q.astype(np.int32), seqlens_k.astype(np.int32), table


def chunked_local_attention(q, k_cache, v_cache, query_start_loc, seq_lens, page_table, attn_chunk_size,
                            *, softmax_scale=None, dtype=torch.float64):
    """Chunked local attention computed directly (no virtual batches): query ``t`` of request ``b``
    sits at absolute position ``i = seq_lens[b] - q_len + t`` and attends keys
    ``[floor(i / C) * C, i]``. Same layouts as :func:`paged_attention`; returns ``[total_q, Hq, Dv]``."""
    total_q, num_q_heads, head_dim = q.shape
    group = num_q_heads // k_cache.shape[2]
    scale = head_dim**-0.5 if softmax_scale is None else softmax_scale
    out = torch.zeros(total_q, num_q_heads, v_cache.shape[3], dtype=dtype, device=q.device)
    cu = [int(x) for x in query_start_loc]
    C = int(attn_chunk_size)
    for b in range(len(cu) - 1):
        q0, q_len, kv_len = cu[b], cu[b + 1] - cu[b], int(seq_lens[b])
        if q_len == 0:
            continue
        k = _as_float(gather_paged(k_cache, page_table[b], kv_len), dtype).repeat_interleave(group, dim=1)
        v = _as_float(gather_paged(v_cache, page_table[b], kv_len), dtype).repeat_interleave(group, dim=1)
        pos = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)  # absolute query positions
        j = torch.arange(kv_len, device=q.device)[None, :]
        mask = (j <= pos) & (j >= torch.div(pos, C, rounding_mode="floor") * C)
        s = torch.einsum("qhd,khd->hqk", q[q0 : q0 + q_len].to(dtype), k) * scale
        p = torch.softmax(s.masked_fill(~mask[None], -math.inf), dim=-1)
        out[q0 : q0 + q_len] = torch.einsum("hqk,khd->qhd", p, v)
    return out


# ---- SWA speculative page table ----


def prepare_swa_spec_page_table(
    page_table_dst, page_table_a, page_table_b, seq_len_a, seq_len_b, num_draft_tokens, seq_start_a=None, full_to_swa=None
):
    """Torch-indexing reference of :func:`triton_xpu_attn.prepare_swa_spec_page_table`; returns a
    new tensor (a copy of ``page_table_dst`` with the produced columns written), on its device.

    Row ``m`` (parent ``r = m // ndt``): ``dst[m, :la] = A[r, s : s + la]``,
    ``dst[m, la : la + lb] = B[m, :lb]``, later columns unchanged. ``seq_len_a`` / ``seq_start_a``
    are per request (``[B]``) or per row (``[M]``). Reads past a table's width give 0 (not
    translated); negative lengths/starts count as 0; columns past dst's width are dropped. With
    ``full_to_swa`` each copied slot ``x`` becomes ``full_to_swa[x]`` (-1 wraps to the last entry;
    outside the mapping -> -1).
    """
    dst = page_table_dst.clone()
    rows, width = dst.shape
    if rows == 0 or width == 0:
        return dst
    device = dst.device

    def per_row(t):
        t = torch.as_tensor(t, device=device).long().clamp(min=0)
        return t if t.numel() == rows else t.repeat_interleave(num_draft_tokens)

    la = per_row(seq_len_a)[:, None]
    lb = per_row(seq_len_b)[:, None]
    start = per_row(seq_start_a)[:, None] if seq_start_a is not None else torch.zeros_like(la)
    m = torch.arange(rows, device=device)[:, None]
    r = m // num_draft_tokens
    cols = torch.arange(width, device=device)[None, :]
    produced = cols < la + lb
    from_a = produced & (cols < la)
    from_b = produced & (cols >= la)
    a_col, b_col = start + cols, cols - la
    len_a, len_b = page_table_a.shape[1], page_table_b.shape[1]
    a_ok = from_a & (a_col < len_a)
    b_ok = from_b & (b_col < len_b)
    slot = torch.zeros(rows, width, dtype=torch.int64, device=device)
    if len_a:
        slot = torch.where(a_ok, page_table_a.long()[r, a_col.clamp(max=len_a - 1)], slot)
    if len_b:
        slot = torch.where(b_ok, page_table_b.long()[m, b_col.clamp(0, len_b - 1)], slot)
    if full_to_swa is not None:
        mapping = full_to_swa.to(device).long()
        n = mapping.numel()
        idx = torch.where(slot < 0, slot + n, slot)
        inside = (idx >= 0) & (idx < n)
        translated = torch.where(inside, mapping[idx.clamp(0, n - 1)], torch.full_like(idx, -1))
        slot = torch.where(a_ok | b_ok, translated, slot)
    dst[produced] = slot[produced].to(dst.dtype)
    return dst


# ---- MLA decode ----


def mla_decode(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_c_and_k_pe_cache: torch.Tensor,
    seq_lens,
    page_table: torch.Tensor,
    sm_scale: float,
    kv_scale=None,
    dtype: torch.dtype = torch.float64,
    causal: bool = True,
):
    """Multi-head latent attention decode over a paged latent cache.

    ``q_nope [B, H, R]`` or ``[B, S, H, R]``, ``q_pe [B, (S,) H, Dr]``; cache
    ``[num_pages, P, R + Dr]`` or ``[num_pages, P, 1, R + Dr]``: K = the whole row, V = its first R
    channels. Query token ``t`` of ``S`` sees keys ``j <= seq_len - S + t`` (all keys when not
    ``causal``). ``kv_scale``
    multiplies the (dequantised) cache. Returns ``(out [B, (S,) H, R], lse [B, (S,) H])`` in
    ``dtype``; a query without visible keys gives 0 and LSE ``-inf``.
    """
    squeeze = q_nope.dim() == 3
    if squeeze:
        q_nope, q_pe = q_nope[:, None], q_pe[:, None]
    batch, s_q, num_heads, r = q_nope.shape
    cache = kv_c_and_k_pe_cache
    if cache.dim() == 4:
        cache = cache[:, :, 0]
    device = q_nope.device
    scale = 1.0 if kv_scale is None else float(torch.as_tensor(kv_scale).reshape(-1)[0])
    out = torch.zeros(batch, s_q, num_heads, r, dtype=dtype, device=device)
    lse = torch.full((batch, s_q, num_heads), -math.inf, dtype=dtype, device=device)
    for b in range(batch):
        kv_len = int(seq_lens[b])
        if kv_len <= 0:
            continue
        kv = _as_float(gather_paged(cache, page_table[b], kv_len), dtype) * scale  # [kv_len, R + Dr]
        q = torch.cat([q_nope[b], q_pe[b]], dim=-1).to(dtype)  # [S, H, R + Dr]
        logits = torch.einsum("thd,kd->thk", q, kv) * sm_scale
        mask = visible_keys(s_q, kv_len, causal, (-1, -1), device)[:, None, :]  # [S, 1, kv_len]
        logits = logits.masked_fill(~mask, -math.inf)
        row_lse = torch.logsumexp(logits, dim=-1)  # [S, H]
        has_key = mask.any(-1)  # [S, 1]
        p = torch.exp(logits - torch.where(has_key, row_lse, torch.zeros_like(row_lse))[..., None])
        out[b] = torch.where(has_key[..., None], torch.einsum("thk,kd->thd", p, kv[:, :r]), torch.zeros(()).to(dtype))
        lse[b] = torch.where(has_key, row_lse, torch.full_like(row_lse, -math.inf))
    if squeeze:
        out, lse = out[:, 0], lse[:, 0]
    return out, lse


# ---- MLA prefill ----


def mla_prefill(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_c_and_k_pe_cache: torch.Tensor,
    cu_seqlens_q,
    seq_lens_k,
    page_table: torch.Tensor,
    sm_scale: float,
    causal: bool = True,
    kv_scale=None,
    dtype: torch.dtype = torch.float64,
):
    """Multi-head latent attention of ragged queries over a paged latent cache: request ``b`` is
    :func:`mla_decode` of its ``q_len = cu_seqlens_q[b+1] - cu_seqlens_q[b]`` queries
    (``q_nope [total_q, H, R]``, ``q_pe [total_q, H, Dr]``) over its ``seq_lens_k[b]`` keys, so query
    ``t`` sees keys ``j <= seq_lens_k[b] - q_len + t`` (all keys when not ``causal``). Returns
    ``(out [total_q, H, R], lse [total_q, H])``; rows past ``cu_seqlens_q[B]`` give 0 and ``-inf``.
    """
    total_q, num_heads, r = q_nope.shape
    out = torch.zeros(total_q, num_heads, r, dtype=dtype, device=q_nope.device)
    lse = torch.full((total_q, num_heads), -math.inf, dtype=dtype, device=q_nope.device)
    cu = [int(x) for x in cu_seqlens_q]
    for b in range(len(cu) - 1):
        q0, q1 = cu[b], cu[b + 1]
        if q1 == q0:
            continue
        o, s = mla_decode(q_nope[None, q0:q1], q_pe[None, q0:q1], kv_c_and_k_pe_cache, [int(seq_lens_k[b])],
                          page_table[b : b + 1], sm_scale, kv_scale=kv_scale, dtype=dtype, causal=causal)
        out[q0:q1], lse[q0:q1] = o[0], s[0]
    return out, lse


# ---- DeepSeek sparse attention (DSA) prefill ----


def mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink=None,
    topk_length=None,
    dtype: torch.dtype = torch.float64,
):
    """Sparse attention of each query token over the rows of ``kv`` its index list selects
    (FlashMLA's ``flash_mla_sparse_fwd``, as its ``tests/ref.py`` defines it).

    ``q [s_q, h_q, d_qk]``, ``kv [s_kv, h_kv, d_qk]``, ``indices [s_q, h_kv, topk]``. Query head
    ``h`` reads KV head ``h // (h_q // h_kv)``. Entry ``i`` of token ``t`` counts iff
    ``i < topk_length[t]`` (all entries without ``topk_length``) and its index lies in
    ``[0, s_kv)``; an index listed twice counts twice. Over the counted entries: logits
    ``z = sm_scale * q . kv_row`` (all ``d_qk`` channels), ``max_logits = max z``,
    ``lse = logsumexp z`` (natural log), ``out = softmax(z) @ kv_rows[:, :d_v]``, scaled by
    ``exp(lse) / (exp(lse) + exp(attn_sink[h]))`` when a sink is given (the sink changes neither
    ``max_logits`` nor ``lse``). A token with no counted entry gives out 0, ``max_logits`` -inf and
    ``lse`` +inf. Only the selected rows of ``kv`` are read. Returns ``(out [s_q, h_q, d_v],
    max_logits [s_q, h_q], lse [s_q, h_q])`` in ``dtype``.
    """
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv = kv.shape[0], kv.shape[1]
    topk = indices.shape[-1]
    group = h_q // h_kv
    device = q.device
    out = torch.zeros(s_q, h_q, d_v, dtype=dtype, device=device)
    max_logits = torch.full((s_q, h_q), -math.inf, dtype=dtype, device=device)
    lse = torch.full((s_q, h_q), math.inf, dtype=dtype, device=device)
    for t in range(s_q):
        n = topk if topk_length is None else min(max(int(topk_length[t]), 0), topk)
        for g in range(h_kv):
            chosen = [int(i) for i in indices[t, g, :n] if 0 <= int(i) < s_kv]
            if not chosen:
                continue
            rows = kv[torch.tensor(chosen, dtype=torch.long, device=kv.device), g].to(dtype)  # [n, d_qk]
            heads = slice(g * group, (g + 1) * group)
            z = (q[t, heads].to(dtype) @ rows.T) * sm_scale  # [group, n]
            row_lse = torch.logsumexp(z, dim=-1)
            o = torch.softmax(z, dim=-1) @ rows[:, :d_v]
            if attn_sink is not None:
                # exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink): 0 for a +inf sink, 1 for -inf
                o = o * torch.sigmoid(row_lse - attn_sink[heads].to(dtype))[:, None]
            out[t, heads] = o
            max_logits[t, heads] = z.max(dim=-1).values
            lse[t, heads] = row_lse
    return out, max_logits, lse


# ---- DeepSeek sparse attention (DSA) indexer logits ----


def _fp8_values(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp8 e4m3 values (a ``uint8`` tensor is taken as their bytes) in ``dtype``, exactly."""
    if t.dtype == torch.uint8:
        t = t.view(torch.float8_e4m3fn)
    return t.float().to(dtype)


def fp8_mqa_logits(q, k, k_scale, weights, ks, ke, clean_logits=False, dtype: torch.dtype = torch.float64):
    """DeepGEMM's ``fp8_mqa_logits``: ``[Nq, Nk]`` logits ``k_scale[j] * sum_h relu(q[i, h] . k[j])
    * weights[i, h]`` for ``ks[i] <= j < ke[i]``, 0 elsewhere (``-inf`` with ``clean_logits``).
    ``q [Nq, H, D]``, ``k [Nk, D]`` fp8 e4m3 (or uint8 bytes), ``k_scale [Nk]``, ``weights [Nq, H]``;
    unseen positions get the fill value whatever ``k`` / ``k_scale`` hold there."""
    qd, kd = _fp8_values(q, dtype), _fp8_values(k, dtype)
    dots = torch.einsum("ihd,jd->ihj", qd, kd).clamp_min(0)
    logits = (dots * weights.to(dtype)[:, :, None]).sum(dim=1) * k_scale.reshape(-1).to(dtype)[None, :]
    j = torch.arange(kd.shape[0], device=kd.device)[None, :]
    seen = (j >= ks.long()[:, None]) & (j < ke.long()[:, None])
    return torch.where(seen, logits, torch.tensor(-math.inf if clean_logits else 0.0, dtype=dtype, device=kd.device))


def paged_indexer_keys(kv_cache: torch.Tensor, kv_layout: str = "page"):
    """A paged indexer cache ``[pages, page_size, 1, D + 4]`` (bytes) as ``(keys [pages,
    page_size, D]`` fp8 bytes, ``scales [pages, page_size]`` fp32): ``kv_layout="page"`` holds a
    page's keys, then its scales (DeepGEMM); ``"token"`` each token's key bytes, then its scale."""
    pages, page_size, _, width = kv_cache.shape
    d = width - 4
    raw = kv_cache.view(torch.uint8).reshape(pages, page_size * width)
    if kv_layout == "page":
        keys = raw[:, : page_size * d].reshape(pages, page_size, d)
        scales = raw[:, page_size * d:].contiguous().view(torch.float32).reshape(pages, page_size)
    else:
        tokens = raw.reshape(pages, page_size, width)
        keys = tokens[:, :, :d]
        scales = tokens[:, :, d:].contiguous().view(torch.float32).reshape(pages, page_size)
    return keys, scales


def fp8_paged_mqa_logits(q, kv_cache, weights, seq_lens, block_tables, max_seq_len, clean_logits=False,
                         kv_layout: str = "page", dtype: torch.dtype = torch.float64):
    """DeepGEMM's ``fp8_paged_mqa_logits``: ``[B * next_n, max_seq_len]`` logits. Row ``b * next_n
    + r`` sees the positions ``j < seq_lens[b] - next_n + r + 1`` (``seq_lens [B]`` or ``[B, 1]``)
    or ``j < seq_lens[b, r]`` (``[B, next_n]``), within what ``block_tables`` covers and on a page
    id inside the pool; there ``k_scale[j] * sum_h relu(q[b, r, h] . k[j]) * weights[b * next_n +
    r, h]``, elsewhere 0 (``-inf`` with ``clean_logits``). Only the pages a seen position names are
    read."""
    if q.dim() == 3:
        q = q.unsqueeze(1)
    batch, next_n, _, _ = q.shape
    keys, scales = paged_indexer_keys(kv_cache, kv_layout)
    pages, page_size = scales.shape
    width = block_tables.shape[1]
    fill = -math.inf if clean_logits else 0.0
    out = torch.full((batch * next_n, max_seq_len), fill, dtype=dtype)
    qd = _fp8_values(q.cpu(), dtype)
    w = weights.cpu().to(dtype)
    lens = seq_lens.cpu().long()
    table = block_tables.cpu().long()
    keys, scales = keys.cpu(), scales.cpu()
    for b in range(batch):
        for r in range(next_n):
            if lens.dim() == 2 and lens.shape[1] == next_n and next_n > 1:
                limit = int(lens[b, r])
            else:
                limit = int(lens.reshape(batch)[b]) - next_n + r + 1
            limit = min(limit, width * page_size, max_seq_len)
            row = b * next_n + r
            j = torch.arange(max(limit, 0))
            page = table[b, j // page_size]
            j, page = j[(page >= 0) & (page < pages)], page[(page >= 0) & (page < pages)]
            kj = _fp8_values(keys[page, j % page_size], dtype)  # [n, D]: only the pages named
            dots = (kj @ qd[b, r].T).clamp_min(0)  # [n, H]
            out[row, j] = (dots * w[row][None, :]).sum(dim=1) * scales[page, j % page_size].to(dtype)
    return out
# ---- DeepSeek sparse attention (DSA) decode over paged caches ----


def _e4m3(byte_values: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn bytes (any integer tensor of 0..255) as float64, from the bit fields."""
    b = byte_values.long()
    e, m = (b >> 3) & 15, (b & 7).double()
    v = torch.where(e == 0, m * 2.0**-9, (1 + m / 8) * torch.pow(2.0, (e - 7).double()))
    v = torch.where((b & 127) == 127, torch.full_like(v, math.nan), v)
    return torch.where(b >= 128, -v, v)


def dequantize_fp8_kv_cache(k_cache: torch.Tensor) -> torch.Tensor:
    """A packed fp8 sparse-decode cache ``[num_pages, page_size, 1, 584 | 656]`` (DeepSeek-V4 pages
    / DeepSeek-V3.2 records, as ``flash_mla_with_kvcache`` reads them) as float64 rows
    ``[num_pages, page_size, 512 | 576]``.

    V4 (584): per page ``k_cache.stride(0)`` bytes; token ``t``'s record at byte ``t * 576``: 448
    e4m3 channels then 64 bf16 channels; its UE8M0 scales (``2^(e - 127)``, channel ``c`` < 448
    uses scale ``c // 64``) at byte ``page_size * 576 + t * 8``. V3.2 (656): token ``t`` at
    ``t * stride(1)``: 512 e4m3 channels, 4 fp32 scales (channel ``c`` uses ``c // 128``), 64 bf16.
    """
    num_pages, page_size, _, width = k_cache.shape
    raw = k_cache.view(torch.uint8)
    flat = torch.as_strided(raw, (raw.untyped_storage().nbytes() - raw.storage_offset(),), (1,)).cpu()
    out = torch.empty(num_pages, page_size, 512 if width == 584 else 576, dtype=torch.float64)
    for p in range(num_pages):
        for t in range(page_size):
            if width == 584:
                rec = flat[p * raw.stride(0) + t * 576:][:576]
                scales = flat[p * raw.stride(0) + page_size * 576 + t * 8:][:7].long()
                scale = torch.where(scales == 255, math.nan, torch.pow(2.0, (scales - 127).double()))
                out[p, t, :448] = _e4m3(rec[:448]) * scale.repeat_interleave(64)
                out[p, t, 448:] = rec[448:576].clone().view(torch.bfloat16).double()
            else:
                rec = flat[p * raw.stride(0) + t * raw.stride(1):][:656]
                scale = rec[512:528].clone().view(torch.float32).double()
                out[p, t, :512] = _e4m3(rec[:512]) * scale.repeat_interleave(128)
                out[p, t, 512:] = rec[528:656].clone().view(torch.bfloat16).double()
    return out


def mla_sparse_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    head_dim_v: int = 512,
    softmax_scale: float | None = None,
    is_fp8_kvcache: bool = False,
    attn_sink=None,
    extra_k_cache=None,
    extra_indices=None,
    topk_length=None,
    extra_topk_length=None,
    dtype: torch.dtype = torch.float64,
):
    """Sparse MLA decode over paged caches (FlashMLA's ``flash_mla_with_kvcache`` with ``indices``,
    as its ``tests/ref.py`` defines it).

    ``q [B, s_q, h_q, d_qk]``; ``k_cache [num_pages, page_size, 1, d]`` (rows of ``d_qk`` channels,
    or a packed fp8 cache: :func:`dequantize_fp8_kv_cache`); ``indices [B, s_q, topk]``: token
    ``page * page_size + slot``. Entry ``i`` of ``(b, s)`` counts iff ``i < topk_length[b]`` and its
    index lies in ``[0, num_pages * page_size)``; likewise the extra cache's. Over all counted
    tokens: ``z = softmax_scale * q . row``, ``lse = logsumexp z``, ``out = softmax(z) @
    rows[:, :head_dim_v] * sigmoid(lse - attn_sink[h])``; no counted entry: out 0, lse +inf.
    Returns ``(out [B, s_q, h_q, head_dim_v], lse [B, h_q, s_q])`` in ``dtype``.
    """
    B, s_q, h_q, d_qk = q.shape
    scale = d_qk**-0.5 if softmax_scale is None else softmax_scale

    def rows_of(cache):
        if is_fp8_kvcache:
            r = dequantize_fp8_kv_cache(cache)
        else:
            r = cache[:, :, 0].cpu().to(torch.float64)
        return r.reshape(-1, r.shape[-1])

    lists = [(rows_of(k_cache), indices.cpu(), topk_length)]
    if extra_k_cache is not None:
        lists.append((rows_of(extra_k_cache), extra_indices.cpu(), extra_topk_length))
    out = torch.zeros(B, s_q, h_q, head_dim_v, dtype=dtype)
    lse = torch.full((B, h_q, s_q), math.inf, dtype=dtype)
    for b in range(B):
        for s in range(s_q):
            chosen = []
            for rows, idx, lengths in lists:
                n = idx.shape[-1] if lengths is None else min(max(int(lengths[b]), 0), idx.shape[-1])
                chosen += [rows[int(i)] for i in idx[b, s, :n] if 0 <= int(i) < rows.shape[0]]
            if not chosen:
                continue
            kv = torch.stack(chosen).to(dtype)
            z = (q[b, s].cpu().to(dtype) @ kv.T) * scale  # [h_q, n]
            row_lse = torch.logsumexp(z, dim=-1)
            o = torch.softmax(z, dim=-1) @ kv[:, :head_dim_v]
            if attn_sink is not None:
                o = o * torch.sigmoid(row_lse - attn_sink.cpu().to(dtype))[:, None]
            out[b, s] = o
            lse[b, :, s] = row_lse
    return out, lse
# ---- DeepSeek sparse attention (DSA) indexer top-k ----


def _wrap_int32(values: np.ndarray) -> np.ndarray:
    """int64 values as int32 arithmetic leaves them (two's complement wrap)."""
    return ((values.astype(np.int64) + 2**31) % 2**32 - 2**31).astype(np.int64)


def topk_select(score, lengths, topk: int, row_starts=None) -> torch.Tensor:
    """``[B, topk]`` int64: the positions each row selects (the contract of the ``fast_topk`` family
    and ``topk_transform_512``), relative to the row's start.

    Row ``b``'s section is ``score[b, s : s + n]``, ``s = row_starts[b]`` (0 without) clipped to
    ``[0, W]``, ``n = lengths[b]`` clipped to ``[0, W - s]``. ``n <= topk``: ``0 .. n-1`` then -1.
    Else the ``topk`` positions first in the order (score descending, position ascending), with
    ``+0 == -0`` and NaN after every number; returned in ascending order. Scores compare exactly as
    fp32 values (float64 holds them exactly).
    """
    values = score.detach().to(torch.float64).cpu().numpy()
    rows, width = values.shape
    lens = np.asarray(lengths.detach().cpu().reshape(-1), dtype=np.int64)
    starts = np.zeros(rows, np.int64) if row_starts is None else np.asarray(row_starts.detach().cpu(), dtype=np.int64)
    out = np.full((rows, topk), -1, dtype=np.int64)
    for b in range(rows):
        s = min(max(int(starts[b]), 0), width)
        n = min(max(int(lens[b]), 0), width - s)
        if n <= topk:
            out[b, :n] = np.arange(n)
            continue
        v = values[b, s: s + n]
        nan = np.isnan(v)
        # lexsort: the last key is the primary one (NaN last, then larger first, then lower position)
        order = np.lexsort((np.arange(n), -np.where(nan, 0.0, v) + 0.0, nan))
        out[b] = np.sort(order[:topk])
    return torch.from_numpy(out)


def _request_rows(cu_seqlens_q, rows: int, direct: bool) -> np.ndarray:
    """The request each score row reads its page-table row from (``fast_topk_transform_fused``)."""
    if direct:
        return np.arange(rows)
    cu = np.asarray(cu_seqlens_q.detach().cpu(), dtype=np.int64)
    n_req = len(cu) - 1
    below = (cu[None, 1:] <= np.arange(rows)[:, None]).sum(axis=1)
    return np.where(below < n_req, below, 0)


def topk_transform_page_table(score, lengths, page_table_size_1, cu_seqlens_q, topk: int,
                              row_starts=None) -> torch.Tensor:
    """``fast_topk_transform_fused``: each selected position ``j`` of row ``b`` (``topk_select``)
    replaced by ``page_table_size_1[r, j]``, ``r`` the request of row ``b``: ``b`` itself when
    ``row_starts`` is None and there are as many requests as rows, else the ``r`` with
    ``cu_seqlens_q[r] <= b < cu_seqlens_q[r + 1]`` (``#{i >= 1 : cu_seqlens_q[i] <= b}``; 0 for a
    row inside no request). A position past the table's columns, or padding, gives -1."""
    pos = topk_select(score, lengths, topk, row_starts).numpy()
    table = np.asarray(page_table_size_1.detach().cpu(), dtype=np.int64)
    n_req, cols = table.shape
    rows = pos.shape[0]
    req = _request_rows(cu_seqlens_q, rows, row_starts is None and n_req == rows)
    out = np.full_like(pos, -1)
    for b in range(rows):
        ok = (pos[b] >= 0) & (pos[b] < cols) & (req[b] < n_req)
        out[b, ok] = table[req[b], pos[b, ok]]
    return torch.from_numpy(out)


def topk_transform_ragged(score, lengths, topk_indices_offset, topk: int, row_starts=None) -> torch.Tensor:
    """``fast_topk_transform_ragged_fused``: each selected position plus the row's offset (int32
    arithmetic, wrapping), -1 for padding."""
    pos = topk_select(score, lengths, topk, row_starts).numpy()
    off = np.asarray(topk_indices_offset.detach().cpu(), dtype=np.int64)[:, None]
    return torch.from_numpy(np.where(pos >= 0, _wrap_int32(pos + off), -1))


def topk_transform_paged(scores, seq_lens, page_tables, topk: int, page_size: int):
    """``topk_transform_512``: ``(page_indices, raw_indices)``, each ``[B, topk]`` int64. A selected
    position ``j`` (``topk_select`` over ``scores[b, :seq_lens[b]]``) gives the slot
    ``(page_tables[b, j // page_size] << log2(page_size)) | (j % page_size)`` in int32 arithmetic
    (-1 when its page lies past the table's columns) and the raw index ``j``; padding -1 in both."""
    pos = topk_select(scores, seq_lens.reshape(-1), topk).numpy()
    table = np.asarray(page_tables.detach().cpu(), dtype=np.int64)
    bits = page_size.bit_length() - 1
    out = np.full_like(pos, -1)
    for b in range(pos.shape[0]):
        page = np.where(pos[b] >= 0, pos[b] >> bits, 0)
        ok = (pos[b] >= 0) & (page < table.shape[1])
        slot = (table[b, page[ok]] << bits) | (pos[b, ok] & (page_size - 1))
        out[b, ok] = _wrap_int32(slot)
    return torch.from_numpy(out), torch.from_numpy(pos.copy())


# ---- KV-cache writes and reads (vLLM's _C_cache_ops) ----


def _fp8_store(x: torch.Tensor, scale, fmt) -> torch.Tensor:
    """``x`` as stored in a cache of dtype ``fmt``: with fp8 (``scale`` given) ``x / scale``
    computed in fp32 (the kernels' arithmetic; float64 would round differently before the fp8
    rounding), saturated to the fp8 range, rounded to nearest even; else cast to ``fmt``."""
    if scale is None:
        return x.to(fmt)
    q = x.to(torch.float32) / torch.as_tensor(scale, dtype=torch.float32, device=x.device).reshape(())
    fp8_max = torch.finfo(fmt).max
    return q.clamp(-fp8_max, fp8_max).to(fmt)


def _slot_writes(slot_mapping, num_slots: int):
    """(token, block, offset) of every token whose slot lies in ``[0, num_slots)``; others write nothing."""
    return [(t, int(s)) for t, s in enumerate(slot_mapping.tolist()) if 0 <= s < num_slots]


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, k_scale=None, v_scale=None):
    """New ``(key_cache, value_cache)`` (copies) after vLLM's ``reshape_and_cache_flash``: token
    ``t``'s key / value at slot ``s = slot_mapping[t]`` when ``0 <= s < num_blocks * block_size``
    (quantised with ``k_scale`` / ``v_scale`` when given; the caches' dtype is the stored one)."""
    k_out, v_out = key_cache.clone(), value_cache.clone()
    num_blocks, block_size = key_cache.shape[:2]
    for t, s in _slot_writes(slot_mapping, num_blocks * block_size):
        k_out[s // block_size, s % block_size] = _fp8_store(key[t], k_scale, key_cache.dtype)
        v_out[s // block_size, s % block_size] = _fp8_store(value[t], v_scale, value_cache.dtype)
    return k_out, v_out


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, scale=None):
    """New ``kv_cache`` (a copy) after vLLM's ``concat_and_cache_mla``: ``cat(kv_c[t], k_pe[t])`` at
    each in-range slot (quantised with ``scale`` when given)."""
    out = kv_cache.clone()
    num_blocks, block_size = kv_cache.shape[:2]
    for t, s in _slot_writes(slot_mapping, num_blocks * block_size):
        out[s // block_size, s % block_size] = _fp8_store(torch.cat([kv_c[t], k_pe[t]]), scale, kv_cache.dtype)
    return out


def gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, batch_size: int, scale=None,
                                   seq_starts=None, dtype=torch.float64):
    """New ``dst`` (a copy) after vLLM's ``gather_and_maybe_dequant_cache``: row ``cu[b] + i`` of
    request ``b`` takes entry ``pos = seq_starts[b] + i`` of the request's blocks, times ``scale``
    (fp8, computed in ``dtype``), cast to ``dst``'s dtype; 0 where ``pos`` is negative, past the
    table's width or names a block outside the cache; rows past ``dst`` or of no request untouched.
    ``cu_seq_lens`` non-decreasing."""
    out = dst.clone()
    num_blocks, block_size = src_cache.shape[:2]
    cu = cu_seq_lens.tolist()
    starts = [0] * batch_size if seq_starts is None else seq_starts.tolist()
    table = block_table.tolist()
    factor = 1.0 if scale is None else float(torch.as_tensor(scale).reshape(()))
    for b in range(batch_size):
        for t in range(max(cu[b], 0), min(cu[b + 1], dst.shape[0])):
            pos = t - cu[b] + starts[b]
            col = pos // block_size if pos >= 0 else -1
            blk = table[b][col] if 0 <= col < len(table[b]) else -1
            if 0 <= blk < num_blocks:
                entry = src_cache[blk, pos % block_size].to(torch.float32).to(dtype)
                out[t] = (entry * factor if scale is not None else entry).to(dst.dtype)
            else:
                out[t] = 0
    return out


# ---- AppendKV of flash_attn_with_kvcache (FlashAttention-3's contract) ----


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions, interleaved: bool,
                 dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``x [n, H, D]`` (in ``dtype``) with its first ``2 * cos.shape[1]`` channels rotated, row ``r``
    at ``positions[r]``: pairs ``(2j, 2j+1)`` (interleaved) or ``(j, j + rotary_dim / 2)``; a
    position outside ``[0, cos.shape[0])`` is not rotated."""
    x = _as_float(x, dtype)
    half = cos.shape[1]
    pos = torch.as_tensor(positions, dtype=torch.long, device=x.device).reshape(-1)
    inside = (pos >= 0) & (pos < cos.shape[0])
    c = torch.where(inside[:, None], cos.to(dtype)[pos.clamp(0, cos.shape[0] - 1)], torch.ones((), dtype=dtype))
    s = torch.where(inside[:, None], sin.to(dtype)[pos.clamp(0, cos.shape[0] - 1)], torch.zeros((), dtype=dtype))
    c, s = c[:, None, :], s[:, None, :]
    out = x.clone()
    if interleaved:
        x1, x2 = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]
        out[..., 0 : 2 * half : 2], out[..., 1 : 2 * half : 2] = x1 * c - x2 * s, x2 * c + x1 * s
    else:
        x1, x2 = x[..., :half], x[..., half : 2 * half]
        out[..., :half], out[..., half : 2 * half] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


def flash_attn_with_kvcache_append(
    q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, page_table=None, cache_batch_idx=None, cache_leftpad=None,
    cu_seqlens_q=None, cu_seqlens_k_new=None, rotary_cos=None, rotary_sin=None, rotary_seqlens=None,
    rotary_interleaved: bool = True, softmax_scale=None, causal: bool = False, window_size=(-1, -1),
    softcap: float = 0.0, sinks=None, k_descale=None, v_descale=None, dtype: torch.dtype = torch.float64,
):
    """FlashAttention-3's ``flash_attn_with_kvcache`` with new keys: ``(out, lse, k_cache', v_cache')``
    (the caches as copies after the append).

    New token ``i`` of request ``b`` (``k``/``v`` ``[B, S_new, ...]``, or ragged with
    ``cu_seqlens_k_new``) goes to position ``cache_seqlens[b] + i`` of cache row
    ``r = cache_batch_idx[b]`` (``b`` without it): ``page_table[r]``'s pages, or ``k_cache[r]`` of a
    contiguous ``[B_cache, S, H_kv, D]`` cache; keys rotated at ``rotary_seqlens[b] + i``
    (``cache_seqlens[b]`` without it), stored quantised (``x / descale``) into fp8 caches. Then
    attention of the queries (rotated at ``rotary_seqlens[b] + t`` when causal or local, else all
    at ``rotary_seqlens[b]``) over positions ``cache_leftpad[b] .. cache_seqlens[b] + new_len - 1``
    of the row, bottom-right aligned over those keys. The positions must fit the row."""
    k_out, v_out = k_cache.clone(), v_cache.clone()
    if q.dim() == 4:
        batch, s = q.shape[:2]
        cu_seqlens_q = torch.arange(batch + 1) * s
        q = q.reshape(batch * s, *q.shape[2:])
    cu_q = [int(x) for x in cu_seqlens_q.tolist()]
    batch = len(cu_q) - 1
    if k is not None and k.dim() == 4:
        cu_seqlens_k_new = torch.arange(batch + 1) * k.shape[1]
        k, v = k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
    cu_k = [int(x) for x in cu_seqlens_k_new.tolist()] if k is not None else [0] * (batch + 1)
    seqlens = [int(x) for x in torch.as_tensor(cache_seqlens).reshape(-1).expand(batch).tolist()]
    base = seqlens if rotary_seqlens is None else [int(x) for x in rotary_seqlens.tolist()]
    num_kv_heads = k_cache.shape[2]
    fp8 = k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)

    def slot(r: int, pos: int):
        if page_table is None:
            return (r, pos)
        p = k_cache.shape[1]
        return (int(page_table[r, pos // p]), pos % p)

    rows = [b if cache_batch_idx is None else int(cache_batch_idx[b]) for b in range(batch)]
    for b in range(batch):
        n = cu_k[b + 1] - cu_k[b]
        if n == 0:
            continue
        kb = k[cu_k[b] : cu_k[b + 1]]
        if rotary_cos is not None:
            kb = apply_rotary(kb, rotary_cos, rotary_sin, [base[b] + i for i in range(n)], rotary_interleaved, dtype)
        vb = v[cu_k[b] : cu_k[b + 1]]
        for i in range(n):
            where = slot(rows[b], seqlens[b] + i)
            if fp8 and k.dtype != k_cache.dtype:  # x / descale in fp32, saturated, rounded to nearest
                for src, dst, scale in ((kb[i], k_out, k_descale), (vb[i], v_out, v_descale)):
                    x = src.to(torch.float32) / _descale(scale, b, num_kv_heads, torch.float32, q.device)[:, None]
                    dst[where] = x.clamp(-torch.finfo(dst.dtype).max, torch.finfo(dst.dtype).max).to(dst.dtype)
            else:
                k_out[where] = kb[i].to(k_cache.dtype)
                v_out[where] = vb[i].to(v_cache.dtype)
    left, right = window_size
    local = left >= 0 or right >= 0 or causal
    num_q_heads = q.shape[1]
    out = torch.zeros(q.shape[0], num_q_heads, v_cache.shape[3], dtype=dtype)
    lse = torch.full((num_q_heads, q.shape[0]), -math.inf, dtype=dtype)
    for b in range(batch):
        q_len = cu_q[b + 1] - cu_q[b]
        total = seqlens[b] + cu_k[b + 1] - cu_k[b]
        lp = 0 if cache_leftpad is None else min(max(int(cache_leftpad[b]), 0), total)
        qb = q[cu_q[b] : cu_q[b + 1]]
        if rotary_cos is not None:
            qb = apply_rotary(qb, rotary_cos, rotary_sin, [base[b] + (t if local else 0) for t in range(q_len)],
                              rotary_interleaved, dtype)
        keys = torch.stack([k_out[slot(rows[b], p)] for p in range(lp, total)]) if total > lp else k_out[:0, 0]
        vals = torch.stack([v_out[slot(rows[b], p)] for p in range(lp, total)]) if total > lp else v_out[:0, 0]
        o, s = paged_attention(
            qb, keys[None], vals[None], torch.tensor([total - lp]), torch.zeros(1, 1, dtype=torch.long),
            torch.tensor([0, q_len]), softmax_scale=softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5,
            causal=causal, window_size=window_size, softcap=softcap, sinks=sinks,
            k_descale=None if k_descale is None else _descale(k_descale, b, num_kv_heads, dtype, q.device),
            v_descale=None if v_descale is None else _descale(v_descale, b, num_kv_heads, dtype, q.device), dtype=dtype)
        out[cu_q[b] : cu_q[b + 1]], lse[:, cu_q[b] : cu_q[b + 1]] = o, s
    return out, lse, k_out, v_out
def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale=None, v_scale=None):
    """New ``(key_cache, value_cache)`` (copies) after vLLM's ``reshape_and_cache``: token ``t``'s
    key at ``key_cache[s // P, :, d // x, s % P, d % x]`` and value at ``value_cache[s // P, :, d, s
    % P]`` for ``0 <= s = slot_mapping[t] < num_blocks * P`` (quantised as
    ``reshape_and_cache_flash`` does when scales are given)."""
    k_out, v_out = key_cache.clone(), value_cache.clone()
    num_blocks, heads, _, block_size, x = key_cache.shape
    for t, s in _slot_writes(slot_mapping, num_blocks * block_size):
        k = _fp8_store(key[t], k_scale, key_cache.dtype)  # [H, D]
        k_out[s // block_size, :, :, s % block_size, :] = k.reshape(heads, -1, x)
        v_out[s // block_size, :, :, s % block_size] = _fp8_store(value[t], v_scale, value_cache.dtype)
    return k_out, v_out


def gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size: int, seq_starts=None):
    """New ``dst`` (a copy) after vLLM's ``gather_cache`` / ``cp_gather_cache``: row ``cu[b] + i``
    of request ``b`` is entry ``i % P`` of block ``block_table[b, seq_starts[b] // P + i // P]``
    (whole blocks skipped), bit for bit; 0 where that column is past the table, the block outside
    the cache or ``seq_starts[b]`` negative; rows past ``dst`` or of no request untouched."""
    out = dst.clone()
    num_blocks, block_size = src_cache.shape[:2]
    cu = cu_seq_lens.tolist()
    starts = [0] * batch_size if seq_starts is None else seq_starts.tolist()
    table = block_table.tolist()
    for b in range(batch_size):
        for t in range(max(cu[b], 0), min(cu[b + 1], dst.shape[0])):
            i = t - cu[b]
            col = starts[b] // block_size + i // block_size if starts[b] >= 0 else -1
            blk = table[b][col] if 0 <= col < len(table[b]) else -1
            out[t] = src_cache[blk, i % block_size] if 0 <= blk < num_blocks else 0
    return out


def indexer_k_quantize(k: torch.Tensor, quant_block_size: int, scale_fmt=None):
    """vLLM's indexer key quantisation, one token and column group at a time in fp32: ``(k_fp8 [T,
    D] float8_e4m3fn, scales [T, D // Q] fp32)`` with ``scale = max(amax, 1e-4) / 448`` (``"ue8m0"``:
    ``2 ** ceil(log2(scale))``) and ``clamp(k / scale, -448, 448)`` rounded to e4m3."""
    tokens, d = k.shape
    groups = d // quant_block_size
    q = torch.empty(tokens, d, dtype=torch.float8_e4m3fn)
    scales = torch.empty(tokens, groups, dtype=torch.float32)
    for t in range(tokens):
        for g in range(groups):
            x = k[t, g * quant_block_size:(g + 1) * quant_block_size].cpu().float()
            scale = torch.maximum(x.abs().max(), torch.tensor(1e-4)) / torch.tensor(448.0)
            if scale_fmt == "ue8m0":
                scale = torch.exp2(torch.ceil(torch.log2(scale)))
            q[t, g * quant_block_size:(g + 1) * quant_block_size] = (x / scale).clamp(-448.0, 448.0).to(q.dtype)
            scales[t, g] = scale
    return q, scales


def indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size: int, scale_fmt=None):
    """New ``kv_cache`` (a uint8 copy) after vLLM's ``indexer_k_quant_and_cache``: token ``t`` at
    slot ``s`` (``0 <= s < num_blocks * P``, block ``s // P``, offset ``o = s % P``) stores its fp8
    key (:func:`indexer_k_quantize`) at block bytes ``[o * D, + D)`` and its ``n = D // Q`` fp32
    scales at block bytes ``[P * D + 4 * n * o, + 4 * n)``; ``T = min(len(k), len(slot_mapping))``."""
    out = kv_cache.view(torch.uint8).cpu().clone()
    num_blocks, block_size, _ = out.shape
    d = k.shape[-1]
    k = k.reshape(-1, d)[: slot_mapping.shape[0]]
    q, scales = indexer_k_quantize(k, quant_block_size, scale_fmt)
    n = scales.shape[1]
    for t, s in _slot_writes(slot_mapping[: k.shape[0]], num_blocks * block_size):
        page = out[s // block_size].reshape(-1)  # a view of the block's bytes
        o = s % block_size
        page[o * d:(o + 1) * d] = q[t].view(torch.uint8)
        page[block_size * d + 4 * n * o:block_size * d + 4 * n * (o + 1)] = scales[t].view(torch.uint8)
    return out


def cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens):
    """New ``(dst_k, dst_scale)`` (uint8 copies) after vLLM's ``cp_gather_indexer_k_quant_cache``:
    row ``cu[b] + i`` of request ``b < len(block_table)`` takes token ``i % P`` of block
    ``block_table[b, i // P]``: its ``D`` key bytes and its ``S = dst_scale.shape[1]`` scale bytes
    (laid out as :func:`indexer_k_quant_and_cache` writes them); 0 where the column is past the table
    or the block outside the cache; rows of no request untouched."""
    cache = kv_cache.view(torch.uint8).cpu()
    num_blocks, block_size, _ = cache.shape
    k_out, s_out = dst_k.view(torch.uint8).cpu().clone(), dst_scale.view(torch.uint8).cpu().clone()
    d, sb = k_out.shape[1], s_out.shape[1]
    cu, table = cu_seq_lens.tolist(), block_table.tolist()
    for b in range(len(table)):
        for t in range(max(cu[b], 0), min(cu[b + 1], k_out.shape[0])):
            i = t - cu[b]
            blk = table[b][i // block_size] if i // block_size < len(table[b]) else -1
            if 0 <= blk < num_blocks:
                page, o = cache[blk].reshape(-1), i % block_size
                k_out[t], s_out[t] = page[o * d:(o + 1) * d], page[block_size * d + sb * o:block_size * d + sb * (o + 1)]
            else:
                k_out[t], s_out[t] = 0, 0
    return k_out, s_out
def convert_vertical_slash_indexes(q_seqlens, kv_seqlens, vertical_indexes, slash_indexes, context_size: int,
                                   block_size_M: int, block_size_N: int, causal: bool = True,
                                   vertical_indices_count=None, slash_indices_count=None):
    """sgl-kernel's vertical/slash -> block/column conversion, one row block at a time in plain
    Python: ``(block_count, block_offset, column_count, column_index)`` as
    :func:`triton_xpu_attn.convert_vertical_slash_indexes` documents (lists read in order, a
    row's blocks capped at ``NNZ_S``, per-head counts clamped to ``[0, NNZ]``)."""
    batch, heads, nnz_s = slash_indexes.shape
    nnz_v = vertical_indexes.shape[2]
    M, N = block_size_M, block_size_N
    rows = -(-context_size // M)
    shape = (batch, heads, rows)
    block_count = torch.zeros(shape, dtype=torch.int64)
    column_count = torch.zeros(shape, dtype=torch.int64)
    block_offset = torch.zeros(shape + (nnz_s,), dtype=torch.int64)
    column_index = torch.zeros(shape + (nnz_v,), dtype=torch.int64)
    for b in range(batch):
        q_len, kv_len = int(q_seqlens[b]), int(kv_seqlens[b])
        delta = kv_len - q_len
        for h in range(heads):
            nv = nnz_v if vertical_indices_count is None else min(max(int(vertical_indices_count[h]), 0), nnz_v)
            ns = nnz_s if slash_indices_count is None else min(max(int(slash_indices_count[h]), 0), nnz_s)
            verticals = [int(x) for x in vertical_indexes[b, h, :nv]]
            slashes = [int(x) for x in slash_indexes[b, h, :ns]]
            for r in range(rows):
                end = (r + 1) * M
                limit = end + delta
                blocks, columns = [], []

                def save(lo, hi):
                    x = lo
                    while x < min(hi, kv_len) and len(blocks) < nnz_s:
                        blocks.append(x)
                        x += N

                if causal:
                    kept = [s for s in slashes if s < limit]
                    ends = [max(delta + end - s, M) for s in kept]
                else:
                    ends = [kv_len + end - s for s in slashes]
                vi = 0
                if ends:
                    start, stop = ends[0] - M, ends[0]
                    for c in ends[1:]:
                        while vi < nv and verticals[vi] < stop:  # verticals reached before this slash
                            x = verticals[vi]
                            if x < start and not (causal and x >= limit):
                                columns.append(x)
                            vi += 1
                        if c > stop + M:
                            save(start, stop)
                            start, stop = c - M, c
                        elif c > stop:
                            stop += M
                    while vi < nv and verticals[vi] < stop:
                        x = verticals[vi]
                        if x < start and not (causal and x >= limit):
                            columns.append(x)
                        vi += 1
                    save(start, stop)
                    for x in verticals[vi:]:
                        if causal and x >= limit - 1:
                            break
                        if x >= stop:
                            columns.append(x)
                else:
                    for x in verticals:
                        if causal and x >= limit - 1:
                            break
                        if 0 <= x < kv_len:
                            columns.append(x)
                block_count[b, h, r] = len(blocks)
                column_count[b, h, r] = len(columns)
                block_offset[b, h, r, : len(blocks)] = torch.tensor(blocks, dtype=torch.int64)
                column_index[b, h, r, : len(columns)] = torch.tensor(columns, dtype=torch.int64)
    return block_count, block_offset, column_count, column_index


def vertical_slash_mask(block_count, block_offset, column_count, column_index, b: int, q_len: int, kv_len: int,
                        block_size_M: int, block_size_N: int, causal: bool) -> torch.Tensor:
    """``[H, q_len, kv_len]`` bool: the keys each query of request ``b`` sees under a
    block/column table (the union of its row block's blocks and columns, counts clamped to
    ``[0, NNZ]``, keys outside ``[0, kv_len)`` dropped; bottom-right causal)."""
    heads, rows, nnz_s = block_offset.shape[1:]
    nnz_v = column_index.shape[3]
    mask = torch.zeros(heads, q_len, kv_len, dtype=torch.bool)
    for h in range(heads):
        for r in range(min(rows, -(-q_len // block_size_M))):
            keys = torch.zeros(kv_len, dtype=torch.bool)
            for j in range(min(max(int(block_count[b, h, r]), 0), nnz_s)):
                lo = int(block_offset[b, h, r, j])
                keys[max(lo, 0): max(min(lo + block_size_N, kv_len), 0)] = True
            for j in range(min(max(int(column_count[b, h, r]), 0), nnz_v)):
                x = int(column_index[b, h, r, j])
                if 0 <= x < kv_len:
                    keys[x] = True
            mask[h, r * block_size_M: (r + 1) * block_size_M] = keys
    if causal:
        mask &= visible_keys(q_len, kv_len, True, (-1, -1))[None]
    return mask


def sparse_attention(q, k, v, block_count, block_offset, column_count, column_index, softmax_scale: float,
                     causal: bool = False, softcap: float = 0.0, block_size_M: int = 64, block_size_N: int = 64,
                     cu_seqlens_q=None, cu_seqlens_k=None, dtype: torch.dtype = torch.float64):
    """Vertical/slash sparse attention as a dense masked softmax (:func:`vertical_slash_mask`).
    ``q [B, Sq, H, D]`` (or ``[total_q, H, D]`` with ``cu_seqlens_q``/``cu_seqlens_k``); returns
    ``(out, lse)``, ``lse [B, H, Sq]`` (or ``[H, total_q]``); rows that see no key: 0, -inf."""
    varlen = cu_seqlens_q is not None
    if varlen:
        cu_q, cu_k = [int(x) for x in cu_seqlens_q], [int(x) for x in cu_seqlens_k]
        spans = [(cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]) for i in range(len(cu_q) - 1)]
    else:
        spans = [(0, q.shape[1], 0, k.shape[1])] * q.shape[0]
    heads, d = q.shape[-2], v.shape[-1]
    out = torch.zeros(q.shape[:-1] + (d,), dtype=dtype)
    lse = torch.full((heads, q.shape[0]) if varlen else (q.shape[0], heads, q.shape[1]), -math.inf, dtype=dtype)
    for b, (q0, q1, k0, k1) in enumerate(spans):
        qb = (q if varlen else q[b])[q0:q1].to(dtype)
        kb = (k if varlen else k[b])[k0:k1].to(dtype)
        vb = (v if varlen else v[b])[k0:k1].to(dtype)
        group = heads // kb.shape[1]
        kb, vb = kb.repeat_interleave(group, 1), vb.repeat_interleave(group, 1)
        mask = vertical_slash_mask(block_count, block_offset, column_count, column_index, b, q1 - q0, k1 - k0,
                                   block_size_M, block_size_N, causal)
        s = torch.einsum("qhd,khd->hqk", qb, kb) * softmax_scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~mask, -math.inf)
        row_lse = torch.logsumexp(s, -1)
        p = torch.where(mask, torch.exp(s - torch.where(mask.any(-1), row_lse, 0.0)[..., None]), 0.0)
        vb = torch.where(mask.any(1).T[:, :, None], vb, 0.0)  # keys no query sees may hold NaN
        o = torch.einsum("hqk,khd->qhd", p, vb)
        if varlen:
            out[q0:q1], lse[:, q0:q1] = o, row_lse
        else:
            out[b], lse[b] = o, row_lse
    return out, lse
