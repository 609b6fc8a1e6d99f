"""Key tiles of the paged attention kernel (``paged_kernel``): one tile of keys through pointer
loads (any page size; gathers for pages shorter than a tile), block pointers or device-side
tensor descriptors (``_tile``), or through host tensor descriptors (``_descriptor_tile``,
``_two_pages_tile``, looped by ``_descriptor_tiles``; TMA on Hopper), and the score / softmax /
P @ V steps they share. A slot no query may see is never loaded: descriptor loads read whole rows,
so the tiles that can hold such slots stay on masked pointer loads."""
from __future__ import annotations

import triton
import triton.language as tl

from .._common import (
    block_rows,
    exp2_shifted,
    online_max,
    tile_row,
    clamp_page,
    rows_descriptor,
    softmax_step,
)


@triton.jit
def _tile_scores(q, k, key, key_valid, row_lo, row_hi, masked, qk_scale, softcap,
                 HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, SCALE_IN_EXP: tl.constexpr = False,
                 alibi=0, alibi_pos=0, alibi_scale=0.0, HAS_ALIBI: tl.constexpr = False):
    """Base-2 logits of one key tile (``k`` is ``[D, BLOCK_N]``), soft-capped, ALiBi-biased
    (``HAS_ALIBI``, see ``_logits``), then masked per element only when ``masked`` (tiles some row sees only in
    part); with ``SCALE_IN_EXP`` the unscaled scores, biased and masked (the softmax applies
    ``qk_scale`` inside its exponent)."""
    s = _score_dot(q, k, DOT_PRECISION)
    if not SCALE_IN_EXP:
        s = s * qk_scale
    return _logits(s, key, key_valid, row_lo, row_hi, masked, softcap, HAS_SOFTCAP, alibi, alibi_pos, alibi_scale, HAS_ALIBI)


@triton.jit
def _score_dot(q, k, DOT_PRECISION: tl.constexpr):
    """``q @ k`` in fp32, ``k`` cast to q's dtype (both dot operands one dtype): the one score dot
    of the paged kernel, whole or per head-dim chunk."""
    return tl.dot(q, k.to(q.dtype), out_dtype=tl.float32, input_precision=DOT_PRECISION)


@triton.jit
def _logits(s, key, key_valid, row_lo, row_hi, masked, softcap, HAS_SOFTCAP: tl.constexpr, alibi=0, alibi_pos=0,
            alibi_scale=0.0, HAS_ALIBI: tl.constexpr = False):
    """Scaled scores ``s`` to base-2 logits: soft-capped, ALiBi-biased (``HAS_ALIBI``: minus
    ``slope * |alibi_pos - key|``, each row's slope read through the pointers ``alibi`` and scaled
    by ``alibi_scale`` to the units of ``s``, ``alibi_pos`` each row's absolute position), then
    masked per element only when ``masked``. The slopes are loaded here, per tile: loaded once
    before the key loop (or under a mask), IGC spilled 2-4 KB a thread on the XPU decode and
    prefill tiles."""
    LOG2E: tl.constexpr = 1.4426950408889634
    if HAS_SOFTCAP:
        # cap * tanh(s / cap), with tanh(x) = 1 - 2 / (exp(2x) + 1); then to base 2
        s = softcap * (1.0 - 2.0 / (tl.exp2(s * (2.0 * LOG2E / softcap)) + 1.0)) * LOG2E
    if HAS_ALIBI:
        s = s - (tl.load(alibi) * alibi_scale)[:, None] * tl.abs((alibi_pos[:, None] - key[None, :]).to(tl.float32))
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
def _chunk_keys(k_tile, stride_k_tok, head_dim, rows, skip, col, BLOCK_N: tl.constexpr, SCORE_CHUNK: tl.constexpr,
                KV_LOAD: tl.constexpr = 2):
    """``K^T`` ``[SCORE_CHUNK, BLOCK_N]`` over head-dim columns ``col ..`` of a key tile read
    through block pointers (``KV_LOAD = 2``) or device-side tensor descriptors (3); columns past
    ``head_dim`` read 0."""
    if KV_LOAD == 3:  # the tile's whole rows, read at column col (no descriptor of zero columns)
        k = tl.trans(rows_descriptor(k_tile, stride_k_tok, head_dim, rows, BLOCK_N, SCORE_CHUNK).load([-skip, col]))
    else:
        k = tl.load(block_rows(k_tile, stride_k_tok, head_dim, rows, skip, BLOCK_N, SCORE_CHUNK, True, col),
                    boundary_check=(0, 1), padding_option="zero")
    return k


