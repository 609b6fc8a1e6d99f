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
import triton
import triton.language as tl

from .. import device as _device
from .. import tune
from .._common import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    MAX_GRID_DIM_1,
    block_rows,
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
    gdc_launch_dependents,
    interpreter_float32,
    next_power_of_2,
    exp2_shifted,
    online_max,
    paged_rows_descriptors,
    tile_row,
    clamp_page,
    register_xpu_compile,
    rows_descriptor,
    softmax_step,
    validate_lengths_and_pages,
    validate_query_offsets,
    whole_wave_splits,
)
from .merge_state import combine_splits

#: head dims (D and Dv) the paged kernel takes: multiples of 8 up to MAX_HEAD_DIM; tiles are the next
#: power of two (at least 16, tl.dot's K) with the padded channels masked
MAX_HEAD_DIM = 512

# How queries map to programs (constexpr Q_MAPPING):
_UNIFORM = 0  # q given as [B, S, ...]: request b owns rows b*S .. b*S+S-1
_PER_REQUEST = 1  # grid of B x cdiv(max_seqlen_q, BLOCK_Q) programs, lengths from cu_seqlens_q
_SEARCH = 2  # grid of cdiv(total_q, BLOCK_Q) + B programs, request found by binary search


@triton.jit
def _find_request(cu_seqlens_q_ptr, pid, batch, BLOCK_Q: tl.constexpr):
    """Largest b with ``cu_seqlens_q[b] // BLOCK_Q + b <= pid`` (vLLM's varlen tile numbering:
    request b's query tiles are numbered from ``cu_seqlens_q[b] // BLOCK_Q + b``)."""
    lo = tl.zeros([], dtype=tl.int32)
    hi = lo + batch - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first_tile = tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid
        if first_tile <= pid:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit
def _tile_scores(q, k, key, key_valid, row_lo, row_hi, masked, qk_scale, softcap,
                 HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, SCALE_IN_EXP: tl.constexpr = False):
    """Base-2 logits of one key tile (``k`` is ``[D, BLOCK_N]``), soft-capped, then masked per
    element only when ``masked`` (tiles some row sees only in part); with ``SCALE_IN_EXP`` the
    unscaled scores, masked (the softmax applies ``qk_scale`` inside its exponent)."""
    s = _score_dot(q, k, DOT_PRECISION)
    if not SCALE_IN_EXP:
        s = s * qk_scale
    return _logits(s, key, key_valid, row_lo, row_hi, masked, softcap, HAS_SOFTCAP)


@triton.jit
def _score_dot(q, k, DOT_PRECISION: tl.constexpr):
    """``q @ k`` in fp32, ``k`` cast to q's dtype (both dot operands one dtype): the one score dot
    of the paged kernel, whole or per head-dim chunk."""
    return tl.dot(q, k.to(q.dtype), out_dtype=tl.float32, input_precision=DOT_PRECISION)


@triton.jit
def _logits(s, key, key_valid, row_lo, row_hi, masked, softcap, HAS_SOFTCAP: tl.constexpr):
    """Scaled scores ``s`` to base-2 logits: soft-capped, then masked per element only when
    ``masked``."""
    LOG2E: tl.constexpr = 1.4426950408889634
    if HAS_SOFTCAP:
        # cap * tanh(s / cap), with tanh(x) = 1 - 2 / (exp(2x) + 1); then to base 2
        s = softcap * (1.0 - 2.0 / (tl.exp2(s * (2.0 * LOG2E / softcap)) + 1.0)) * LOG2E
    if masked:
        visible = key_valid[None, :] & (key[None, :] >= row_lo[:, None]) & (key[None, :] <= row_hi[:, None])
        s = tl.where(visible, s, float("-inf"))
    return s


@triton.jit
def _accumulate(acc, alpha, p, v, DOT_PRECISION: tl.constexpr, RESCALE: tl.constexpr = True):
    """``acc * alpha + P @ V`` in fp32 (P in V's operand dtype: both dot operands one dtype);
    ``acc + P @ V`` without ``RESCALE``."""
    p = p.to(v.dtype)
    if RESCALE:
        acc = acc * alpha[:, None]
    return tl.dot(p, v, acc, out_dtype=tl.float32, input_precision=DOT_PRECISION)


@triton.jit
def _query_chunk(q, col, head_dim, SCORE_CHUNK: tl.constexpr, QO_BLOCK: tl.constexpr, QO_DESC: tl.constexpr = False):
    """Columns ``col .. col + SCORE_CHUNK - 1`` of the program's q rows: ``q`` is a block
    pointer (``QO_BLOCK``), a device-side tensor descriptor whose block 0 holds the rows
    (``QO_DESC``) or a pointer tensor over the first chunk (rows no query owns point at a valid
    row; they are never stored); columns past ``head_dim`` read 0."""
    if QO_BLOCK:
        chunk = tl.load(tl.advance(q, (0, col)), boundary_check=(0, 1), padding_option="zero")
    elif QO_DESC:
        chunk = q.load([0, col])
    else:
        chunk = tl.load(q + col, mask=(col + tl.arange(0, SCORE_CHUNK))[None, :] < head_dim, other=0.0)
    return chunk


@triton.jit
def _chunk_dot(q_chunk, k_tile, stride_k_tok, head_dim, rows, skip, col, BLOCK_N: tl.constexpr,
               SCORE_CHUNK: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_LOAD: tl.constexpr = 2):
    """``q_chunk @ K^T`` over head-dim columns ``col ..`` of a key tile read through block
    pointers (``KV_LOAD = 2``) or device-side tensor descriptors (3)."""
    if KV_LOAD == 3:  # the tile's whole rows, read at column col (no descriptor of zero columns)
        k = tl.trans(rows_descriptor(k_tile, stride_k_tok, head_dim, rows, BLOCK_N, SCORE_CHUNK).load([-skip, col]))
    else:
        k = tl.load(block_rows(k_tile + col, stride_k_tok, tl.maximum(head_dim - col, 0), rows, skip, BLOCK_N,
                                SCORE_CHUNK, True),
                    boundary_check=(0, 1), padding_option="zero")
    return _score_dot(q_chunk, k, DOT_PRECISION)


@triton.jit
def _query_rows_block(base, q_start, q_len, q_tile, kv_head, head_block, group_size, stride_t, stride_h, width,
                      BLOCK_Q: tl.constexpr, HEADS_PER_BLOCK: tl.constexpr, BLOCK_W: tl.constexpr):
    """Block pointer over a program's ``[BLOCK_Q * HEADS_PER_BLOCK, width]`` rows of q (or out)
    where they form a plain 2D block: one token's heads (``BLOCK_Q = 1``: rows past the KV head's
    group are out of bounds) or one head's tokens (``HEADS_PER_BLOCK = 1``: rows past the request
    are out of bounds). Out-of-bounds rows read 0 and are never written."""
    if BLOCK_Q == 1:
        first_head = kv_head * group_size
        block = tl.make_block_ptr(base + (q_start + q_tile).to(tl.int64) * stride_t, shape=(first_head + group_size, width),
                                  strides=(stride_h, 1), offsets=(first_head + head_block * HEADS_PER_BLOCK, 0),
                                  block_shape=(HEADS_PER_BLOCK, BLOCK_W), order=(1, 0))
    else:
        head = kv_head * group_size + head_block
        block = tl.make_block_ptr(base + head.to(tl.int64) * stride_h, shape=(q_start + q_len, width),
                                  strides=(stride_t, 1), offsets=(q_start + q_tile * BLOCK_Q, 0),
                                  block_shape=(BLOCK_Q, BLOCK_W), order=(1, 0))
    return block


@triton.jit
def _query_rows_desc(base, q_start, q_len, q_tile, kv_head, head_block, group_size, stride_t, stride_h, width,
                     BLOCK_Q: tl.constexpr, HEADS_PER_BLOCK: tl.constexpr, BLOCK_W: tl.constexpr):
    """``_query_rows_block``'s rows as a device-side tensor descriptor (``QO_DESC``, Intel GPUs
    where Triton has descriptors) whose block at ``[0, 0]`` holds them: the descriptor starts at
    the program's first row, so rows past the group / the request are outside it (read 0, never
    written). q / out must be 16-byte aligned with aligned row pitches (the launcher checks)."""
    if BLOCK_Q == 1:
        first = kv_head * group_size + head_block * HEADS_PER_BLOCK
        desc = rows_descriptor(base + (q_start + q_tile).to(tl.int64) * stride_t + first.to(tl.int64) * stride_h,
                               stride_h, width, (kv_head + 1) * group_size - first, HEADS_PER_BLOCK, BLOCK_W)
    else:
        head = kv_head * group_size + head_block
        first = q_tile * BLOCK_Q
        desc = rows_descriptor(base + head.to(tl.int64) * stride_h + (q_start + first).to(tl.int64) * stride_t,
                               stride_t, width, tl.maximum(q_len - first, 0), BLOCK_Q, BLOCK_W)
    return desc


