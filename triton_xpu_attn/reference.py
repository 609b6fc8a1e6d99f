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


def merge_state_v2(v_a, s_a, v_b, s_b, dtype: torch.dtype = torch.float64):
    """Merge two attention states (base e): ``v_a, v_b [N, H, Dv]``, ``s_a, s_b [N, H]``.

    Non-finite LSEs count as ``-inf`` (an empty state). Both empty -> ``v = 0``, ``s = -inf``.
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
    v = (v_a.to(dtype) * w_a[..., None] + v_b.to(dtype) * w_b[..., None]) / d_safe[..., None]
    s = torch.where(d > 0, torch.log(d_safe) + m_safe, torch.full_like(d, -math.inf))
    return v, s


def normalize_page_table(req_to_token, req_pool_indices, seq_lens, page_size, max_pages=None, full_to_swa=None):
    """Page-granular table from a token-granular ``req_to_token`` (int32 ``[B, max_pages]``)."""
    seq_lens = [int(x) for x in seq_lens]
    if max_pages is None:
        max_pages = -(-max(seq_lens, default=0) // page_size)
    out = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    for b, n in enumerate(seq_lens):
        row = req_to_token[int(req_pool_indices[b])]
        for p in range(min(-(-n // page_size), max_pages)):
            slot = int(row[p * page_size])
            if full_to_swa is not None:
                slot = int(full_to_swa[slot])
            out[b, p] = -1 if slot < 0 else slot // page_size
    return out


def translate_loc_from_full_to_swa(full_to_swa, locs):
    """``full_to_swa[locs]`` as int32 (index -1 reads the mapping's last entry, -1)."""
    return full_to_swa.cpu()[locs.cpu().long()].to(torch.int32)


# ---- local attention virtual batches (issue 5) ----


# ---- SWA speculative page table (issue 6) ----


# ---- MLA decode (issue 4) ----