@triton.jit
def _chunk_dot(q_chunk, k_tile, stride_k_tok, head_dim, rows, skip, col, BLOCK_N: tl.constexpr,
               SCORE_CHUNK: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_LOAD: tl.constexpr = 2):
    """``q_chunk @ K^T`` over head-dim columns ``col ..`` of a key tile (``_chunk_keys``)."""
    k = _chunk_keys(k_tile, stride_k_tok, head_dim, rows, skip, col, BLOCK_N, SCORE_CHUNK, KV_LOAD)
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
    SCALE_IN_EXP: tl.constexpr = False, q_tail=0, D_TAIL: tl.constexpr = 0,
    alibi=0, alibi_pos=0, alibi_scale=0.0, HAS_ALIBI: tl.constexpr = False,
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
    the tile, per-key gathers: ``page_ids`` holds the tile's page ids, read a tile ahead by the caller.
    ``D_TAIL > 0`` (head dims past a power of two, 576 = 512 + 64): the head-dim channels past
    ``BLOCK_D`` are a second chunk of the score dot, ``D_TAIL`` wide; ``q_tail`` holds q's
    ``[rows, D_TAIL]`` tail (one dot), or with ``SCORE_CHUNK`` the chunk loop runs on over it
    (``SCORE_CHUNK`` divides ``D_TAIL``)."""
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
        for c in tl.static_range((BLOCK_D + D_TAIL) // SCORE_CHUNK):
            q_chunk = _query_chunk(q, c * SCORE_CHUNK, head_dim, SCORE_CHUNK, QO_BLOCK, QO_DESC)
            part = _chunk_dot(q_chunk, k_tile, stride_k_tok, head_dim, rows, skip, c * SCORE_CHUNK, BLOCK_N,
                              SCORE_CHUNK, DOT_PRECISION, KV_LOAD)
            s = part if c == 0 else s + part
        if not SCALE_IN_EXP:
            s = s * qk_scale
        s = _logits(s, key, key_valid, row_lo, row_hi, masked, softcap, HAS_SOFTCAP, alibi, alibi_pos, alibi_scale, HAS_ALIBI)
        operand_dtype = q_chunk.dtype
    elif D_TAIL > 0:
        # the channels past BLOCK_D: their K^T beside the main tile's, accumulated into its scores
        if KV_LOAD >= 2:
            k_tail = _chunk_keys(k_tile, stride_k_tok, head_dim, rows, skip, BLOCK_D, BLOCK_N, D_TAIL, KV_LOAD)
        else:
            dt = BLOCK_D + tl.arange(0, D_TAIL)
            k_tail = tl.load(k_base + k_rows[None, :] + dt[:, None], mask=key_valid[None, :] & (dt[:, None] < head_dim),
                             other=0.0)
        s = _score_dot(q, k, DOT_PRECISION) + _score_dot(q_tail, k_tail, DOT_PRECISION)
        if not SCALE_IN_EXP:
            s = s * qk_scale
        s = _logits(s, key, key_valid, row_lo, row_hi, masked, softcap, HAS_SOFTCAP, alibi, alibi_pos, alibi_scale,
                    HAS_ALIBI)
        operand_dtype = q.dtype
    else:
        s = _tile_scores(q, k, key, key_valid, row_lo, row_hi, masked, qk_scale, softcap, HAS_SOFTCAP, DOT_PRECISION,
                         SCALE_IN_EXP, alibi, alibi_pos, alibi_scale, HAS_ALIBI)
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
    alibi=0, alibi_pos=0, alibi_scale=0.0, HAS_ALIBI: tl.constexpr = False,
):
    """One key tile of whole valid rows of one page (cache row ``row`` on; ``PAGE_SIZE >= BLOCK_N``)
    through tensor descriptors over the caches seen as ``[pages * PAGE_SIZE, row]`` (TMA on Hopper, 2D block IO
    on Intel GPUs). The caller gives it only tiles whose every key some row may see: a row no query
    may see can hold NaN, and ``0 * NaN`` in ``P @ V`` would reach the output."""
    key = n0 + tl.arange(0, BLOCK_N)
    k = tl.trans(k_desc.load([row, k_col]))
    s = _tile_scores(q, k, key, key >= 0, row_lo, row_hi, masked, qk_scale, softcap, HAS_SOFTCAP, DOT_PRECISION,
                     SCALE_IN_EXP, alibi, alibi_pos, alibi_scale, HAS_ALIBI)
    p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, qk_scale, SCALE_IN_EXP)
    v = v_desc.load([row, v_col])
    return _accumulate(acc, alpha, p, v.to(q.dtype), DOT_PRECISION), m_i, l_i


@triton.jit
def _two_pages_tile(
    q, acc, m_i, l_i, n0, row0, row1, masked, row_lo, row_hi, qk_scale, softcap,
    k_desc, k_col, v_desc, v_col,
    PAGE_SIZE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, SCALE_IN_EXP: tl.constexpr,
    alibi=0, alibi_pos=0, alibi_scale=0.0, HAS_ALIBI: tl.constexpr = False,
):
    """One key tile of two whole pages (``BLOCK_N = 2 * PAGE_SIZE``; cache rows ``row0``, ``row1``)
    through one tensor-descriptor load per page: a score dot per page, one softmax update for
    the tile, P @ V page by page into the accumulator. The caller gives it only tiles whose every
    key some row may see (as ``_descriptor_tile``)."""
    offs = tl.arange(0, PAGE_SIZE)
    s0 = _tile_scores(q, tl.trans(k_desc.load([row0, k_col])), n0 + offs, offs >= 0, row_lo, row_hi, masked,
                      qk_scale, softcap, HAS_SOFTCAP, DOT_PRECISION, SCALE_IN_EXP, alibi, alibi_pos, alibi_scale, HAS_ALIBI)
    s1 = _tile_scores(q, tl.trans(k_desc.load([row1, k_col])), n0 + PAGE_SIZE + offs, offs >= 0, row_lo, row_hi,
                      masked, qk_scale, softcap, HAS_SOFTCAP, DOT_PRECISION, SCALE_IN_EXP, alibi, alibi_pos, alibi_scale, HAS_ALIBI)
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
    DOT_PRECISION: tl.constexpr, SCALE_IN_EXP: tl.constexpr, alibi=0, alibi_pos=0, alibi_scale=0.0, HAS_ALIBI: tl.constexpr = False,
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
                k_desc, k_col, v_desc, v_col, BLOCK_N, HAS_SOFTCAP, DOT_PRECISION, SCALE_IN_EXP, alibi, alibi_pos,
                alibi_scale, HAS_ALIBI)
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
                k_desc, k_col, v_desc, v_col, HALF, HAS_SOFTCAP, DOT_PRECISION, SCALE_IN_EXP, alibi, alibi_pos,
                alibi_scale, HAS_ALIBI)
    return acc, m_i, l_i