@triton.jit
def _tile(
    q, acc, m_i, l_i, n0, kv_start, key_lo, end, masked, row_lo, row_hi, qk_scale, softcap,
    pt_row, pool_size, k_base, stride_k_page, stride_k_tok, v_base, stride_v_page, stride_v_tok,
    head_dim, head_dim_v,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PAGE_SIZE: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, HOIST_GATHER: tl.constexpr,
    KV_LOAD: tl.constexpr = 0, SCORE_CHUNK: tl.constexpr = 0, QO_BLOCK: tl.constexpr = False,
    INTEL_GPU: tl.constexpr = False, page_ids=0, PAGE_IDS_GIVEN: tl.constexpr = False, QO_DESC: tl.constexpr = False,
    SCALE_IN_EXP: tl.constexpr = False,
):
    """One key tile through masked loads: pointer loads (any page size: pages shorter than the
    tile are gathered row by row; ``PAGE_SIZE = 0``: contiguous rows from ``kv_start`` on) or, with
    ``KV_LOAD = 2`` (a tile inside one page, or contiguous K/V), block pointers over the tile's
    visible rows (2D block reads on Intel GPUs), with ``KV_LOAD = 3`` device-side tensor
    descriptors over them (Triton >= 3.4; Intel's Triton lowers them to 2D block reads). Keys outside ``[key_lo, end)`` are not loaded: no
    query may see them, and a freed slot can hold NaN (masking the score would not stop
    ``0 * NaN`` in ``P @ V``). ``SCORE_CHUNK > 0`` (``KV_LOAD`` 2 or 3): the score dot runs over
    head-dim chunks of that width, q read chunk by chunk (``q`` is then a block pointer when
    ``QO_BLOCK``, a tensor descriptor when ``QO_DESC``, else a pointer tensor, over its first
    chunk), so no sub-group holds the whole
    ``[D, BLOCK_N]`` K^T tile beside q (XPU registers at D > 128). A page id outside the
    ``pool_size`` pages of the cache is never followed (``validate=False`` trusts the table): the
    pool's last page is read in its place (``clamp_page``). ``PAGE_IDS_GIVEN``: pages shorter than
    the tile, per-key gathers: ``page_ids`` holds the tile's page ids, read a tile ahead by the caller."""
    offs_n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    key = n0 + offs_n
    key_valid = (key >= key_lo) & (key < end)
    if KV_LOAD >= 2:
        # the visible rows of the tile, [n0 + skip, n0 + skip + rows), through block pointers
        # (KV_LOAD 2) or device-side tensor descriptors (3): rows outside them read 0
        skip = tl.maximum(key_lo - n0, 0)
        rows = tl.minimum(end - n0, BLOCK_N) - skip
        if PAGE_SIZE == 0:
            first = (kv_start + n0 + skip).to(tl.int64)
            k_tile = k_base + first * stride_k_tok
            v_tile = v_base + first * stride_v_tok
        else:
            page = clamp_page(tl.load(pt_row + n0 // PAGE_SIZE), pool_size).to(tl.int64)
            first = (n0 % PAGE_SIZE + skip).to(tl.int64)
            k_tile = k_base + page * stride_k_page + first * stride_k_tok
            v_tile = v_base + page * stride_v_page + first * stride_v_tok
        if KV_LOAD == 3:
            if SCORE_CHUNK == 0:
                k = tl.trans(rows_descriptor(k_tile, stride_k_tok, head_dim, rows, BLOCK_N, BLOCK_D).load([-skip, 0]))
        elif SCORE_CHUNK == 0:
            k = tl.load(block_rows(k_tile, stride_k_tok, head_dim, rows, skip, BLOCK_N, BLOCK_D, True),
                        boundary_check=(0, 1), padding_option="zero")
    else:
        if PAGE_SIZE >= BLOCK_N:
            # the whole tile lies in one page: one page-table read, contiguous token rows
            page = clamp_page(tl.load(pt_row + n0 // PAGE_SIZE), pool_size).to(tl.int64)
            k_rows = page * stride_k_page + (n0 % PAGE_SIZE + offs_n).to(tl.int64) * stride_k_tok
            v_rows = page * stride_v_page + (n0 % PAGE_SIZE + offs_n).to(tl.int64) * stride_v_tok
        elif PAGE_SIZE == 0:
            # contiguous K/V (flash_attn_varlen_func): the tile is rows kv_start + key, no page table
            k_rows = (kv_start + key).to(tl.int64) * stride_k_tok
            v_rows = (kv_start + key).to(tl.int64) * stride_v_tok
        elif HOIST_GATHER and PAGE_SIZE > 1:
            # pages shorter than the tile (both powers of two, n0 a multiple of BLOCK_N): a row's page
            # slot is n0 // PAGE_SIZE + offs_n // PAGE_SIZE and its token in the page offs_n % PAGE_SIZE,
            # a scalar plus loop-invariant parts: no per-row division in the key loop. H100, P = 16
            # prefill 1.07-1.13x; on decode-shaped tiles mixed (q_len 1 0.96-0.97x the time, one q_len-4
            # draft tile 1.19x), so the launcher asks for it on prefill only. P = 1, whose // and % fold
            # away, keeps the per-key form below (0.98-0.99x this way; experiments/gather_addressing.txt).
            # The two branches keep their own k_rows / v_rows lines: one shared `key % PAGE_SIZE` value
            # changes the decode PTX (128 more instructions at P = 16), the code all timings were taken on
            page = tl.load(pt_row + n0 // PAGE_SIZE + offs_n // PAGE_SIZE, mask=key_valid, other=0)
            page = clamp_page(page, pool_size).to(tl.int64)
            k_rows = page * stride_k_page + (offs_n % PAGE_SIZE).to(tl.int64) * stride_k_tok
            v_rows = page * stride_v_page + (offs_n % PAGE_SIZE).to(tl.int64) * stride_v_tok
        else:
            if PAGE_IDS_GIVEN:
                page = page_ids
            else:
                page = tl.load(pt_row + key // PAGE_SIZE, mask=key_valid, other=0)
            if INTEL_GPU:  # clamped at 64 bits: at 32, IGC spilled 704 B a thread (B580, P = 1 prefill)
                page = page.to(tl.int64)
            page = clamp_page(page, pool_size).to(tl.int64)
            k_rows = page * stride_k_page + (key % PAGE_SIZE).to(tl.int64) * stride_k_tok
            v_rows = page * stride_v_page + (key % PAGE_SIZE).to(tl.int64) * stride_v_tok
        k = tl.load(
            k_base + k_rows[None, :] + d[:, None],
            mask=key_valid[None, :] & (d[:, None] < head_dim),
            other=0.0,
        )
    if SCORE_CHUNK > 0:
        for c in tl.static_range(BLOCK_D // SCORE_CHUNK):
            q_chunk = _query_chunk(q, c * SCORE_CHUNK, head_dim, SCORE_CHUNK, QO_BLOCK, QO_DESC)
            part = _chunk_dot(q_chunk, k_tile, stride_k_tok, head_dim, rows, skip, c * SCORE_CHUNK, BLOCK_N,
                              SCORE_CHUNK, DOT_PRECISION, KV_LOAD)
            s = part if c == 0 else s + part
        if not SCALE_IN_EXP:
            s = s * qk_scale
        s = _logits(s, key, key_valid, row_lo, row_hi, masked, softcap, HAS_SOFTCAP)
        operand_dtype = q_chunk.dtype
    else:
        s = _tile_scores(q, k, key, key_valid, row_lo, row_hi, masked, qk_scale, softcap, HAS_SOFTCAP, DOT_PRECISION,
                         SCALE_IN_EXP)
        operand_dtype = q.dtype
    p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, qk_scale, SCALE_IN_EXP)
    if KV_LOAD == 3:
        v = rows_descriptor(v_tile, stride_v_tok, head_dim_v, rows, BLOCK_N, BLOCK_DV).load([-skip, 0])
    elif KV_LOAD == 2:
        v = tl.load(block_rows(v_tile, stride_v_tok, head_dim_v, rows, skip, BLOCK_N, BLOCK_DV, False),
                    boundary_check=(0, 1), padding_option="zero")
    else:
        v = tl.load(
            v_base + v_rows[:, None] + dv[None, :],
            mask=key_valid[:, None] & (dv[None, :] < head_dim_v),
            other=0.0,
        )
    return _accumulate(acc, alpha, p, v.to(operand_dtype), DOT_PRECISION), m_i, l_i


@triton.jit
def _descriptor_tile(
    q, acc, m_i, l_i, n0, row, masked, row_lo, row_hi, qk_scale, softcap,
    k_desc, k_col, v_desc, v_col,
    BLOCK_N: tl.constexpr, HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, SCALE_IN_EXP: tl.constexpr,
):
    """One key tile of whole valid rows of one page (cache row ``row`` on; ``PAGE_SIZE >= BLOCK_N``)
    through tensor descriptors over the caches seen as ``[pages * PAGE_SIZE, row]`` (TMA on Hopper, 2D block IO
    on Intel GPUs). The caller gives it only tiles whose every key some row may see: a row no query
    may see can hold NaN, and ``0 * NaN`` in ``P @ V`` would reach the output."""
    key = n0 + tl.arange(0, BLOCK_N)
    k = tl.trans(k_desc.load([row, k_col]))
    s = _tile_scores(q, k, key, key >= 0, row_lo, row_hi, masked, qk_scale, softcap, HAS_SOFTCAP, DOT_PRECISION,
                     SCALE_IN_EXP)
    p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, qk_scale, SCALE_IN_EXP)
    v = v_desc.load([row, v_col])
    return _accumulate(acc, alpha, p, v.to(q.dtype), DOT_PRECISION), m_i, l_i


@triton.jit
def _two_pages_tile(
    q, acc, m_i, l_i, n0, row0, row1, masked, row_lo, row_hi, qk_scale, softcap,
    k_desc, k_col, v_desc, v_col,
    PAGE_SIZE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, SCALE_IN_EXP: tl.constexpr,
):
    """One key tile of two whole pages (``BLOCK_N = 2 * PAGE_SIZE``; cache rows ``row0``, ``row1``)
    through one tensor-descriptor load per page: a score dot per page, one softmax update for
    the tile, P @ V page by page into the accumulator. The caller gives it only tiles whose every
    key some row may see (as ``_descriptor_tile``)."""
    offs = tl.arange(0, PAGE_SIZE)
    s0 = _tile_scores(q, tl.trans(k_desc.load([row0, k_col])), n0 + offs, offs >= 0, row_lo, row_hi, masked,
                      qk_scale, softcap, HAS_SOFTCAP, DOT_PRECISION, SCALE_IN_EXP)
    s1 = _tile_scores(q, tl.trans(k_desc.load([row1, k_col])), n0 + PAGE_SIZE + offs, offs >= 0, row_lo, row_hi,
                      masked, qk_scale, softcap, HAS_SOFTCAP, DOT_PRECISION, SCALE_IN_EXP)
    tile_max = tl.maximum(tl.max(s0, axis=1), tl.max(s1, axis=1))
    if SCALE_IN_EXP:
        tile_max = tile_max * qk_scale
    m_new, m_safe, alpha = online_max(m_i, tile_max)
    p0 = exp2_shifted(s0, qk_scale, m_safe, SCALE_IN_EXP)
    p1 = exp2_shifted(s1, qk_scale, m_safe, SCALE_IN_EXP)
    l_i = l_i * alpha + tl.sum(p0, axis=1) + tl.sum(p1, axis=1)
    acc = _accumulate(acc, alpha, p0, v_desc.load([row0, v_col]).to(q.dtype), DOT_PRECISION)
    p1 = p1.to(q.dtype)  # before V's load: the instruction order that was measured (1.18-1.31x)
    acc = _accumulate(acc, alpha, p1, v_desc.load([row1, v_col]).to(q.dtype), DOT_PRECISION, False)
    return acc, m_new, l_i


@triton.jit
def _descriptor_tiles(
    q, acc, m_i, l_i, lo, hi, mask_lo, mask_hi, row_lo, row_hi, qk_scale, softcap, pt_row, kv_start,
    k_desc, k_col, v_desc, v_col,
    MASK: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SCALE_IN_EXP: tl.constexpr,
):
    """The key tiles ``[lo, hi)`` (whole tiles, every key some row may see) through tensor
    descriptors: one load per tile (contiguous K/V, pages of whole tiles) or per page (two pages a
    tile). Each tile's cache rows are read one tile ahead, so the loads never wait on the page
    table (H100, 32/8/128 prefill at 64-token pages: 434 -> 455 TF/s). The per-element mask:
    ``MASK`` = 0 never, 1 always (compile-time: loops of their own), 2 on the tiles outside
    ``[mask_lo, mask_hi)`` (a branch in the loop body)."""
    if PAGE_SIZE == 0 or PAGE_SIZE >= BLOCK_N:
        next_row = tile_row(pt_row, kv_start, lo, hi, PAGE_SIZE)
        for n0 in range(lo, hi, BLOCK_N):
            row = next_row
            next_row = tile_row(pt_row, kv_start, n0 + BLOCK_N, hi, PAGE_SIZE)
            masked = MASK == 1
            if MASK == 2:
                masked = (n0 < mask_lo) | (n0 >= mask_hi)
            acc, m_i, l_i = _descriptor_tile(
                q, acc, m_i, l_i, n0, row, masked, row_lo, row_hi, qk_scale, softcap,
                k_desc, k_col, v_desc, v_col, BLOCK_N, HAS_SOFTCAP, DOT_PRECISION, SCALE_IN_EXP)
    else:
        HALF: tl.constexpr = BLOCK_N // 2
        next_row0 = tile_row(pt_row, kv_start, lo, hi, PAGE_SIZE)
        next_row1 = tile_row(pt_row, kv_start, lo + HALF, hi, PAGE_SIZE)
        for n0 in range(lo, hi, BLOCK_N):
            row0 = next_row0
            row1 = next_row1
            next_row0 = tile_row(pt_row, kv_start, n0 + BLOCK_N, hi, PAGE_SIZE)
            next_row1 = tile_row(pt_row, kv_start, n0 + BLOCK_N + HALF, hi, PAGE_SIZE)
            masked = MASK == 1
            if MASK == 2:
                masked = (n0 < mask_lo) | (n0 >= mask_hi)
            acc, m_i, l_i = _two_pages_tile(
                q, acc, m_i, l_i, n0, row0, row1, masked, row_lo, row_hi, qk_scale, softcap,
                k_desc, k_col, v_desc, v_col, HALF, HAS_SOFTCAP, DOT_PRECISION, SCALE_IN_EXP)
    return acc, m_i, l_i


@triton.jit
def _nan_rows_past_grid(cu_seqlens_q_ptr, batch, tiles_per_request, kv_head, head_block, dv, split, total_q,
                        group_size, head_dim_v, out_ptr, stride_o_t, stride_o_h, lse_ptr, stride_lse_h, stride_lse_t,
                        partial_out_ptr, stride_po_t, stride_po_h, stride_po_s, partial_lse_ptr, stride_pl_t,
                        stride_pl_h, BLOCK_Q: tl.constexpr, HEADS_PER_BLOCK: tl.constexpr, SPLIT_KV: tl.constexpr,
                        WRITE_LSE: tl.constexpr):
    """Requests longer than ``max_seqlen_q`` (``validate=False`` trusts it): no program of the
    per-request grid owns their rows past ``tiles_per_request * BLOCK_Q``, so the padding program
    writes them NaN (output and LSE; a split's partial output NaN with LSE 0, so the combined output
    is NaN), one token's heads at a time: only impossible input has such rows. The requests are
    scanned 128 at a time; a chunk none of whose requests is that long costs two vector loads.
    (Written by the attention programs themselves, after their key loop, this kept values live
    across it: H100 prefill 1.5-2.8% slower, and the 8-warp 32/8/64 tile past 128 registers, 1.47x:
    bench/results/NVIDIA_H100_80GB_HBM3/experiments/prefill_regression.txt.)"""
    grid_rows = tiles_per_request * BLOCK_Q
    requests = tl.arange(0, 128)
    dv_ok = dv < head_dim_v
    head_in_group = head_block * HEADS_PER_BLOCK + tl.arange(0, HEADS_PER_BLOCK)
    row_ok = head_in_group < group_size
    q_head = kv_head * group_size + head_in_group
    nan_rows = tl.full([HEADS_PER_BLOCK, dv.shape[0]], float("nan"), tl.float32)
    for b0 in range(0, batch, 128):
        inside = b0 + requests < batch
        starts = tl.load(cu_seqlens_q_ptr + b0 + requests, mask=inside, other=0)
        ends = tl.load(cu_seqlens_q_ptr + b0 + requests + 1, mask=inside, other=0)
        if tl.max(ends - starts, axis=0) > grid_rows:
            for b in range(b0, tl.minimum(b0 + 128, batch)):
                q_start = tl.load(cu_seqlens_q_ptr + b)
                q_end = tl.minimum(tl.load(cu_seqlens_q_ptr + b + 1), total_q).to(tl.int64)
                for token in range(tl.maximum(q_start + grid_rows, 0).to(tl.int64), q_end):
                    if SPLIT_KV:
                        tl.store(partial_out_ptr + token * stride_po_t + q_head[:, None] * stride_po_h
                                 + split * stride_po_s + dv[None, :], nan_rows, mask=row_ok[:, None] & dv_ok[None, :])
                        tl.store(partial_lse_ptr + token * stride_pl_t + q_head * stride_pl_h + split,
                                 tl.zeros([HEADS_PER_BLOCK], tl.float32), mask=row_ok)
                    else:
                        tl.store(out_ptr + token * stride_o_t + q_head[:, None] * stride_o_h + dv[None, :],
                                 nan_rows.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])
                        if WRITE_LSE:
                            tl.store(lse_ptr + q_head * stride_lse_h + token * stride_lse_t,
                                     tl.full([HEADS_PER_BLOCK], float("nan"), tl.float32), mask=row_ok)


@triton.jit
def _nan_rows_of_request(q_start, q_len, q_tile, tiles_per_request, rows, head_in_group, q_head, dv, split, total_q,
                        group_size, head_dim_v, out_ptr, stride_o_t, stride_o_h, lse_ptr, stride_lse_h, stride_lse_t,
                        partial_out_ptr, stride_po_t, stride_po_h, stride_po_s, partial_lse_ptr, stride_pl_t,
                        stride_pl_h, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, HEADS_PER_BLOCK: tl.constexpr,
                        BLOCK_DV: tl.constexpr, SPLIT_KV: tl.constexpr, WRITE_LSE: tl.constexpr):
    """``_nan_rows_past_grid`` for one request, written by the program of its last tile (Intel
    GPUs: IGC spilled 64-192 B a thread on the varlen D = 128 tile with the padding program's scan,
    whose reduction its allocator keeps beside the attention's registers)."""
    if q_tile == tiles_per_request - 1:
        for r0 in range(tiles_per_request * BLOCK_Q, q_len, BLOCK_Q):
            extra = (q_start + r0 + rows // HEADS_PER_BLOCK).to(tl.int64)
            extra_ok = ((r0 + rows // HEADS_PER_BLOCK < q_len) & (head_in_group < group_size) & (extra >= 0)
                        & (extra < total_q))
            nan_rows = tl.full([BLOCK_M, BLOCK_DV], float("nan"), tl.float32)
            if SPLIT_KV:
                tl.store(partial_out_ptr + extra[:, None] * stride_po_t + q_head[:, None] * stride_po_h
                         + split * stride_po_s + dv[None, :], nan_rows,
                         mask=extra_ok[:, None] & (dv[None, :] < head_dim_v))
                tl.store(partial_lse_ptr + extra * stride_pl_t + q_head * stride_pl_h + split,
                         tl.zeros([BLOCK_M], tl.float32), mask=extra_ok)
            else:
                tl.store(out_ptr + extra[:, None] * stride_o_t + q_head[:, None] * stride_o_h + dv[None, :],
                         nan_rows.to(out_ptr.dtype.element_ty), mask=extra_ok[:, None] & (dv[None, :] < head_dim_v))
                if WRITE_LSE:
                    tl.store(lse_ptr + q_head * stride_lse_h + extra * stride_lse_t,
                             tl.full([BLOCK_M], float("nan"), tl.float32), mask=extra_ok)


@triton.jit
def _paged_attention_kernel(
    q_ptr, stride_q_t, stride_q_h,
    k_cache_ptr, stride_k_page, stride_k_tok, stride_k_head,
    v_cache_ptr, stride_v_page, stride_v_tok, stride_v_head,
    k_desc, v_desc,
    page_table_ptr, stride_pt_b, max_pages, pool_size,
    cache_seqlens_ptr,
    cu_seqlens_q_ptr,
    cu_seqlens_k_ptr,
    seqused_q_ptr,
    k_descale_ptr, stride_kd_b, stride_kd_h,
    v_descale_ptr, stride_vd_b, stride_vd_h,
    sinks_ptr,
    out_ptr, stride_o_t, stride_o_h,
    lse_ptr, stride_lse_h, stride_lse_t,
    partial_out_ptr, stride_po_t, stride_po_h, stride_po_s,
    partial_lse_ptr, stride_pl_t, stride_pl_h,
    batch, total_q, num_q_programs, uniform_q_len, tiles_per_request, num_head_blocks,
    group_size, head_dim, head_dim_v,
    sm_scale, softcap, window_left, window_right,
    num_kv_splits, min_split_tokens,
    Q_MAPPING: tl.constexpr,
    PAD_ROWS: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HEADS_PER_BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_K_DESCALE: tl.constexpr,
    HAS_V_DESCALE: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    KV_LOAD: tl.constexpr = 0,
    HOIST_GATHER: tl.constexpr = False,
    SCORE_CHUNK: tl.constexpr = 0,
    INTEL_GPU: tl.constexpr = False,
    HAS_SEQUSED_Q: tl.constexpr = False,
    PREFETCH_PAGES: tl.constexpr = False,
    NUM_DV: tl.constexpr = 1,
    LAUNCH_DEPENDENTS: tl.constexpr = False,
    HEADS_FIRST: tl.constexpr = False,
    QO_DESC: tl.constexpr = False,
    SCALE_IN_EXP: tl.constexpr = False,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * HEADS_PER_BLOCK
    # where the NaN rows past max_seqlen_q are written: by the padding program (_nan_rows_past_grid),
    # except on Intel GPUs, where the program of a request's last tile writes them
    # (_nan_rows_of_request): after the key loop, or before it on prefill tiles, where after it IGC
    # spilled 384-704 B a thread (experiments/untrusted_metadata.txt)
    NAN_ROWS_IN_PAD: tl.constexpr = not INTEL_GPU
    NAN_ROWS_FIRST: tl.constexpr = INTEL_GPU and HOIST_GATHER
    NAN_ROWS_AFTER: tl.constexpr = INTEL_GPU and not HOIST_GATHER
    # PAGE_SIZE = 0: contiguous K/V (flash_attn_varlen_func). Request b's keys are the rows
    # cu_seqlens_k[b] + key of k / v [total_k, H_kv, D] (token stride stride_k_tok); there is no
    # page table, and cache_seqlens holds seqused_k (or cu_seqlens_k[1:], see the launcher).
    CONTIGUOUS_KV: tl.constexpr = PAGE_SIZE == 0
    LOG2E: tl.constexpr = 1.4426950408889634
    LN2: tl.constexpr = 0.6931471805599453

    if SPLIT_KV and LAUNCH_DEPENDENTS:
        # the split combine, launched programmatically after this kernel, may start as soon as
        # every program of this grid has (it waits in-kernel for this grid's writes)
        gdc_launch_dependents()
    if HEADS_FIRST:
        # grid (heads, query programs, splits): the KV heads of one request are neighbouring
        # programs, dispatched together
        pid_q = tl.program_id(1)
        heads_pid = tl.program_id(0)
    else:
        pid_q = tl.program_id(0)
        heads_pid = tl.program_id(1)
    if NUM_DV > 1:
        # the output channels split across NUM_DV programs of BLOCK_DV each (Intel GPUs at Dv > 256:
        # the whole [rows, Dv] accumulator beside the V tile spills): every program computes the
        # same scores (so the same LSE, to the bit) and its slice of P @ V. From here on V, out
        # and the split partials start at the slice, head_dim_v is what is left of the row
        dv_start = (heads_pid % NUM_DV) * BLOCK_DV
        heads_pid = heads_pid // NUM_DV
        v_cache_ptr += dv_start
        out_ptr += dv_start
        partial_out_ptr += dv_start
        head_dim_v -= dv_start
    kv_head = heads_pid // num_head_blocks
    head_block = heads_pid % num_head_blocks
    split = tl.program_id(2)

    rows = tl.arange(0, BLOCK_M)
    head_in_group = head_block * HEADS_PER_BLOCK + rows % HEADS_PER_BLOCK
    q_head = kv_head * group_size + head_in_group
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)

    if PAD_ROWS:
        # one extra program per head block defines the rows past cu_seqlens_q[B] (padding of a
        # ragged batch): output 0, LSE -inf, as for an empty request; and, per-request grid, the
        # rows of requests longer than max_seqlen_q: NaN
        if pid_q == num_q_programs:
            # (a negative cu_seqlens_q[B], which validate=False trusts, starts them at row 0)
            for r0 in range(tl.maximum(tl.load(cu_seqlens_q_ptr + batch), 0), total_q, BLOCK_Q):
                token = (r0 + rows // HEADS_PER_BLOCK).to(tl.int64)
                pad_mask = (token < total_q) & (head_in_group < group_size)
                if SPLIT_KV:
                    tl.store(partial_lse_ptr + token * stride_pl_t + q_head * stride_pl_h + split,
                             tl.full([BLOCK_M], float("-inf"), tl.float32), mask=pad_mask)
                else:
                    tl.store(out_ptr + token[:, None] * stride_o_t + q_head[:, None] * stride_o_h + dv[None, :],
                             tl.zeros([BLOCK_M, BLOCK_DV], dtype=out_ptr.dtype.element_ty),
                             mask=pad_mask[:, None] & (dv[None, :] < head_dim_v))
                    if WRITE_LSE:
                        tl.store(lse_ptr + q_head * stride_lse_h + token * stride_lse_t,
                                 tl.full([BLOCK_M], float("-inf"), tl.float32), mask=pad_mask)
            if Q_MAPPING == 1 and NAN_ROWS_IN_PAD:
                _nan_rows_past_grid(cu_seqlens_q_ptr, batch, tiles_per_request, kv_head, head_block, dv, split, total_q,
                                    group_size, head_dim_v, out_ptr, stride_o_t, stride_o_h, lse_ptr, stride_lse_h,
                                    stride_lse_t, partial_out_ptr, stride_po_t, stride_po_h, stride_po_s,
                                    partial_lse_ptr, stride_pl_t, stride_pl_h, BLOCK_Q, HEADS_PER_BLOCK, SPLIT_KV,
                                    WRITE_LSE)
            return

    # ---- which request and which of its query rows this program owns ----
    if Q_MAPPING < 2:
        # the last query tiles of every request first: with a causal mask they see the most keys,
        # so the cheap early tiles fill the tail of the grid instead of forming a last wave of
        # heavy ones
        if tiles_per_request == 1:
            # one tile per request (decode): program b is request b. Triton folds a launch's 1 into
            # a constant, and this branch keeps the division and modulo out of the decode kernel:
            # with them ptxas gave the 32/8/128 P = 16 decode tile 164 registers instead of 128,
            # 3 programs per SM instead of 4, 1.14x slower (experiments/decode_p16_regression.txt)
            b = pid_q
            q_tile = pid_q * 0  # 0 as a tensor, like the other branch's (a runtime branch needs one type)
        else:
            b = pid_q % batch
            q_tile = tiles_per_request - 1 - pid_q // batch
    if Q_MAPPING == 0:
        q_start = b * uniform_q_len
        q_len = uniform_q_len
    elif Q_MAPPING == 1:
        q_start = tl.load(cu_seqlens_q_ptr + b)
        q_len = tl.load(cu_seqlens_q_ptr + b + 1) - q_start
    else:
        b = _find_request(cu_seqlens_q_ptr, pid_q, batch, BLOCK_Q)
        q_start = tl.load(cu_seqlens_q_ptr + b)
        q_tile = pid_q - (q_start // BLOCK_Q + b)
        q_len = tl.load(cu_seqlens_q_ptr + b + 1) - q_start
    if (q_tile * BLOCK_Q >= q_len) | (q_tile < 0):
        return
    if HAS_SEQUSED_Q:
        # FlashAttention-3's seqused_q: the request uses the first seqused_q[b] rows of its slice
        # (its masks align to them); the slice's other rows see no key: output 0, LSE -inf
        q_used = tl.minimum(tl.maximum(tl.load(seqused_q_ptr + b), 0), q_len)
    else:
        q_used = q_len
    if Q_MAPPING == 1 and NAN_ROWS_FIRST:
        _nan_rows_of_request(q_start, q_len, q_tile, tiles_per_request, rows, head_in_group, q_head, dv, split,
                             total_q, group_size, head_dim_v, out_ptr, stride_o_t, stride_o_h, lse_ptr, stride_lse_h,
                             stride_lse_t, partial_out_ptr, stride_po_t, stride_po_h, stride_po_s, partial_lse_ptr,
                             stride_pl_t, stride_pl_h, BLOCK_M, BLOCK_Q, HEADS_PER_BLOCK, BLOCK_DV, SPLIT_KV,
                             WRITE_LSE)

    q_row = q_tile * BLOCK_Q + rows // HEADS_PER_BLOCK  # query index inside the request
    row_valid = (q_row < q_len) & (head_in_group < group_size)
    token = (q_start + q_row).to(tl.int64)  # row of q / out
    q_rows = q_len  # the request's rows that q / out hold
    if Q_MAPPING > 0:
        # whatever cu_seqlens_q holds (validate=False trusts it), no row outside q / out is read
        # or written: rows of a request past q's end, or before its start, are left out
        row_valid = row_valid & (token >= 0) & (token < total_q)
        q_rows = tl.minimum(q_len, total_q - q_start)
        if BLOCK_Q == 1:  # one token's rows (q / out block pointers address that row directly)
            if (q_start + q_tile < 0) | (q_start + q_tile >= total_q):
                return
    # with block-pointer K/V (XPU) q and out go through block pointers where the program's rows
    # form a plain 2D block (2D block IO; Q arrives in the dot's layout without an SLM round trip)
    # (QO_DESC, asked by the launcher on Intel GPUs: the same rows through device-side tensor
    # descriptors, with descriptor K/V)
    QO_BLOCK: tl.constexpr = KV_LOAD == 2 and (BLOCK_Q == 1 or HEADS_PER_BLOCK == 1)
    Q_DESC: tl.constexpr = (QO_DESC and KV_LOAD == 3) and (BLOCK_Q == 1 or HEADS_PER_BLOCK == 1)
    # head-dim chunks of the score dot: the block-pointer and device-descriptor paths only (0
    # elsewhere: one dot)
    D_CHUNK: tl.constexpr = SCORE_CHUNK if KV_LOAD >= 2 else 0
    if D_CHUNK > 0:
        # q stays in memory, read a head-dim chunk at a time beside each K^T chunk (_query_chunk)
        if QO_BLOCK:
            q = _query_rows_block(q_ptr, q_start, q_rows, q_tile, kv_head, head_block, group_size, stride_q_t,
                                  stride_q_h, head_dim, BLOCK_Q, HEADS_PER_BLOCK, D_CHUNK)
        elif Q_DESC:
            q = _query_rows_desc(q_ptr, q_start, q_rows, q_tile, kv_head, head_block, group_size, stride_q_t,
                                 stride_q_h, head_dim, BLOCK_Q, HEADS_PER_BLOCK, D_CHUNK)
        else:
            q_token = tl.where(row_valid, token, 0)  # rows no query owns read row 0 (never stored)
            q_row_head = tl.where(row_valid, q_head, kv_head * group_size)
            q = q_ptr + q_token[:, None] * stride_q_t + q_row_head[:, None] * stride_q_h + tl.arange(0, D_CHUNK)[None, :]
    elif QO_BLOCK:
        q = tl.load(_query_rows_block(q_ptr, q_start, q_rows, q_tile, kv_head, head_block, group_size, stride_q_t,
                                      stride_q_h, head_dim, BLOCK_Q, HEADS_PER_BLOCK, BLOCK_D),
                    boundary_check=(0, 1), padding_option="zero")
    elif Q_DESC:
        q = _query_rows_desc(q_ptr, q_start, q_rows, q_tile, kv_head, head_block, group_size, stride_q_t, stride_q_h,
                             head_dim, BLOCK_Q, HEADS_PER_BLOCK, BLOCK_D).load([0, 0])
    else:
        q = tl.load(
            q_ptr + token[:, None] * stride_q_t + q_head[:, None] * stride_q_h + d[None, :],
            mask=row_valid[:, None] & (d[None, :] < head_dim),
            other=0.0,
        )

    # ---- the keys these queries can see (bottom-right aligned causal mask and window) ----
    if CONTIGUOUS_KV:
        # never read past the request's slice of k / v: seqused_k can only shorten it
        kv_start = tl.load(cu_seqlens_k_ptr + b)
        kv_end = tl.load(cu_seqlens_k_ptr + b + 1)
        # a slice outside k's pool_size rows (validate=False trusts cu_seqlens_k) is never read:
        # the request has no keys (output 0, LSE -inf)
        slice_ok = (kv_start >= 0) & (kv_start <= kv_end) & (kv_end <= pool_size)
        kv_len = tl.where(slice_ok, tl.minimum(tl.load(cache_seqlens_ptr + b), kv_end - kv_start), 0)
    else:
        kv_start = 0
        # never read past the page-table row: a length beyond it is clamped (validate=True reports it)
        kv_len = tl.minimum(tl.load(cache_seqlens_ptr + b), max_pages * PAGE_SIZE)
    pos = kv_len - q_used + q_row  # absolute position of each query row
    row_lo = tl.where(window_left >= 0, pos - window_left, 0)  # first visible key (inclusive)
    row_hi = tl.where(window_right >= 0, pos + window_right, kv_len - 1)  # last visible key
    if CAUSAL:
        row_hi = tl.minimum(row_hi, pos)
    if HAS_SEQUSED_Q:
        row_hi = tl.where(q_row < q_used, row_hi, -1)  # rows past seqused_q see no key
    first_pos = kv_len - q_used + q_tile * BLOCK_Q
    last_pos = kv_len - q_used + tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, q_used) - 1
    lo = tl.where(window_left >= 0, tl.maximum(first_pos - window_left, 0), 0)
    hi = tl.where(window_right >= 0, tl.minimum(kv_len, last_pos + window_right + 1), kv_len)
    if CAUSAL:
        hi = tl.minimum(hi, last_pos + 1)
    # tiles start on BLOCK_N boundaries (whole-page tiles); the keys between the aligned start and
    # the first row's window start are never loaded: no query sees them, and a freed slot may hold
    # NaN, which a masked score does not stop (0 * NaN in P @ V)
    first_key = lo
    lo = (lo // BLOCK_N) * BLOCK_N
    if HAS_SEQUSED_Q:
        hi = tl.where(q_tile * BLOCK_Q < q_used, hi, lo)  # a tile of unused rows reads no key
    hi = tl.maximum(hi, lo)

    if SPLIT_KV:
        # per request, as many splits as its visible length warrants (at most num_kv_splits)
        num_tokens = hi - lo
        splits_here = tl.maximum(tl.minimum(num_kv_splits, tl.cdiv(num_tokens, min_split_tokens)), 1)
        per_split = tl.cdiv(tl.cdiv(num_tokens, splits_here), BLOCK_N) * BLOCK_N
        start = tl.minimum(lo + split * per_split, hi)
        end = tl.minimum(start + per_split, hi)
    else:
        start = lo
        end = hi

    # ---- scales: K's dequant factor folds into the softmax scale (base 2 from here on) ----
    qk_scale = sm_scale
    if HAS_K_DESCALE:
        qk_scale *= tl.load(k_descale_ptr + b * stride_kd_b + kv_head * stride_kd_h).to(tl.float32)
    if not HAS_SOFTCAP:
        qk_scale *= LOG2E

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    k_base = k_cache_ptr + kv_head.to(tl.int64) * stride_k_head
    v_base = v_cache_ptr + kv_head.to(tl.int64) * stride_v_head
    pt_row = page_table_ptr + b.to(tl.int64) * stride_pt_b
    # Tiles that every row of this program sees whole skip the per-element mask: [mid_lo, mid_hi)
    # lies right of the last row's window start, left of the first row's causal / right-window
    # limit, and before `end`. One loop with a branch (three loops, masked/unmasked/masked, ran
    # decode up to 1.3x slower). H200: q_len-4 drafts 1.21-1.53x -> 1.05-1.40x decode's time
    # (bench/results/NVIDIA_H200/experiments/mask_skip.txt).
    safe_lo = tl.where(window_left >= 0, last_pos - window_left, 0)
    safe_hi = tl.where(window_right >= 0, tl.minimum(first_pos + window_right + 1, end), end)
    if CAUSAL:
        safe_hi = tl.minimum(safe_hi, first_pos + 1)
    if HAS_SEQUSED_Q:
        # a tile holding rows past seqused_q (stored, seeing no key) masks every key tile
        safe_hi = tl.where((q_tile * BLOCK_Q + BLOCK_Q <= q_used) | (q_used == q_len), safe_hi, 0)
    mid_lo = start + tl.cdiv(tl.maximum(safe_lo - start, 0), BLOCK_N) * BLOCK_N
    mid_hi = mid_lo + (tl.maximum(safe_hi - mid_lo, 0) // BLOCK_N) * BLOCK_N
    if KV_LOAD == 1:
        # descriptors read whole rows: tiles that can hold a slot no query may see (left of first_key,
        # past `end`) go through masked pointer loads, the rest through descriptors
        desc_lo = tl.minimum(start + tl.cdiv(tl.maximum(first_key - start, 0), BLOCK_N) * BLOCK_N, end)
        desc_hi = desc_lo + ((end - desc_lo) // BLOCK_N) * BLOCK_N
        for n0 in range(start, desc_lo, BLOCK_N):
            acc, m_i, l_i = _tile(
                q, acc, m_i, l_i, n0, kv_start, first_key, end, True, row_lo, row_hi, qk_scale, softcap,
                pt_row, pool_size, k_base, stride_k_page, stride_k_tok, v_base, stride_v_page, stride_v_tok, head_dim,
                head_dim_v,
                BLOCK_N, BLOCK_D, BLOCK_DV, PAGE_SIZE, HAS_SOFTCAP, DOT_PRECISION, HOIST_GATHER,
                SCALE_IN_EXP=SCALE_IN_EXP)
        k_col = kv_head * stride_k_head
        v_col = kv_head * stride_v_head
        if CONTIGUOUS_KV:
            # the tiles every row sees whole in a loop of their own, no mask and no branch in its
            # body (H100, varlen 32/8/128, L = 4k-8k: 1.14-1.25x; the paged path ran 0.93-0.98x
            # this way, so it keeps one loop: experiments/prefill_pages.txt)
            whole_lo = tl.minimum(tl.maximum(mid_lo, desc_lo), desc_hi)
            whole_hi = tl.minimum(tl.maximum(mid_hi, whole_lo), desc_hi)
            acc, m_i, l_i = _descriptor_tiles(
                q, acc, m_i, l_i, desc_lo, whole_lo, mid_lo, mid_hi, row_lo, row_hi, qk_scale, softcap, pt_row,
                kv_start, k_desc, k_col, v_desc, v_col, 1, BLOCK_N, PAGE_SIZE, HAS_SOFTCAP, DOT_PRECISION,
                SCALE_IN_EXP)
            acc, m_i, l_i = _descriptor_tiles(
                q, acc, m_i, l_i, whole_lo, whole_hi, mid_lo, mid_hi, row_lo, row_hi, qk_scale, softcap, pt_row,
                kv_start, k_desc, k_col, v_desc, v_col, 0, BLOCK_N, PAGE_SIZE, HAS_SOFTCAP, DOT_PRECISION,
                SCALE_IN_EXP)
            acc, m_i, l_i = _descriptor_tiles(
                q, acc, m_i, l_i, whole_hi, desc_hi, mid_lo, mid_hi, row_lo, row_hi, qk_scale, softcap, pt_row,
                kv_start, k_desc, k_col, v_desc, v_col, 1, BLOCK_N, PAGE_SIZE, HAS_SOFTCAP, DOT_PRECISION,
                SCALE_IN_EXP)
        else:
            acc, m_i, l_i = _descriptor_tiles(
                q, acc, m_i, l_i, desc_lo, desc_hi, mid_lo, mid_hi, row_lo, row_hi, qk_scale, softcap, pt_row,
                kv_start, k_desc, k_col, v_desc, v_col, 2, BLOCK_N, PAGE_SIZE, HAS_SOFTCAP, DOT_PRECISION,
                SCALE_IN_EXP)
        for n0 in range(desc_hi, end, BLOCK_N):
            acc, m_i, l_i = _tile(
                q, acc, m_i, l_i, n0, kv_start, first_key, end, True, row_lo, row_hi, qk_scale, softcap,
                pt_row, pool_size, k_base, stride_k_page, stride_k_tok, v_base, stride_v_page, stride_v_tok, head_dim,
                head_dim_v,
                BLOCK_N, BLOCK_D, BLOCK_DV, PAGE_SIZE, HAS_SOFTCAP, DOT_PRECISION, HOIST_GATHER,
                SCALE_IN_EXP=SCALE_IN_EXP)
    else:
        # per-key gathers (pages shorter than the tile): with PREFETCH_PAGES the page ids of a tile
        # are read one tile ahead, so its K/V gather never waits on the page-table read
        # (two operands an operator: triton-xpu 3.3 rejects chained boolean operators)
        GATHERS: tl.constexpr = (PAGE_SIZE > 0) and (PAGE_SIZE < BLOCK_N)
        PREFETCH: tl.constexpr = (PREFETCH_PAGES and GATHERS) and ((KV_LOAD < 2) and (not HOIST_GATHER))
        next_ids = 0
        if PREFETCH:
            ahead = start + tl.arange(0, BLOCK_N)
            next_ids = tl.load(pt_row + ahead // PAGE_SIZE, mask=ahead < end, other=0)
        for n0 in range(start, end, BLOCK_N):
            page_ids = next_ids
            if PREFETCH:
                ahead = n0 + BLOCK_N + tl.arange(0, BLOCK_N)
                next_ids = tl.load(pt_row + ahead // PAGE_SIZE, mask=ahead < end, other=0)
            acc, m_i, l_i = _tile(
                q, acc, m_i, l_i, n0, kv_start, first_key, end, (n0 < mid_lo) | (n0 >= mid_hi), row_lo, row_hi, qk_scale, softcap,
                pt_row, pool_size, k_base, stride_k_page, stride_k_tok, v_base, stride_v_page, stride_v_tok, head_dim,
                head_dim_v,
                BLOCK_N, BLOCK_D, BLOCK_DV, PAGE_SIZE, HAS_SOFTCAP, DOT_PRECISION, HOIST_GATHER, KV_LOAD,
                D_CHUNK, QO_BLOCK, INTEL_GPU, page_ids, PREFETCH, Q_DESC, SCALE_IN_EXP)

    has_key = l_i > 0.0
    v_scale = 1.0
    if HAS_V_DESCALE:
        v_scale = tl.load(v_descale_ptr + b * stride_vd_b + kv_head * stride_vd_h).to(tl.float32)
    if SPLIT_KV:
        # this split's normalised output and natural-log LSE (-inf when it saw no key)
        o = acc * (v_scale / tl.where(has_key, l_i, 1.0))[:, None]
        lse = tl.where(has_key, (m_i + tl.log2(tl.where(has_key, l_i, 1.0))) * LN2, float("-inf"))
        tl.store(
            partial_out_ptr + token[:, None] * stride_po_t + q_head[:, None] * stride_po_h + split * stride_po_s + dv[None, :],
            o,
            mask=row_valid[:, None] & (dv[None, :] < head_dim_v),
        )
        tl.store(partial_lse_ptr + token * stride_pl_t + q_head * stride_pl_h + split, lse, mask=row_valid)
    else:
        if HAS_SINKS:
            # the sink joins the denominator only, for rows that saw at least one key
            sink = tl.load(sinks_ptr + q_head, mask=row_valid, other=0.0).to(tl.float32) * LOG2E
            m_f = tl.maximum(m_i, sink)  # finite: no -inf - -inf on rows without keys
            rescale = tl.exp2(m_i - m_f)
            l_i = tl.where(has_key, l_i * rescale + tl.exp2(sink - m_f), l_i)
            acc = acc * rescale[:, None]
            m_i = tl.where(has_key, m_f, m_i)
        o = acc * (v_scale / tl.where(has_key, l_i, 1.0))[:, None]
        if QO_BLOCK:
            tl.store(_query_rows_block(out_ptr, q_start, q_rows, q_tile, kv_head, head_block, group_size, stride_o_t,
                                       stride_o_h, head_dim_v, BLOCK_Q, HEADS_PER_BLOCK, BLOCK_DV),
                     o.to(out_ptr.dtype.element_ty), boundary_check=(0, 1))
        elif Q_DESC:
            _query_rows_desc(out_ptr, q_start, q_rows, q_tile, kv_head, head_block, group_size, stride_o_t, stride_o_h,
                             head_dim_v, BLOCK_Q, HEADS_PER_BLOCK, BLOCK_DV).store([0, 0], o.to(out_ptr.dtype.element_ty))
        else:
            tl.store(
                out_ptr + token[:, None] * stride_o_t + q_head[:, None] * stride_o_h + dv[None, :],
                o.to(out_ptr.dtype.element_ty),
                mask=row_valid[:, None] & (dv[None, :] < head_dim_v),
            )
        if WRITE_LSE:
            lse = tl.where(has_key, (m_i + tl.log2(tl.where(has_key, l_i, 1.0))) * LN2, float("-inf"))
            tl.store(lse_ptr + q_head * stride_lse_h + token * stride_lse_t, lse, mask=row_valid)
    if Q_MAPPING == 1 and NAN_ROWS_AFTER:
        _nan_rows_of_request(q_start, q_len, q_tile, tiles_per_request, rows, head_in_group, q_head, dv, split,
                             total_q, group_size, head_dim_v, out_ptr, stride_o_t, stride_o_h, lse_ptr, stride_lse_h,
                             stride_lse_t, partial_out_ptr, stride_po_t, stride_po_h, stride_po_s, partial_lse_ptr,
                             stride_pl_t, stride_pl_h, BLOCK_M, BLOCK_Q, HEADS_PER_BLOCK, BLOCK_DV, SPLIT_KV,
                             WRITE_LSE)


def _register_compile_variants():
    common = dict(
        q_ptr="*bf16", stride_q_t="i64", stride_q_h="i32",
        k_cache_ptr="*bf16", stride_k_page="i64", stride_k_tok="i32", stride_k_head="i32",
        v_cache_ptr="*bf16", stride_v_page="i64", stride_v_tok="i32", stride_v_head="i32",
        page_table_ptr="*i32", stride_pt_b="i32", max_pages="i32", pool_size="i32", cache_seqlens_ptr="*i32",
        cu_seqlens_q_ptr="*i32",
        cu_seqlens_k_ptr="*i32", seqused_q_ptr="*i32",
        k_descale_ptr="*fp32", stride_kd_b="i32", stride_kd_h="i32",
        v_descale_ptr="*fp32", stride_vd_b="i32", stride_vd_h="i32",
        sinks_ptr="*fp32", out_ptr="*bf16", stride_o_t="i64", stride_o_h="i32",
        lse_ptr="*fp32", stride_lse_h="i64", stride_lse_t="i32",
        partial_out_ptr="*fp32", stride_po_t="i64", stride_po_h="i32", stride_po_s="i32",
        partial_lse_ptr="*fp32", stride_pl_t="i32", stride_pl_h="i32",
        batch="i32", total_q="i32", num_q_programs="i32", uniform_q_len="i32", tiles_per_request="i32", num_head_blocks="i32",
        group_size="i32", head_dim="i32", head_dim_v="i32",
        sm_scale="fp32", softcap="fp32", window_left="i32", window_right="i32",
        num_kv_splits="i32", min_split_tokens="i32",
        Q_MAPPING=_PER_REQUEST, PAD_ROWS=True, BLOCK_Q=4, HEADS_PER_BLOCK=4, BLOCK_N=64, BLOCK_D=128, BLOCK_DV=128,
        PAGE_SIZE=64, CAUSAL=True, HAS_SOFTCAP=False, HAS_SINKS=False, HAS_K_DESCALE=False,
        HAS_V_DESCALE=False, SPLIT_KV=True, WRITE_LSE=False, DOT_PRECISION="tf32",
        k_desc=None, v_desc=None, KV_LOAD=0,  # descriptor loads need Triton >= 3.4 (not triton-xpu 3.3)
        HOIST_GATHER=False, SCORE_CHUNK=0, INTEL_GPU=True,  # as the launcher sets it on XPU
        HAS_SEQUSED_Q=False, PREFETCH_PAGES=False, NUM_DV=1,  # the launcher asks for the prefetch on CUDA only
        LAUNCH_DEPENDENTS=False,  # a CUDA launch mode (device.programmatic_launch)
        HEADS_FIRST=False,  # a CUDA grid order (one-query decode)
        QO_DESC=False,  # descriptor q / out go with descriptor K/V (KV_LOAD 3: not triton-xpu 3.3)
        SCALE_IN_EXP=False,  # a CUDA choice (IGC spills with it)
    )
    # as XPU launches them (xpu_tiles): K/V tiles inside one page, or contiguous, through block
    # pointers (2D block reads), one stage, 256 GRF
    xpu = dict(num_stages=1, grf_mode=_device.xpu_large_grf_mode())
    register_xpu_compile(  # one query: the group's 4 heads padded to a 16-row block (q/out in 2D too)
        _paged_attention_kernel, "decode,bf16,D128,g4,P64,split",
        {**common, "BLOCK_Q": 1, "HEADS_PER_BLOCK": 16, "BLOCK_N": 32, "KV_LOAD": 2},
        dots=2, num_warps=8, op="paged_attention", block_2d=("Q", "K", "V"), **xpu)
    register_xpu_compile(  # paged prefill, 16-token pages: 16-key tiles (config files compile on this one)
        _paged_attention_kernel, "prefill,bf16,D128,g4,P16,causal",
        {**common, "Q_MAPPING": _SEARCH, "BLOCK_Q": 32, "BLOCK_N": 16, "PAGE_SIZE": 16, "SPLIT_KV": False,
         "HOIST_GATHER": True, "KV_LOAD": 2},
        dots=2, num_warps=16, op="paged_attention", block_2d=("K", "V"), **xpu,
    )
    register_xpu_compile(  # pages shorter than any tile: row gathers through pointers; softcap, sinks, window
        _paged_attention_kernel, "prefill,fp16,D64,g8,P1,window,sinks,softcap",
        {**common, "q_ptr": "*fp16", "k_cache_ptr": "*fp16", "v_cache_ptr": "*fp16", "out_ptr": "*fp16",
         "Q_MAPPING": _SEARCH, "BLOCK_Q": 16, "HEADS_PER_BLOCK": 8, "BLOCK_N": 32, "BLOCK_D": 64, "BLOCK_DV": 64,
         "PAGE_SIZE": 1, "HAS_SOFTCAP": True, "HAS_SINKS": True, "SPLIT_KV": False, "WRITE_LSE": True,
         "HOIST_GATHER": True},
        dots=2, num_warps=16, op="paged_attention", num_stages=2, grf_mode=_device.xpu_large_grf_mode(),
    )
    register_xpu_compile(  # 8-bit K^T has no column-major 2D read (by design): V only
        _paged_attention_kernel, "decode,bf16,fp8-e4m3 KV,D128,g8,P128",
        {**common, "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv", "Q_MAPPING": _UNIFORM, "BLOCK_Q": 2, "PAD_ROWS": False,
         "HEADS_PER_BLOCK": 8, "BLOCK_N": 16, "PAGE_SIZE": 128, "HAS_K_DESCALE": True, "HAS_V_DESCALE": True, "KV_LOAD": 2},
        dots=2, num_warps=16, op="paged_attention", block_2d=("V",), **xpu,
    )
    register_xpu_compile(  # fp8 at D = 256: the score dot in 128-column chunks (q re-read per chunk in 2D)
        _paged_attention_kernel, "decode,bf16,fp8-e4m3 KV,D256,g8,P64,score chunks",
        {**common, "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv", "BLOCK_Q": 1, "HEADS_PER_BLOCK": 16,
         "BLOCK_N": 32, "BLOCK_D": 256, "BLOCK_DV": 256, "HAS_K_DESCALE": True, "HAS_V_DESCALE": True, "KV_LOAD": 2,
         "SCORE_CHUNK": 128},
        dots=2, num_warps=16, op="paged_attention", block_2d=("Q", "V"), **xpu,
    )
    # head dims that are not powers of two (masked channels of a 128- / 64-wide tile) and pages of
    # 512-2048 tokens: a block pointer spans one key tile, never a whole page
    register_xpu_compile(
        _paged_attention_kernel, "decode,bf16,D72,g4,P2048,split",
        {**common, "BLOCK_Q": 1, "HEADS_PER_BLOCK": 16, "BLOCK_N": 32, "PAGE_SIZE": 2048, "KV_LOAD": 2},
        dots=2, num_warps=8, op="paged_attention", block_2d=("Q", "K", "V"), **xpu)
    register_xpu_compile(
        _paged_attention_kernel, "prefill,bf16,D40,Dv24,g2,P512,causal",
        {**common, "Q_MAPPING": _SEARCH, "BLOCK_Q": 64, "HEADS_PER_BLOCK": 2, "BLOCK_N": 32, "BLOCK_D": 64,
         "BLOCK_DV": 32, "PAGE_SIZE": 512, "SPLIT_KV": False, "HOIST_GATHER": True, "KV_LOAD": 2},
        dots=2, num_warps=16, op="paged_attention", block_2d=("K", "V"), **xpu,
    )
    # D = 512 (Gemma 4's global layers): 16-key whole-head K tiles, V and out in 128-channel slices
    # on 4 programs (xpu_tiles), q / out in 2D
    register_xpu_compile(
        _paged_attention_kernel, "decode,bf16,D512,g8,P64,split",
        {**common, "BLOCK_Q": 1, "HEADS_PER_BLOCK": 16, "BLOCK_N": 16, "BLOCK_D": 512, "BLOCK_DV": 128, "NUM_DV": 4,
         "KV_LOAD": 2},
        dots=2, num_warps=8, op="paged_attention", block_2d=("Q", "K", "V"), **xpu)
    register_xpu_compile(
        _paged_attention_kernel, "prefill,bf16,D512,g2,P64,causal",
        {**common, "Q_MAPPING": _SEARCH, "BLOCK_Q": 64, "HEADS_PER_BLOCK": 1, "BLOCK_N": 16, "BLOCK_D": 512,
         "BLOCK_DV": 128, "NUM_DV": 4, "SPLIT_KV": False, "HOIST_GATHER": True, "KV_LOAD": 2},
        dots=2, num_warps=16, op="paged_attention", block_2d=("Q", "K", "V"), **xpu,
    )
    # contiguous K/V (PAGE_SIZE = 0, flash_attn_varlen_func): prefill-shaped, 128-row query tiles
    register_xpu_compile(
        _paged_attention_kernel, "varlen,bf16,D128,g4,causal",
        {**common, "BLOCK_Q": 32, "HEADS_PER_BLOCK": 4, "BLOCK_N": 32, "PAGE_SIZE": 0, "SPLIT_KV": False,
         "HOIST_GATHER": True, "KV_LOAD": 2},
        dots=2, num_warps=16, op="paged_attention", block_2d=("K", "V"), **xpu,
    )
    register_xpu_compile(  # DeepSeek MLA extend: D = 192, Dv = 128, LSE for merge_state_v2
        _paged_attention_kernel, "varlen,bf16,D192,Dv128,g1,causal,lse",
        {**common, "BLOCK_Q": 64, "HEADS_PER_BLOCK": 1, "BLOCK_N": 16, "BLOCK_D": 256, "BLOCK_DV": 128,
         "PAGE_SIZE": 0, "SPLIT_KV": False, "WRITE_LSE": True, "HOIST_GATHER": True, "KV_LOAD": 2},
        dots=2, num_warps=16, op="paged_attention", block_2d=("Q", "K", "V"), **xpu,
    )


_register_compile_variants()


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
    "k": "appending new keys inside the call is not supported: write k/v into the cache first",
    "v": "appending new values inside the call is not supported: write k/v into the cache first",
    "qv": "qv (absorbed-MLA extend) is not supported: use flash_mla_decode for MLA",
    "rotary_cos": "rotary embedding inside attention is not supported: apply it to q/k beforehand",
    "rotary_sin": "rotary embedding inside attention is not supported: apply it to q/k beforehand",
    "cache_batch_idx": "cache_batch_idx is not supported: index page_table instead",
    "cache_leftpad": "cache_leftpad is not supported",
    "cu_seqlens_k_new": "cu_seqlens_k_new (in-call cache append) is not supported",
    "q_descale": "q_descale is not supported: pass q in fp16/bf16/fp32",
}


def xpu_tiles(decode_like: bool, head_dim: int, page_size: int, fp8_kv: bool = False) -> dict:
    """Tiles and launch options for Intel GPUs, chosen so the native code (triton-xpu 3.3 ->
    ocloc, bench/results/xpu_codegen.md) reads K/V by 2D block reads and spills nothing at 256 GRF;
    compiler facts, no Intel GPU timed them. Warps split the query rows, so each sub-group holds
    the whole ``[D, BLOCK_N]`` K^T and ``[BLOCK_N, Dv]`` V tiles: 64-key tiles at D = 128 fill the
    256-GRF file (~11 KB spilled at 1-32 warps), 32 keys do not (16 at D > 128). Pages of 16
    tokens take 16-key tiles (a tile must lie in one page for a 2D read); shorter pages gather
    rows through pointers. Tiles in one page ask for 2D reads both ways, ``kv_device_desc`` and
    ``kv_block_ptr``: the launcher takes device-side tensor descriptors where Triton builds them
    (Intel's 3.4 on: the 2D load newer Intel Triton prefers) and block pointers where only they
    exist (triton-xpu 3.3), ``_kv_load``. fp8 caches take 16-key tiles on 16 warps (32 keys on 8 warps
    spill 320 B at D = 128, 448 B at 64 packed heads: the dequantised K^T beside the 8-bit one).
    Above D = 128 prefill tiles hold one head's tokens (``pack_gqa`` off) and fp8 decode runs the
    score dot over head-dim chunks (``score_chunk``) on 32-key tiles. Used by the heuristic on XPU
    and by ``autotune_configs/seed_xpu_configs.py`` for the shipped files."""
    wide = head_dim > 128
    chunked = wide and fp8_kv and decode_like  # fp8 decode at D > 128: score dot in chunks, 32 keys
    block_n = 32 if chunked or not (wide or fp8_kv) else 16
    if 16 <= page_size < block_n:
        block_n = page_size
    in_page = page_size == 0 or page_size >= block_n  # every key tile inside one page: 2D reads
    tiles = dict(
        BLOCK_N=block_n,
        BLOCK_M=64 if decode_like or wide else 128,
        num_warps=8 if decode_like and not fp8_kv else 16,
        num_stages=1 if in_page else 2,
        grf_mode="256",
        kv_block_ptr=in_page,
        kv_device_desc=in_page,
    )
    if wide and not decode_like:
        # GQA prefill tiles at D > 128 take one head's tokens: q and out become 2D blocks (packed
        # (token, head) rows read q by gathers and spilled 4.3-7.0 KB at D = 256; one head: 0 B, no
        # SLM). Each head of a group reads the K/V tile again (from cache: prefill is compute-bound)
        tiles["pack_gqa"] = False
    if head_dim > 256:
        # Dv = 512 (Gemma 4): the output channels in 128-wide slices on 4 programs, each repeating
        # the score dot (4x the QK work, the price of no spill; not timed). Whole-head tiles spilled
        # 13-17 KB at 256 GRF, 256-channel slices 3.3-4.2 KB, 128: 0 B on PVC and BMG, decode and
        # prefill (bench/results/xpu_native/tiles.txt)
        tiles["BLOCK_DV"] = 128
    if chunked:
        # fp8 K^T has no 2D read: gathered 8-bit K^T beside its 16-bit copy spilled 8.4-8.8 KB at
        # D = 256; the score dot over 128-column chunks with 32-key tiles spills 0 (16-key tiles,
        # i.e. 16-token pages, still 4.5 KB: bench/results/xpu_native/tiles.txt)
        tiles["score_chunk"] = 128
    return tiles


def _heuristic_config(decode_like: bool, head_dim: int, work: int, page_size: int, max_q: int | None = None,
                      fp8_kv: bool = False, head_dim_v: int | None = None, q_bytes: int = 2) -> dict:
    """Built-in config when no tuned file covers the bucket (measured on H200: a small decode
    batch wants long tiles over many splits, a full one shorter tiles; prefill on the H100,
    bench/results/NVIDIA_H100_80GB_HBM3/experiments/prefill_tiles.txt and prefill_desc.txt)."""
    if decode_like:
        # H200 tuning: long key tiles until the batch fills the device, then 64 (128 for D <= 64)
        block_n = 128 if work <= 4 or head_dim <= 64 else 64
    else:
        block_n = 64
    if head_dim > 128:
        block_n = min(block_n, 32)  # [BLOCK_N, D] tiles of K and V must fit the registers
    # D > 256 (Gemma 4's 512): whole-head tiles of 32 keys (16 where one request's splits fill the
    # device). H100, 32/8/512 P = 16 (experiments/wide_tiles.txt): decode 16 rows x 32 keys on 4
    # warps 2826 us at B = 64, 8k keys (16 keys: 3256 us, 3 programs per SM against 2, whose
    # 512 programs leave a partial second wave); 1.00x at B = 16; B = 1 1.03x slower, so 16 there.
    # Prefill 64 x 32 on 8 warps 199 TF/s (64 x 16: 125; 128-row and 4-warp tiles 0.3-0.7x). With
    # float32 operands (q_bytes 4) 32-key tiles need 264 KB of shared memory (232 KB on an H100): 16
    very_wide = max(head_dim, head_dim_v or 0) > 256
    if very_wide:
        block_n = 16 if (decode_like and work <= 2) or q_bytes > 2 else 32
    # prefill, D = 128, pages of whole 64-key tiles: K/V through tensor descriptors (TMA), page
    # rows read one tile ahead, 3 stages: 1.2-1.3x over pointer loads (H100, 32/8/128 causal
    # prefill, B = 1, L = 8k: 375 -> 460-486 TF/s). D = 64 stays on pointers (descriptors 0.95x
    # there). Contiguous K/V (page_size 0) with the unmasked tiles in a loop of their own: 1.14-1.25x
    # at 4k-8k queries a request, 0.95x at 1k (experiments/prefill_pages.txt), so from 2k on.
    # Off on XPU until measured there (a config file may turn it on: Intel's Triton >= 3.5 lowers
    # them to 2D block IO).
    # Pages of half a tile (P = 32) load one page per descriptor, two a tile: 1.31x over the
    # gathers (H100, 32/8/128, B = 1, L = 8k: 294 -> 384 TF/s; experiments/prefill_pages.txt);
    # P = 16 stays on gathers (four pages a tile: 0.63-0.83x, two with 32-key tiles: 0.96x).
    whole_pages = page_size >= block_n or 2 * page_size == block_n
    long_contiguous = page_size == 0 and (max_q or 0) >= 2048
    kv_desc = (not decode_like and head_dim == 128 and (whole_pages or long_contiguous)
               and _device.backend() == "cuda")
    # prefill over pages shorter than a key tile (row gathers): 128-row query tiles on 8 warps,
    # 1.30x at P = 16 (H100, 32/8/128, B = 1, L = 8k: 260 -> 338 TF/s); below 16 from 512 queries a
    # request (P = 1: 1.04-1.11x at 512-8k queries, 0.96x at 256; experiments/prefill_pages.txt)
    gather_prefill = (not decode_like and 0 < page_size < block_n and not kv_desc
                      and (page_size >= 16 or (max_q or 0) >= 512))
    # D <= 64 prefill of 1k+ queries a request over one-tile pages or contiguous K/V: 128-row tiles
    # on 8 warps, 3 stages (H100, 32/8/64: 1.04-1.12x at P = 64 and contiguous; 0.98x at P = 128/256
    # and 0.95x at 256 queries, which keep 64-row tiles; experiments/prefill_pages.txt)
    narrow_prefill = (not decode_like and head_dim <= 64 and page_size in (0, block_n)
                      and (max_q or 0) >= 1024)
    tiles = dict(
        BLOCK_N=block_n,
        BLOCK_M=128 if gather_prefill or narrow_prefill else 64,  # query rows (token x head) of a prefill tile
        num_warps=8 if gather_prefill or narrow_prefill else 4,
        num_stages=3 if kv_desc or narrow_prefill else 2,
        grf_mode="256" if head_dim > 128 else None,  # XPU only: 256 registers per thread
    )
    if very_wide:  # 16-row decode tiles on 4 warps (a draft's rows take several); 64-row prefill tiles on 8
        tiles.update(BLOCK_M=16 if decode_like else 64, num_warps=4 if decode_like else 8, num_stages=2)
    if _device.backend() == "xpu":
        tiles = xpu_tiles(decode_like, max(head_dim, head_dim_v or 0), page_size, fp8_kv)
    return dict(
        **tiles,
        # a split covers at least this many keys; at most max_splits splits (H200, B=1: 8/1/128
        # at 32k keys runs 1.18x faster on 128 splits than on 64; 32/8/128 at 1k 1.2x on 8 than 4)
        min_split_tokens=128,
        waves=2,  # aim for this many programs per compute unit when splitting
        max_splits=128,
        kv_desc=kv_desc,
        # page ids read a tile ahead of the K/V gather (pages shorter than the key tile): where it was
        # measured to pay, one-query decode on CUDA at D = 128 over one-token pages (H100: 0.976-0.994x
        # the time from B = 64 at 8k keys, 1.00-1.01x at B = 1; H200 0.952-1.014x) and above D = 256
        # over pages shorter than the 32-key tile (H200, 16-token pages: 0.963-0.995x; H100
        # 0.995-1.001x). Elsewhere off: D = 64 P = 1 lost programs per SM (5 -> 4, up to 1.03x
        # slower), 3-stage draft tiles doubled their shared memory, and D = 128 P = 16 moved within
        # noise (experiments/prefetch_pages_p1.txt); a config file may ask for it
        PREFETCH_PAGES=int(decode_like and max_q == 1 and _device.backend() == "cuda"
                           and ((page_size == 1 and head_dim == 128) or (very_wide and page_size < block_n))),
        # one-query decode on CUDA: the grid's KV heads first, so a request's heads are neighbouring
        # programs (H200, B = 64 8k keys: 64/8/128 P = 1 504.9 -> 501.8 us, 32/8/128 P = 16
        # 501.2 -> 498.7, others level; experiments/block_order.txt)
        heads_first=int(decode_like and max_q == 1 and _device.backend() == "cuda"),
    )


def _kv_descriptors(k: torch.Tensor, v: torch.Tensor, page_size: int, config: dict, device):
    """(K, V) host tensor descriptors of the caches seen as ``[token rows, row]`` (paged: pages
    of ``page_size`` rows flattened; ``page_size = 0``: contiguous ``[total_k, H_kv, D]``) with
    ``[BLOCK_N, D]`` / ``[BLOCK_N, Dv]`` blocks (``[P, D]`` when a tile is two pages of ``P >= 16``
    rows), or None where the config does not ask for them (``kv_desc``) or they cannot be used
    (``paged_rows_descriptors``; a key tile must lie in one page or two whole ones, and the head
    dims must be powers of two: the block is the whole head)."""
    block_n = config["BLOCK_N"]
    if not config.get("kv_desc") or (0 < page_size < block_n and (page_size < 16 or block_n != 2 * page_size)):
        return None
    rows = min(page_size, block_n) if page_size else block_n  # two pages a tile: one load a page
    descriptors = []
    for cache in (k, v):
        num_kv_heads, dim = cache.shape[-2:]
        if dim != next_power_of_2(dim) or dim < 16:  # the block is the whole head, at least tl.dot's K
            return None
        row_width = (num_kv_heads - 1) * cache.stride(-2) + dim
        found = paged_rows_descriptors(cache, page_size, row_width, [(rows, dim)], device)
        if found is None:
            return None
        descriptors += found
    return tuple(descriptors)


def query_heads_per_block(group_size: int, max_q: int | None, config: dict | None = None) -> int:
    """Query heads one program packs as rows (``HEADS_PER_BLOCK``): the group's, rounded up to a
    power of two, at most 64. With block-pointer K/V (``kv_block_ptr``; on XPU device-side
    descriptor K/V, ``kv_device_desc``, too) and one query a request, at least 16 (heads past the
    group are out of bounds) instead of a few heads times padded tokens, so q and out are plain
    2D blocks (the kernel's ``QO_BLOCK`` / ``QO_DESC``: 2D block IO, no layout conversion through
    SLM; XPU native code: bench/results/xpu_codegen.md). A config with ``pack_gqa`` false asks
    for one head's tokens (1), as FlashAttention-3's ``pack_gqa=False``."""
    if config is not None and config.get("pack_gqa") is False:
        return 1
    heads = min(next_power_of_2(group_size), 64)
    two_d = config is not None and (config.get("kv_block_ptr")
                                    or (config.get("kv_device_desc") and _device.backend() == "xpu"))
    if two_d and max_q == 1:
        heads = max(heads, 16)
    return heads


def _kv_load(page_size: int, config: dict, kv_descriptors, caches=()) -> int:
    """``KV_LOAD`` of a launch: 1 when K/V tensor descriptors were made (``_kv_descriptors``);
    where every key tile lies in one page (or contiguous K/V): 3, device-side tensor descriptors,
    where the config asks for them (``kv_device_desc``), Triton builds them
    (``device.device_descriptors``) and the ``caches`` (K, V) are 16-byte aligned row by row; 2,
    block pointers, where the config asks (``kv_block_ptr``) and Triton builds them
    (``device.block_pointers``); else 0, pointer loads. The XPU tiles (``xpu_tiles``) ask for
    both, so Intel's Triton with descriptors (3.4 on: 3.7 in torch's XPU wheels, Intel's main,
    whose block pointers are removed) gets 3, triton-xpu 3.3 gets 2, and a Triton with neither
    pointer loads."""
    if kv_descriptors is not None:
        return 1
    if page_size and page_size < config["BLOCK_N"]:
        return 0
    if config.get("kv_device_desc") and _device.device_descriptors() and all(map(_rows_aligned, caches)):
        return 3
    if config.get("kv_block_ptr") and _device.block_pointers():
        return 2
    return 0


def _rows_aligned(cache: torch.Tensor) -> bool:
    """A device-side descriptor's base and row pitch must be 16-byte aligned (TMA on Hopper,
    Intel's descriptor rules)."""
    size = cache.element_size()
    return cache.data_ptr() % 16 == 0 and all(stride * size % 16 == 0 for stride in cache.stride()[:-1])


def score_chunk(config: dict, kv_load: int, head_dim: int) -> int:
    """``SCORE_CHUNK`` of a launch: the config's ``score_chunk`` (head-dim columns per score dot)
    where K/V use block pointers or device-side descriptors (``KV_LOAD`` 2 or 3) and it is
    narrower than the padded head dim; else 0 (one dot)."""
    chunk = config.get("score_chunk", 0)
    return chunk if kv_load in (2, 3) and 0 < chunk < next_power_of_2(head_dim) else 0


def query_rows_descriptors(kv_load: int, block_q: int, heads_per_block: int, q: torch.Tensor,
                           out: torch.Tensor) -> bool:
    """``QO_DESC`` of a launch: q and out through device-side tensor descriptors, on Intel GPUs
    with descriptor K/V (``KV_LOAD = 3``) where a program's rows form a plain 2D block (one
    token's heads, ``BLOCK_Q = 1``, or one head's tokens) and both are 16-byte aligned row by
    row, as block-pointer K/V reads them through block pointers (the kernel's ``QO_BLOCK``)."""
    return (kv_load == 3 and _device.backend() == "xpu" and (block_q == 1 or heads_per_block == 1)
            and _rows_aligned(q) and _rows_aligned(out))


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


def _check_heads(q: torch.Tensor, k_name: str, num_kv_heads: int, head_dim: int, head_dim_v: int) -> None:
    """q's head dim equals K's, both head dims are supported, and Hq is a multiple of H_kv."""
    if q.shape[-1] != head_dim:
        raise ValueError(f"q's head dim ({q.shape[-1]}) must equal {k_name}'s ({head_dim})")
    for name, dim in (("head dim D", head_dim), ("value head dim Dv", head_dim_v)):
        if dim % 8 or not 8 <= dim <= MAX_HEAD_DIM:
            raise ValueError(f"{name} must be a multiple of 8 from 8 to {MAX_HEAD_DIM}, got {dim}")
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
    page_table: torch.Tensor,
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
    rotary_interleaved: bool = True,
    scheduler_metadata=None,
    num_splits: int = 0,
    pack_gqa=None,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
    out: torch.Tensor | None = None,
    validate: bool = False,
):
    """Attention of new query tokens over a paged KV cache (decode, drafts, chunked prefill).

    Drop-in for sgl-kernel-xpu's ``flash_attn_with_kvcache`` (same keyword names). The causal mask
    and windows are bottom-right aligned: query ``t`` of a request with ``q_len`` queries sits at
    position ``cache_seqlens[b] - q_len + t``.

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, Hq, D]`` ragged queries with ``cu_seqlens_q``, or ``[B, S, Hq, D]`` (S = 1 is
        decode). fp16, bf16 or fp32; last dim contiguous, other strides free.
    k_cache, v_cache : torch.Tensor
        ``[num_pages, page_size, H_kv, D]`` and ``[num_pages, page_size, H_kv, Dv]``, q's dtype or
        fp8 (``float8_e4m3fn``/``float8_e5m2``, then with ``k_descale``/``v_descale``). Any strides
        with ``stride(-1) == 1``: K and V may be slices of one buffer, a layer of a multi-layer pool,
        or a ``view(-1, 1, H_kv, D)`` of a paged pool (token-granular tables). ``page_size`` is a
        power of two from 1 to 2048. Offsets are 64-bit: caches beyond 2^31 elements work.
    k, v, qv, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, cu_seqlens_k_new, q_descale
        Accepted for signature compatibility; anything but ``None`` raises ``ValueError`` naming
        the argument (these features would change the result and are not implemented; they are
        never silently dropped).
    cache_seqlens : torch.Tensor or int
        ``[B]`` int32: KV length of each request, including the new tokens (an int means all).
    page_table : torch.Tensor
        ``[B, max_pages]`` int32, **page-granular**: physical page of each logical page.
        ``cache_seqlens[b] <= max_pages * page_size`` is required (``validate=True`` checks it; the
        kernel clamps longer lengths to the table rather than read past it).
    cu_seqlens_q : torch.Tensor, optional
        ``[B + 1]`` int32 cumulative query lengths; required with a 3-D ``q``.
    max_seqlen_q : int, optional
        Longest query length of the batch (a promise, as in FlashAttention). When given it sizes
        the grid directly (a value above ``total_q`` counts as ``total_q``); otherwise requests
        are found by a binary search on the device.
    max_seqlen_k, scheduler_metadata, pack_gqa, sm_margin
        Hints accepted for compatibility and ignored (GQA packing is always on).
    rotary_seqlens, rotary_interleaved
        Accepted and ignored: they only qualify ``rotary_cos``/``rotary_sin``, which must be
        ``None`` (sglang's XPU backend passes ``rotary_seqlens`` on every call).
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
    for name, value in (
        ("k", k), ("v", v), ("qv", qv), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
        ("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad),
        ("cu_seqlens_k_new", cu_seqlens_k_new), ("q_descale", q_descale),
    ):
        if value is not None:
            raise ValueError(f"{name}: {_UNSUPPORTED[name]}")

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
        cu_seqlens_q=cu_seqlens_q, sinks=sinks, out=out,
    )
    if check_bool(validate, "validate"):
        _validate(cache_seqlens, page_table, page_size, num_pages, cu_seqlens_q, uniform_q_len, total_q, max_q)
    return _launch(
        q, k_cache, v_cache, device=device, batch=batch, page_table=page_table, kv_lens=cache_seqlens,
        cu_seqlens_k=None, max_kv_len=page_table.shape[1] * page_size, mapping=mapping, cu_seqlens_q=cu_seqlens_q,
        uniform_q_len=uniform_q_len, max_q=max_q, softmax_scale=softmax_scale, sinks=sinks, causal=causal,
        window_size=window_size, softcap=softcap, k_descale=k_descale, v_descale=v_descale, num_splits=num_splits,
        return_softmax_lse=return_softmax_lse, out=out,
    )


def _launch(q, k, v, *, device, batch, page_table, kv_lens, cu_seqlens_k, max_kv_len, mapping, cu_seqlens_q,
            uniform_q_len, max_q, softmax_scale, sinks, causal, window_size, softcap, k_descale, v_descale,
            num_splits, return_softmax_lse, out, seqused_q=None):
    """The attention both public functions run once their layout arguments are checked.

    ``q`` is ragged 3-D. ``k``/``v`` are a paged cache ``[pages, P, H_kv, D]`` read through
    ``page_table`` (``cu_seqlens_k`` None), or contiguous ``[total_k, H_kv, D]`` rows read from
    ``cu_seqlens_k[b]`` on (``page_table`` None): the kernel's contiguous-K/V mode. ``kv_lens``
    ``[B]`` int32 are the keys of each request (clamped in the kernel to the table / the slice);
    ``max_kv_len`` bounds them on the host (for the split count only). ``seqused_q`` ``[B]`` int32
    (ragged q only): the rows of each request's slice in use (``flash_attn_varlen_func``).
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
        BLOCK_D=max(16, next_power_of_2(head_dim)),  # tl.dot's K is at least 16
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
        SCORE_CHUNK=score_chunk(config, kv_load, head_dim),
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
        **tune.launch_options(config),
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
