"""Local (chunked) attention metadata: split each request into *virtual batches*, one per attention
chunk its queries touch, so that ordinary causal paged attention over the virtual batches computes
Llama-4-style chunked local attention (a query at absolute position ``i`` sees keys
``[floor(i / C) * C, i]``).

Why this op exists: sglang's host-side version was handed a token-granular table with
``page_size > 1`` and silently returned garbage (sglang PR 23757; GSM8K 0.815 -> 0.005), and it
clamps the chunk to ``max(seq_lens)``, which changes which keys a query sees once
``page_size > 1``. Here the table is explicitly page-granular, the algorithm is vLLM's (no clamp),
and everything is computed on the device by two kernels: per-request counts + prefix sum, then the
fill. With ``max_virtual_batches`` the call never syncs with the host and can be captured in a
CUDA graph.
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .. import device as _device
from .._common import (
    INDEX_DTYPES,
    MAX_GRID_DIM_1,
    cdiv,
    check_bool,
    check_int,
    check_page_size,
    check_positive_int,
    check_same_device,
    check_tensor,
    device_guard,
    next_power_of_2,
    register_xpu_compile,
)

_SCAN_BLOCK = 1024  # requests per step of the single-program prefix sum
_FILL_ELEMENTS = 2048  # block-table elements per program of the fill kernel
_FUSED_MAX_BATCH = 1024  # graph mode counts inside the fill kernel up to this many requests
# fused count: each program re-derives its virtual batches' requests from a [BLOCK_V, BLOCK_B]
# lookup, so few virtual batches per program (more programs, each with a small lookup) win.
# H100 sweep (chunk 8192, page 64; bench/results): B=64 10.5 -> 7.4 us, B=512 unchanged at 9.3.
_FUSED_LOOKUP = 256  # lookup elements per program, but at least _FUSED_MIN_V virtual batches
_FUSED_MIN_V = 4
# Sizes a launch never exceeds, whatever the input (CUDA: grid axis 1 at most 65535 programs):
# virtual batches, indexed with int32 program offsets in the fill kernel (2^30: far past any batch,
# never near int32's end), and table pages per chunk (the fill's column programs x BLOCK_P <= 256)
_MAX_VIRTUAL_BATCHES = 2**30
_MAX_PAGES_PER_CHUNK = MAX_GRID_DIM_1 * 256


@triton.jit
def _request_geometry(q_len, seq_len, chunk):
    """Per request: ``(q, first, nblk, last_k)`` -- the query count, the queries in the chunk where
    the queries start, the number of virtual batches and the keys in the last chunk.

    All int64 and non-negative: lengths are clamped at 0 so invalid input (``validate=False``) gives
    bounded values instead of wild ones. ``seq_len == 0`` has no keys: ``last_k = 0``.
    """
    q = tl.maximum(q_len, 0)
    s = tl.maximum(seq_len, 0)
    context = tl.maximum(s - q, 0)
    first = tl.minimum(chunk - context % chunk, q)
    nblk = 1 + (q - first + chunk - 1) // chunk
    last_k = tl.where(s > 0, (s - 1) % chunk + 1, 0)
    return q, first, nblk, last_k


@triton.jit
def _virtual_batch_counts(query_start_loc_ptr, seq_lens_ptr, b, batch, chunk):
    """Virtual batches of requests ``b`` (a block of indices; 0 outside ``[0, batch)``) and the
    in-range mask: the per-request count both the count kernel and the fused fill use."""
    inside = b < batch
    q0 = tl.load(query_start_loc_ptr + b, mask=inside, other=0).to(tl.int64)
    q1 = tl.load(query_start_loc_ptr + b + 1, mask=inside, other=0).to(tl.int64)
    s = tl.load(seq_lens_ptr + b, mask=inside, other=0).to(tl.int64)
    _, _, nblk, _ = _request_geometry(q1 - q0, s, chunk)
    return tl.where(inside, nblk, 0), inside


@triton.jit
def _local_vb_count_kernel(
    query_start_loc_ptr,  # [B+1] int32/int64
    seq_lens_ptr,  # [B] int32/int64
    cu_nblk_ptr,  # [B+1] int32 out: cu_nblk[b] = virtual batches of requests < b
    batch,
    chunk,
    BLOCK_B: tl.constexpr,
):
    """One program: virtual batches per request and their exclusive prefix sum (``cu_nblk[B]`` = V)."""
    offs = tl.arange(0, BLOCK_B)
    tl.store(cu_nblk_ptr + offs, tl.zeros([BLOCK_B], dtype=tl.int32), mask=offs == 0)
    carry = tl.sum(tl.zeros([BLOCK_B], dtype=tl.int64), axis=0)
    for start in range(0, batch, BLOCK_B):
        b = start + offs
        nblk, inside = _virtual_batch_counts(query_start_loc_ptr, seq_lens_ptr, b, batch, chunk)
        inclusive = tl.cumsum(nblk, axis=0) + carry
        # saturated, not wrapped, at int32's end (impossible lengths): V is read back and bounded
        tl.store(cu_nblk_ptr + 1 + b, tl.minimum(inclusive, 2**31 - 1).to(tl.int32), mask=inside)
        carry += tl.sum(nblk, axis=0)


@triton.jit
def _local_vb_fill_kernel(
    query_start_loc_ptr,  # [B+1]
    seq_lens_ptr,  # [B]
    cu_nblk_ptr,  # [B+1] int32 from the count kernel
    block_table_ptr,  # [B, max_pages] page-granular
    stride_bt_row,
    stride_bt_col,
    max_pages,
    seqlens_q_ptr,  # [num_out] int32 out
    cu_seqlens_q_ptr,  # [num_out + 1] int32 out
    seqlens_k_ptr,  # [num_out] int32 out
    bt_local_ptr,  # [num_out, pages_per_chunk] int32 out
    stride_btl_row,
    batch,
    num_out,
    chunk,
    page_size,
    pages_per_chunk,
    search_steps,
    BLOCK_V: tl.constexpr,
    BLOCK_P: tl.constexpr,
    FUSED_COUNT: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """Grid ``(cdiv(num_out + 1, BLOCK_V), cdiv(pages_per_chunk, BLOCK_P))``: virtual batches
    ``v`` of this program's block (and, for column block 0, their lengths and ``cu`` entries).

    ``FUSED_COUNT`` (graph mode, ``batch <= BLOCK_B``): each program counts the virtual batches of
    every request itself instead of reading the count kernel's ``cu_nblk``, so the whole op is one
    launch (small batches are launch-bound)."""
    v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    if FUSED_COUNT:
        r = tl.arange(0, BLOCK_B)
        nblk_r, inside = _virtual_batch_counts(query_start_loc_ptr, seq_lens_ptr, r, batch, chunk)
        inclusive = tl.cumsum(nblk_r, axis=0)
        total = tl.sum(nblk_r, axis=0)
        # requests wholly before v: their count is v's request, their virtual batches precede v's
        before = (inclusive[None, :] <= v[:, None]) & inside[None, :]
        b = tl.minimum(tl.sum(before.to(tl.int32), axis=1), batch - 1)
        vb_first = tl.sum(tl.where(before, nblk_r[None, :], 0), axis=1)
        nblk_b = tl.sum(tl.where(r[None, :] == b[:, None], nblk_r[None, :], 0), axis=1)
    else:
        total = tl.load(cu_nblk_ptr + batch)
        # request of v: the largest b with cu_nblk[b] <= v (cu_nblk is strictly increasing)
        lo = tl.zeros([BLOCK_V], dtype=tl.int32)
        hi = tl.zeros([BLOCK_V], dtype=tl.int32) + (batch - 1)
        for _ in range(0, search_steps):
            mid = (lo + hi + 1) // 2
            go = tl.load(cu_nblk_ptr + mid) <= v
            lo = tl.where(go, mid, lo)
            hi = tl.where(go, hi, mid - 1)
        b = lo
        vb_first = tl.load(cu_nblk_ptr + b)
        nblk_b = tl.load(cu_nblk_ptr + b + 1) - vb_first
    active = v < total  # v >= total: an unused virtual batch (graph mode) -> lengths 0, pages 0
    a = (v - vb_first).to(tl.int64)  # index of v within its request
    nblk_b = nblk_b.to(tl.int64)
    q0 = tl.load(query_start_loc_ptr + b).to(tl.int64)
    q1 = tl.load(query_start_loc_ptr + b + 1).to(tl.int64)
    s = tl.maximum(tl.load(seq_lens_ptr + b).to(tl.int64), 0)
    q, first, _, last_k = _request_geometry(q1 - q0, s, chunk)
    k_start = tl.maximum(s - ((nblk_b - 1 - a) * chunk + last_k), 0)  # a multiple of chunk

    if tl.program_id(1) == 0:
        base = tl.load(query_start_loc_ptr).to(tl.int64)
        end = tl.load(query_start_loc_ptr + batch).to(tl.int64)
        q_local = tl.where(a == 0, first, tl.minimum(q - first - chunk * (a - 1), chunk))
        q_before = tl.where(a == 0, 0, first + chunk * (a - 1))
        k_local = tl.where(a == nblk_b - 1, last_k, chunk)
        cu = tl.where(active, q0 - base + q_before, end - base)
        q_local = tl.where(active, q_local, 0)
        k_local = tl.where(active, k_local, 0)
        tl.store(seqlens_q_ptr + v, q_local.to(tl.int32), mask=v < num_out)
        tl.store(seqlens_k_ptr + v, k_local.to(tl.int32), mask=v < num_out)
        tl.store(cu_seqlens_q_ptr + v, cu.to(tl.int32), mask=v <= num_out)

    # block_table_local[v, j] = block_table[b, min(k_start / P + j, max_pages - 1)] (vLLM's clamp:
    # columns past the last key are never read by attention; the clamp only keeps loads in bounds)
    j = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    page = (k_start // page_size)[:, None] + j[None, :]
    page = tl.maximum(tl.minimum(page, max_pages - 1), 0)
    read = active[:, None] & (j[None, :] < pages_per_chunk * tl.minimum(max_pages, 1))  # nothing if no columns
    entry = tl.load(
        block_table_ptr + b.to(tl.int64)[:, None] * stride_bt_row + page * stride_bt_col, mask=read, other=0
    )
    write = (v < num_out)[:, None] & (j[None, :] < pages_per_chunk)
    tl.store(bt_local_ptr + v.to(tl.int64)[:, None] * stride_btl_row + j[None, :], entry.to(tl.int32), mask=write)


register_xpu_compile(
    _local_vb_count_kernel,
    "i32",
    dict(query_start_loc_ptr="*i32", seq_lens_ptr="*i32", cu_nblk_ptr="*i32", batch="i32", chunk="i64", BLOCK_B=1024),
    num_warps=4,
)
_FILL_I32 = dict(
    query_start_loc_ptr="*i32", seq_lens_ptr="*i32", cu_nblk_ptr="*i32", block_table_ptr="*i32",
    stride_bt_row="i64", stride_bt_col="i64", max_pages="i32", seqlens_q_ptr="*i32", cu_seqlens_q_ptr="*i32",
    seqlens_k_ptr="*i32", bt_local_ptr="*i32", stride_btl_row="i64", batch="i32", num_out="i32", chunk="i64",
    page_size="i64", pages_per_chunk="i32", search_steps="i32", BLOCK_V=16, BLOCK_P=128, FUSED_COUNT=False,
    BLOCK_B=1,
)
register_xpu_compile(_local_vb_fill_kernel, "i32", _FILL_I32, num_warps=4)
register_xpu_compile(
    _local_vb_fill_kernel,
    "i64,BLOCK_P256",
    {**_FILL_I32, "query_start_loc_ptr": "*i64", "seq_lens_ptr": "*i64", "block_table_ptr": "*i64", "BLOCK_P": 256},
    num_warps=4,
)
register_xpu_compile(
    _local_vb_fill_kernel, "i32,fused count,B64", {**_FILL_I32, "FUSED_COUNT": True, "BLOCK_B": 64}, num_warps=4
)


def max_local_attention_virtual_batches(batch_size: int, num_tokens: int, attn_chunk_size: int) -> int:
    """Exact upper bound on the number of virtual batches ``V`` that
    :func:`make_local_attention_virtual_batches` makes for any batch of ``batch_size`` requests
    holding ``num_tokens`` query tokens in all (the size to give ``max_virtual_batches``).

    Request ``b`` with ``q_b`` queries gives ``1 + cdiv(q_b - 1, C)`` virtual batches at most (its
    queries touch at most that many chunks; 1 when ``q_b <= 1``), so ``V <= B + sum_b cdiv(q_b - 1, C)``.
    Maximised over all splits of ``T = num_tokens`` among the ``B`` requests:

    * ``C >= 2``: ``V <= B + m + (T - 2 m) // C`` with ``m = min(B, T // 2)``;
    * ``C == 1``: ``V <= B + T - 1`` (``T >= 1``), ``B`` when ``T == 0``.

    Both are attained. Pure decode (every ``q_b <= 1``) has ``V == B`` exactly, and a batch whose
    ``q_b <= C`` has ``V <= 2 B``.
    """
    batch = check_int(batch_size, "batch_size", minimum=0)
    tokens = check_int(num_tokens, "num_tokens", minimum=0)
    chunk = check_positive_int(attn_chunk_size, "attn_chunk_size")
    if batch == 0:
        if tokens:
            raise ValueError(f"num_tokens must be 0 when batch_size is 0, got {tokens}")
        return 0
    if chunk == 1:
        return batch + max(tokens - 1, 0)
    m = min(batch, tokens // 2)
    return batch + m + (tokens - 2 * m) // chunk


def _lengths_to_tensor(name: str, value, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(value).__name__}")
    if value.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got numpy dtype {value.dtype}")
    host = torch.from_numpy(np.ascontiguousarray(value, dtype=np.int64 if value.dtype.itemsize > 4 else np.int32))
    return host.to(device)


def _check_out(out, num_out: int | None, pages_per_chunk: int, device: torch.device) -> int:
    if not isinstance(out, (tuple, list)) or len(out) != 4:
        raise TypeError("out must be a tuple (seqlens_q_local, cu_seqlens_q_local, seqlens_k_local, block_table_local)")
    sq, cu, sk, btl = out
    check_tensor("out[0] (seqlens_q_local)", sq, dtypes=(torch.int32,), ndim=1)
    v = sq.shape[0]
    if num_out is not None and num_out != v:
        raise ValueError(f"max_virtual_batches ({num_out}) must equal out[0].shape[0] ({v})")
    check_tensor("out[1] (cu_seqlens_q_local)", cu, dtypes=(torch.int32,), shape=(v + 1,))
    check_tensor("out[2] (seqlens_k_local)", sk, dtypes=(torch.int32,), shape=(v,))
    check_tensor("out[3] (block_table_local)", btl, dtypes=(torch.int32,), shape=(v, pages_per_chunk), last_dim_contiguous=True)
    for name, t in (("out[0]", sq), ("out[1]", cu), ("out[2]", sk)):
        if t.numel() > 1 and t.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous")
    for i, t in enumerate(out):
        if t.device != device:
            raise ValueError(f"out[{i}] is on {t.device} but block_table is on {device}: all must be on one device")
    return v


def make_local_attention_virtual_batches(
    attn_chunk_size: int,
    query_start_loc=None,
    seq_lens=None,
    block_table: torch.Tensor | None = None,
    page_size: int | None = None,
    preserve_attn_chunk_size: bool = True,
    *,
    query_start_loc_np=None,
    seq_lens_np=None,
    max_virtual_batches: int | None = None,
    validate: bool = False,
    num_pages: int | None = None,
    out: tuple | None = None,
):
    """Split a batch into the *virtual batches* of chunked local attention (vLLM's algorithm), on
    the device.

    Chunked local attention (Llama 4): a query at absolute position ``i`` attends the keys
    ``[floor(i / C) * C, i]``, ``C = attn_chunk_size``. Each request is cut at chunk boundaries into
    one virtual batch per chunk its queries touch; running ordinary **causal** (bottom-right
    aligned) paged attention with ``cu_seqlens_q = cu_seqlens_q_local``,
    ``cache_seqlens = seqlens_k_local`` and ``page_table = block_table_local`` then computes exactly
    chunked local attention, in the original query order (the virtual batches of request ``b`` hold
    its queries in order, so ``q`` and the output need no permutation).

    For request ``b`` with ``q = query_start_loc[b+1] - query_start_loc[b]`` queries and
    ``s = seq_lens[b]`` keys: ``first = min(C - (s - q) % C, q)`` queries fall in the chunk where its
    queries start, it gets ``nblk = 1 + cdiv(q - first, C)`` virtual batches (one when ``q == 0``),
    the ``a``-th holding ``first`` (``a == 0``) or ``min(q - first - C (a - 1), C)`` queries and
    ``C`` keys, except the last, which holds ``last_k = (s - 1) % C + 1`` keys. Virtual batch ``v``
    (request ``b``, ``r = nblk - 1 - a`` from the end) starts at key ``k_start = s - (r C + last_k)``,
    a multiple of ``C``, and ``block_table_local[v, j] = block_table[b, min(k_start / P + j,
    max_pages - 1)]``. The clamp (vLLM's) only affects columns past the virtual batch's last key,
    which attention never reads (reads stop at ``seqlens_k_local[v]``); it keeps every load inside
    the table.

    By default the chunk is **not** clamped to ``max(seq_lens)`` (``preserve_attn_chunk_size=True``,
    what sglang's FlashAttention backend passes): with ``page_size > 1`` sglang's default clamp moves
    chunk boundaries and changes which keys a query sees. One deliberate difference from vLLM: a
    request with ``seq_lens[b] == 0`` gets ``last_k = 0`` (vLLM's formula would give ``C`` keys
    that do not exist).

    Called as sglang calls it (keywords ``query_start_loc_np``/``seq_lens_np``, numpy arrays, a
    block table on the CPU) it returns what sglang's host function returns: three int32 numpy
    arrays and the table as a torch tensor beside ``block_table``. Inputs on the CPU while the
    kernels run on a GPU take a host path (torch on the CPU, same results as the kernels): CPU in,
    CPU out.

    Example (sglang, token-granular ``req_to_token``: make it page-granular first)::

        page_table = normalize_page_table(req_to_token, req_pool_indices, seq_lens, page_size)
        sq, cu, sk, bt = make_local_attention_virtual_batches(8192, cu_seqlens_q, seq_lens, page_table, page_size)
        out = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=sk, page_table=bt,
                                      cu_seqlens_q=cu, max_seqlen_q=max_q, causal=True)

    Parameters
    ----------
    attn_chunk_size : int
        ``C``, the attention chunk in tokens; a positive multiple of ``page_size``, at most
        ``65535 * 256`` pages (``ValueError`` past it: the fill's grid).
    query_start_loc : torch.Tensor or numpy.ndarray
        ``[B+1]`` int32/int64: cumulative query counts (``cu_seqlens_q``), non-decreasing.
        ``query_start_loc_np`` (sglang's keyword) is the same argument; give one of the two.
    seq_lens : torch.Tensor or numpy.ndarray
        ``[B]`` int32/int64: KV length of each request **including** its new query tokens
        (``seq_lens[b] >= q_len[b]``). Pass both as numpy arrays (sglang's drop-in call) and the
        three length outputs come back as numpy arrays, at the cost of host<->device copies.
        ``seq_lens_np`` (sglang's keyword) is the same argument; give one of the two.
    block_table : torch.Tensor
        ``[B, max_pages]`` int32/int64, **page-granular**: ``block_table[b, p]`` is the physical page
        of logical page ``p`` (tokens ``p*P .. p*P+P-1``) of request ``b``; any strides. The
        computation runs on its device (on the CPU under a GPU backend: the host path). A
        token-granular ``req_to_token`` must go through :func:`normalize_page_table` first.
    page_size : int
        ``P``, tokens per page: a power of two from 1 to 2048 dividing ``attn_chunk_size``.
    preserve_attn_chunk_size : bool
        ``True`` (default): use ``attn_chunk_size`` as given. ``False``: sglang's default, its
        "sequence-length-based chunk normalization": the chunk becomes ``max(P, (min(C,
        max(seq_lens)) // P) * P)`` first (so ``C`` need only be a page multiple after it), which
        reproduces sglang's host function bit for bit, including its change of chunk boundaries
        when ``max(seq_lens)`` is not a page multiple. It reads ``max(seq_lens)`` on the host, so
        not in graph mode (``max_virtual_batches``/``out``).
    max_virtual_batches : int, optional
        Graph mode. Every output gets this fixed size ``M``; virtual batches ``V .. M-1`` are unused:
        q and k lengths 0, ``cu_seqlens_q_local`` stays at the total query count, table rows 0.
        Nothing syncs with the host, so the call can be captured in a CUDA graph. ``M`` must be at
        least ``B`` (every request makes one virtual batch); size it with
        :func:`max_local_attention_virtual_batches` (exact bound: ``B + m + (T - 2m) // C``,
        ``m = min(B, T // 2)``, for ``T`` query tokens and ``C >= 2``; ``V == B`` for pure decode).
        If the batch needs more than ``M``, only the first ``M`` virtual batches are produced
        (``cu_seqlens_q_local[M]`` then ends before the last queries, whose outputs attention leaves
        unwritten); the call cannot report that without a sync, so check it with ``validate=True``
        outside graph capture. At most 2^30 (``ValueError``). Without ``max_virtual_batches`` (and
        ``out``), ``V`` is read back to the host once to size the outputs (one device->host sync).
    validate : bool
        Check the input on the host (syncs; not capturable) and raise ``ValueError`` for:
        a decreasing ``query_start_loc``, ``seq_lens[b] < q_len[b]``, a length beyond the table
        (``cdiv(seq_lens[b], P) > max_pages``), a used table entry (``block_table_local[v, j]``,
        ``j < cdiv(seqlens_k_local[v], P)``) outside ``[0, num_pages)``, and, in graph mode,
        ``V > max_virtual_batches``. Without it such input gives unspecified (but in-bounds) output
        of bounded size: without ``max_virtual_batches``, ``V`` is at most
        ``B * max(1, cdiv(max_pages * P, C))``, what the table can hold (lengths past the table or
        more queries than keys may need more: the outputs are cut there, as graph mode cuts at
        ``max_virtual_batches``).
    num_pages : int, optional
        Pages in the KV pool, for ``validate`` (without it only negative entries are caught).
    out : tuple of torch.Tensor, optional
        Graph-mode destinations ``(seqlens_q_local [M], cu_seqlens_q_local [M+1],
        seqlens_k_local [M], block_table_local [M, C // P])``, int32, on ``block_table``'s device;
        implies ``max_virtual_batches = M``. Every element is written.

    Returns
    -------
    seqlens_q_local : torch.Tensor or numpy.ndarray
        ``[V]`` int32: queries of each virtual batch.
    cu_seqlens_q_local : torch.Tensor or numpy.ndarray
        ``[V+1]`` int32: their cumulative sum from 0 (offsets into ``q``, relative to
        ``query_start_loc[0]``).
    seqlens_k_local : torch.Tensor or numpy.ndarray
        ``[V]`` int32: keys of each virtual batch (``<= C``; pass as ``cache_seqlens``).
    block_table_local : torch.Tensor
        ``[V, C // P]`` int32 page-granular table of each virtual batch's chunk, on the device.

    ``V`` is ``max_virtual_batches`` in graph mode. Numpy inputs give numpy arrays for the three
    lengths (like sglang's version) and a tensor on ``block_table``'s device for the table.
    """
    query_start_loc = _one_of("query_start_loc", query_start_loc, query_start_loc_np)
    seq_lens = _one_of("seq_lens", seq_lens, seq_lens_np)
    if not isinstance(block_table, torch.Tensor):
        raise TypeError(f"block_table must be a torch.Tensor, got {type(block_table).__name__}")
    numpy_mode = isinstance(query_start_loc, np.ndarray)
    if numpy_mode != isinstance(seq_lens, np.ndarray):
        raise TypeError("query_start_loc and seq_lens must both be numpy arrays or both be torch tensors")
    chunk = check_positive_int(attn_chunk_size, "attn_chunk_size")
    page_size = check_page_size(page_size)
    preserve_attn_chunk_size = check_bool(preserve_attn_chunk_size, "preserve_attn_chunk_size")
    validate = check_bool(validate, "validate")
    num_pages = check_int(num_pages, "num_pages", minimum=0, allow_none=True)
    device = block_table.device
    # CPU inputs while the kernels run on a GPU: the host path (CPU in, CPU out)
    on_host = device.type == "cpu" and _device.backend() != "interpreter"
    query_start_loc = _lengths_to_tensor("query_start_loc", query_start_loc, device)
    seq_lens = _lengths_to_tensor("seq_lens", seq_lens, device)
    check_tensor("query_start_loc", query_start_loc, dtypes=INDEX_DTYPES, ndim=1)
    if query_start_loc.shape[0] < 1:
        raise ValueError("query_start_loc must have B+1 >= 1 entries, got shape [0]")
    batch = query_start_loc.shape[0] - 1
    check_tensor("seq_lens", seq_lens, dtypes=INDEX_DTYPES, shape=(batch,))
    check_tensor("block_table", block_table, dtypes=INDEX_DTYPES, ndim=2)
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table must have B = {batch} rows (one per request), got shape {list(block_table.shape)}")
    check_same_device(host_ok=on_host, block_table=block_table, query_start_loc=query_start_loc, seq_lens=seq_lens)
    if not preserve_attn_chunk_size:
        if max_virtual_batches is not None or out is not None:
            raise ValueError(
                "preserve_attn_chunk_size=False clamps the chunk to max(seq_lens), a host read: not with "
                "max_virtual_batches/out (graph mode)"
            )
        if batch > 0:  # sglang's normalization (its numpy max raises on an empty batch; we keep C)
            chunk = max(page_size, min(chunk, int(seq_lens.max())) // page_size * page_size)
    if chunk % page_size:
        raise ValueError(f"attn_chunk_size ({chunk}) must be a multiple of page_size ({page_size})")
    pages_per_chunk = chunk // page_size
    if pages_per_chunk > _MAX_PAGES_PER_CHUNK:
        raise ValueError(
            f"attn_chunk_size / page_size must be at most {_MAX_PAGES_PER_CHUNK} pages (the fill's grid), got "
            f"{chunk} / {page_size} = {pages_per_chunk}"
        )
    if max_virtual_batches is not None:
        max_virtual_batches = check_int(max_virtual_batches, "max_virtual_batches", minimum=0)
    if out is not None:
        max_virtual_batches = _check_out(out, max_virtual_batches, pages_per_chunk, device)
    if max_virtual_batches is not None and max_virtual_batches > _MAX_VIRTUAL_BATCHES:
        raise ValueError(f"max_virtual_batches must be at most {_MAX_VIRTUAL_BATCHES}, got {max_virtual_batches}")
    if max_virtual_batches is not None and max_virtual_batches < batch:
        raise ValueError(
            f"max_virtual_batches ({max_virtual_batches}) must be at least the batch size {batch}: every request "
            "makes at least one virtual batch"
        )
    query_start_loc = query_start_loc.contiguous()
    seq_lens = seq_lens.contiguous()
    max_pages = block_table.shape[1]
    if validate:
        _validate_lengths(query_start_loc, seq_lens, page_size, max_pages)

    if on_host:
        out = _virtual_batches_on_host(query_start_loc, seq_lens, block_table, chunk, page_size,
                                       max_virtual_batches, validate, out)
        return _finish(out, validate, page_size, num_pages, numpy_mode)

    # graph mode without validation: one fused launch (count inside the fill kernel) for batches
    # up to _FUSED_MAX_BATCH; otherwise the count kernel first
    fused = max_virtual_batches is not None and not validate and 0 < batch <= _FUSED_MAX_BATCH
    cu_nblk = torch.empty(batch + 1, dtype=torch.int32, device=device)
    with device_guard(device):
        if fused:
            pass
        elif batch > 0:
            _local_vb_count_kernel[(1,)](
                query_start_loc, seq_lens, cu_nblk, batch, chunk, BLOCK_B=_SCAN_BLOCK, num_warps=4
            )
        else:
            cu_nblk.zero_()
        if max_virtual_batches is None:
            # the one host sync: V sizes the outputs, bounded by what block_table can hold
            num_out = min(max(int(cu_nblk[batch].item()), 0), _eager_bound(batch, max_pages, page_size, chunk))
        else:
            num_out = max_virtual_batches
            if validate:
                needed = int(cu_nblk[batch].item())
                if needed > num_out:
                    raise ValueError(f"the batch needs {needed} virtual batches, more than max_virtual_batches = {num_out}")
        if out is None:  # one allocation, four views (allocations dominate the cost of small calls)
            buf = torch.empty(num_out * (3 + pages_per_chunk) + 1, dtype=torch.int32, device=device)
            out = (
                buf[:num_out],
                buf[num_out : 2 * num_out + 1],
                buf[2 * num_out + 1 : 3 * num_out + 1],
                buf[3 * num_out + 1 :].view(num_out, pages_per_chunk),
            )
        seqlens_q_local, cu_seqlens_q_local, seqlens_k_local, block_table_local = out
        if batch == 0:
            for t in out:
                t.zero_()
        else:
            block_p = min(next_power_of_2(pages_per_chunk), 256)
            block_v = min(128, max(16, _FILL_ELEMENTS // block_p))
            block_b = next_power_of_2(batch) if fused else 1
            num_warps = 4
            if fused:
                block_v = min(block_v, max(_FUSED_MIN_V, _FUSED_LOOKUP // block_b))
                num_warps = 2 if block_b <= 128 else 4
            grid = (cdiv(num_out + 1, block_v), cdiv(pages_per_chunk, block_p))
            _local_vb_fill_kernel[grid](
                query_start_loc,
                seq_lens,
                cu_nblk,
                block_table if max_pages > 0 else cu_nblk,  # no columns: a placeholder, never read
                block_table.stride(0),
                block_table.stride(1),
                max_pages,
                seqlens_q_local,
                cu_seqlens_q_local,
                seqlens_k_local,
                block_table_local,
                block_table_local.stride(0),
                batch,
                num_out,
                chunk,
                page_size,
                pages_per_chunk,
                batch.bit_length(),
                BLOCK_V=block_v,
                BLOCK_P=block_p,
                FUSED_COUNT=fused,
                BLOCK_B=block_b,
                num_warps=num_warps,
            )
    return _finish(out, validate, page_size, num_pages, numpy_mode)


def _eager_bound(batch: int, max_pages: int, page_size: int, chunk: int) -> int:
    """Most virtual batches a call without ``max_virtual_batches`` makes: ``B * max(1, cdiv(max_pages
    * P, C))``, what a table of ``max_pages`` pages can hold (a request whose lengths fit its table,
    ``q <= s <= max_pages * P``, touches at most ``cdiv(s, C)`` chunks), and at most
    ``_MAX_VIRTUAL_BATCHES``. Impossible lengths (``validate=True`` rejects them) may need more: the
    outputs are then cut to this many, as graph mode cuts at ``max_virtual_batches``."""
    return min(batch * max(1, cdiv(max_pages * page_size, chunk)), _MAX_VIRTUAL_BATCHES)


def _finish(out: tuple, validate: bool, page_size: int, num_pages: int | None, numpy_mode: bool) -> tuple:
    """The four outputs as returned: checked with ``validate``; the three lengths as numpy arrays
    for numpy inputs (sglang's return types)."""
    seqlens_q_local, cu_seqlens_q_local, seqlens_k_local, block_table_local = out
    if validate:
        _validate_entries(seqlens_k_local, block_table_local, page_size, num_pages)
    if numpy_mode:
        return (
            seqlens_q_local.cpu().numpy(),
            cu_seqlens_q_local.cpu().numpy(),
            seqlens_k_local.cpu().numpy(),
            block_table_local,
        )
    return seqlens_q_local, cu_seqlens_q_local, seqlens_k_local, block_table_local


def _one_of(name: str, value, sglang_value):
    """``name`` or its sglang spelling ``name + '_np'``: exactly one must be given."""
    if value is not None and sglang_value is not None:
        raise TypeError(f"give {name} or {name}_np (sglang's name), not both")
    if value is None and sglang_value is None:
        raise TypeError(f"make_local_attention_virtual_batches() missing {name} (or {name}_np)")
    return value if value is not None else sglang_value


def _virtual_batches_on_host(query_start_loc, seq_lens, block_table, chunk: int, page_size: int,
                             max_virtual_batches: int | None, validate: bool, out: tuple | None) -> tuple:
    """The kernels' results computed by torch on the CPU (inputs on the CPU under a GPU backend).

    Same formulas as ``_request_geometry`` and the fill kernel, invalid input included (lengths
    clamped at 0, table columns clamped into the table), so both paths give equal outputs."""
    batch, max_pages = block_table.shape
    pages_per_chunk = chunk // page_size
    qsl = query_start_loc.long()
    q0, q1 = qsl[:-1], qsl[1:]
    q = (q1 - q0).clamp_min(0)
    s = seq_lens.long().clamp_min(0)
    first = torch.minimum(chunk - (s - q).clamp_min(0) % chunk, q)
    nblk = 1 + (q - first + chunk - 1) // chunk
    last_k = torch.where(s > 0, (s - 1) % chunk + 1, torch.zeros_like(s))
    needed = int(nblk.clamp(max=2**31 - 1).sum())  # (clamped: wild int64 lengths must not wrap the sum)
    if max_virtual_batches is None:
        num_out = min(needed, _eager_bound(batch, max_pages, page_size, chunk))
    else:
        num_out = max_virtual_batches
    if validate and needed > num_out:
        raise ValueError(f"the batch needs {needed} virtual batches, more than max_virtual_batches = {num_out}")
    v = torch.arange(num_out + 1)
    active = v < needed
    # (each request's count capped at the rows kept: the repeat never allocates more than they need)
    b = torch.repeat_interleave(torch.arange(batch), nblk.clamp(max=num_out + 1))[: num_out + 1]
    b = torch.cat([b, torch.zeros(num_out + 1 - b.shape[0], dtype=torch.long)])
    a = v - (torch.cumsum(nblk, 0) - nblk)[b] if batch else v
    zero = torch.zeros_like(v)
    if batch:
        nb, qb, fb, lb, sb = nblk[b], q[b], first[b], last_k[b], s[b]
        q_local = torch.where(a == 0, fb, torch.minimum(qb - fb - chunk * (a - 1), torch.full_like(a, chunk)))
        q_before = torch.where(a == 0, zero, fb + chunk * (a - 1))
        k_local = torch.where(a == nb - 1, lb, torch.full_like(a, chunk))
        base, end = qsl[0], qsl[batch]
        cu = torch.where(active, q0[b] - base + q_before, end - base)
        k_start = (sb - ((nb - 1 - a) * chunk + lb)).clamp_min(0)
        cols = (k_start // page_size)[:, None] + torch.arange(pages_per_chunk)[None, :]
        cols = cols.clamp(0, max(max_pages - 1, 0))
        read = active[:, None] & (max_pages > 0)
        entries = block_table[b[:, None], cols] if max_pages > 0 else torch.zeros_like(cols)
        table = torch.where(read, entries.long(), 0)
    else:
        q_local = k_local = cu = zero
        table = torch.zeros(num_out + 1, pages_per_chunk, dtype=torch.long)
    results = (
        torch.where(active, q_local, zero)[:num_out],
        cu,
        torch.where(active, k_local, zero)[:num_out],
        table[:num_out],
    )
    if out is None:
        return tuple(t.to(torch.int32) for t in results)
    for dst, src in zip(out, results):
        dst.copy_(src)
    return tuple(out)


def _validate_lengths(query_start_loc, seq_lens, page_size: int, max_pages: int) -> None:
    q_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    seq = seq_lens.long()
    if bool((q_lens < 0).any()):
        raise ValueError("query_start_loc must be non-decreasing")
    if bool((seq < q_lens).any()):
        b = int(torch.nonzero(seq < q_lens)[0, 0])
        raise ValueError(f"seq_lens[{b}] = {int(seq[b])} is less than the request's {int(q_lens[b])} queries")
    if bool(((seq + page_size - 1) // page_size > max_pages).any()):
        b = int(torch.nonzero((seq + page_size - 1) // page_size > max_pages)[0, 0])
        raise ValueError(
            f"seq_lens[{b}] = {int(seq[b])} needs more pages than block_table has columns ({max_pages}, page_size {page_size})"
        )


def _validate_entries(seqlens_k_local, block_table_local, page_size: int, num_pages: int | None) -> None:
    cols = torch.arange(block_table_local.shape[1], device=block_table_local.device)
    used = cols[None, :] * page_size < seqlens_k_local[:, None].long()
    bad = block_table_local < 0
    if num_pages is not None:
        bad |= block_table_local >= num_pages
    bad &= used
    if bool(bad.any()):
        v, j = (int(x) for x in torch.nonzero(bad)[0])
        raise ValueError(
            f"block_table entry {int(block_table_local[v, j])} (virtual batch {v}, column {j}) is outside the page "
            f"pool [0, {num_pages if num_pages is not None else 'num_pages'})"
        )
