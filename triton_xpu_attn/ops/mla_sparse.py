"""DeepSeek sparse attention (DSA): the sparse kernel family, ``_mla_sparse_kernel``, its tiles
(``sparse_tiles``) and its launch (``launch_sparse``), which the prefill ``flash_mla_sparse_fwd``
(``mla_sparse_prefill.py``) and the decode ``flash_mla_with_kvcache`` (``mla_sparse_decode.py``)
call; the kernels' XPU compile variants.

Each query token ``t`` attends, per KV head, to the ``topk`` rows of ``kv`` that
``indices[t, kv_head]`` names (the indexer's choice), not to a contiguous range: K is a whole row
(``d_qk`` channels: DeepSeek's 512 latent + 64 rope, or 512), V its first ``d_v`` channels. The
kernel, ``_mla_sparse_kernel``, runs one program per (token, block of ``BLOCK_H`` query heads of
one KV head) and walks the token's index list ``BLOCK_N`` entries at a time:

* the selected rows are gathered once for every head of the block (``h_kv == 1`` is DeepSeek's
  case: all heads share them), so both dots run on the matrix units with the heads as the M
  dimension;
* an entry outside ``[0, s_kv)`` (-1 padding, any negative value, ``s_kv`` and beyond) or past the
  token's ``topk_length`` is never loaded (masked loads read 0) and its score is -inf, so a row of
  ``kv`` that no valid entry names is never read: it may hold NaN;
* online softmax in base 2 (``sm_scale * log2(e)`` folded into the scores); ``max_logits`` and
  ``lse`` come back in natural-log units of the scaled logits, as upstream's reference defines
  them; ``attn_sink`` joins the softmax denominator only.

The same kernel serves the sparse decode of ``mla_sparse_decode.py`` (``flash_mla_with_kvcache``)
through constexpr modes: ``PAGED`` (an entry is token ``page * page_size + slot`` of a paged cache;
``PAGE_SHIFTS``: power-of-two pages, page and slot by shift and mask),
``LAYOUT`` (rows of q's dtype, or DeepSeek-V4 / V3.2 packed fp8 rows read as bytes and dequantised
to q's dtype before each dot; the layouts and how a tile's rows are read: ``sparse_rows.py``),
``HAS_EXTRA`` (a second index list into a second cache, one softmax with the first: the main list's
tiles, then the extra list's, each tile reading one cache) and ``SPLIT`` (a program takes
``split_len`` entries of that list and writes its normalised partial output and LSE for a combine).
Tokens are ``(b, s)`` pairs (``tokens_per_batch`` = ``s``'s range; prefill: 1).

Tiles: ``BLOCK_H`` heads x ``BLOCK_N`` entries; the score dot over ``d_qk`` either in two pieces
held for the whole loop (the power-of-two part of ``d_qk`` and the rest: 512 + 64, ``SCORE_CHUNK =
0``; the K tile's first ``d_v`` channels are then V; DeepSeek-V4 pages: one 512-wide piece, its
448 fp8 channels dequantised and its last 64 the bf16 rope channels read as one contiguous tile) or in
``SCORE_CHUNK``-channel chunks re-read per tile, with the output channels split over
``BLOCK_DV``-wide slices, one program each (each repeats the score dot: the Intel tiles, where a
``16 x 512`` fp32 accumulator beside a ``16 x 576`` K tile would spill). Configs come from
``tune.lookup("mla_sparse", ...)`` (bucket fields ``h`` = query heads per KV head rounded up to a
power of two in 16..128, ``d`` = d_qk, ``dtype``; the decode adds ``cache``). The H100's file holds
tiles timed there (2026-11-28: 64-head tiles at h >= 128 although ptxas spills them, 64-entry tiles
below, a ``waves`` count of programs per SM for the decode's splits and a ``min_split_tokens``
floor on a split's entries); the H200's file the same tiles, timed there (1.7-4x the built-in ones;
prefill h 32 / 64 1.2-1.4x the nearest bucket's), except bf16 decode h 16 on 16 x 32 entries at 3
stages, and bf16 decode h 16 / 128 and prefill h 128 loading each tile's index entries a tile ahead
(``prefetch_from_tiles``; the rows then multi-buffered) with decode splits of at least 64 entries;
elsewhere the built-in tiles are the largest that compile without spilling (Intel: native code
through ocloc; NVIDIA: sm_90 through ptxas), 1.8-3x slower than the H100's on the H100.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device
from .. import tune
from .._common import (
    MAX_GRID_DIM_1,
    cdiv,
    config_pow2,
    device_guard,
    gdc_launch_dependents,
    next_power_of_2,
    register_xpu_compile,
    softmax_step,
)
from .sparse_rows import LAYOUT_FP8_V4, LAYOUT_FP8_V32, LAYOUT_PLAIN, _cache_rows, _k_cols, _rows_cols_mask

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# the same, for kernels (a kernel reads module globals only as constexprs)
_LOG2E = tl.constexpr(LOG2E)
_LN2 = tl.constexpr(LN2)

#: head dims this op accepts: d_qk (and d_v <= d_qk) multiples of 8 up to this
MAX_HEAD_DIM = 1024


@triton.jit
def _score_dot(q, k, DOT_PRECISION: tl.constexpr):
    """``q @ k^T`` accumulated in fp32 (``q [BLOCK_H, C]``, ``k [BLOCK_N, C]``, one dtype): every
    score dot of the kernel goes through this one site."""
    return tl.dot(q, tl.trans(k), out_dtype=tl.float32, input_precision=DOT_PRECISION)


@triton.jit
def _value_dot(p, v, acc, DOT_PRECISION: tl.constexpr):
    """``acc + p @ v`` (``p [BLOCK_H, BLOCK_N]`` fp32 probabilities, cast to ``v``'s dtype): every
    P @ V dot of the kernel (the main accumulator's and DeepSeek-V4's rope accumulator's) goes
    through this one site."""
    return tl.dot(p.to(v.dtype), v, acc=acc, input_precision=DOT_PRECISION)


@triton.jit
def _tile_entries(tile_start, hi, n_main, main_hi, main_end, x_lo, idx_row, stride_i_k, x_idx_row, x_stride_i_k,
                  BLOCK_N: tl.constexpr, HAS_EXTRA: tl.constexpr):
    """``(idx, listed)``: the index entries of the walk's tile starting at ``tile_start`` and which
    of them are listed (counted and this program's); a tile at or past the walk's end lists none
    and loads nothing. ``HAS_EXTRA``: tiles from ``main_end`` on are the extra list's, from entry
    ``x_lo`` of the joined list on (``n_main``: its main entries; ``main_hi``: the main tiles' end
    of entries)."""
    if HAS_EXTRA:
        main = tile_start < main_end
        offs = tl.where(main, tile_start, tile_start - main_end + x_lo) + tl.arange(0, BLOCK_N)
        listed = offs < tl.where(main, main_hi, hi)
        # a main tile's entries lie below main_hi, an extra tile's from x_lo on (main_hi <= x_lo)
        idx = tl.load(idx_row + offs.to(tl.int64) * stride_i_k, mask=offs < main_hi, other=-1)
        x_idx = tl.load(x_idx_row + (offs - n_main).to(tl.int64) * x_stride_i_k, mask=listed & (offs >= x_lo),
                        other=-1)
        idx = tl.where(main, idx, x_idx)
    else:
        offs = tile_start + tl.arange(0, BLOCK_N)
        listed = offs < hi
        idx = tl.load(idx_row + offs.to(tl.int64) * stride_i_k, mask=listed, other=-1)
    return idx, listed


@triton.jit
def _mla_sparse_kernel(
    q_ptr,  # [.., h_q, D_QK] query rows of token (b, s): q_ptr + b * stride_q_b + s * stride_q_s
    stride_q_b,
    stride_q_s,
    stride_q_h,
    kv_ptr,  # rows (LAYOUT_PLAIN, q's dtype) or packed fp8 pages (bytes)
    stride_kv_page,  # elements (bytes) from one page (PAGED) or row to the next
    stride_kv_slot,  # from one token of a page to the next (PAGED; LAYOUT_FP8_V4: unused)
    stride_kv_h,
    page_size,
    page_shift,  # log2(page_size) (read when PAGE_SHIFTS)
    num_rows,  # tokens of the cache: an index outside [0, num_rows) is never followed
    idx_ptr,  # index lists of token (b, s) and KV head: int32 / int64 (any strides)
    stride_i_b,
    stride_i_s,
    stride_i_h,
    stride_i_k,
    topk_length_ptr,  # read when HAS_TOPK_LENGTH: entries of token (b, s) that count
    stride_tl_b,
    stride_tl_s,
    x_kv_offset,  # the extra cache (HAS_EXTRA): its start, in elements (bytes) from kv_ptr; same layout
    x_stride_kv_page,
    x_stride_kv_slot,
    x_page_size,
    x_page_shift,
    x_num_rows,
    x_idx_ptr,
    x_stride_i_b,
    x_stride_i_s,
    x_stride_i_k,
    x_topk_length_ptr,  # read when HAS_EXTRA_TOPK_LENGTH
    x_stride_tl_b,
    sink_ptr,  # [h_q] float (read when HAS_SINK)
    stride_sink,
    out_ptr,  # SPLIT: fp32 partials [tokens, h_q, splits, D_V]; else the output, token (b, s)
    stride_o_b,
    stride_o_s,
    stride_o_h,
    stride_o_split,
    max_logits_ptr,  # fp32, token (b, s) (written when WRITE_MAX)
    stride_m_b,
    stride_m_s,
    stride_m_h,
    lse_ptr,  # fp32, token (b, s); SPLIT: partial LSEs [tokens, h_q, splits]
    stride_l_b,
    stride_l_s,
    stride_l_h,
    stride_l_split,
    qk_scale,  # sm_scale * log2(e)
    tokens_per_batch,  # s_q of the decode layout (1: every token its own batch)
    topk,  # entries per index list
    x_topk,  # entries per extra index list (HAS_EXTRA)
    split_len,  # SPLIT: entries per split of the joined list [counted main entries | counted extra entries]
    group,  # query heads per KV head (h_q // h_kv)
    D_QK: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_MAIN: tl.constexpr,  # SCORE_CHUNK == 0: channels [0, min(D_QK, BLOCK_MAIN)) of the score dot ...
    BLOCK_TAIL: tl.constexpr,  # ... and the rest, [BLOCK_MAIN, BLOCK_MAIN + BLOCK_TAIL) (0: none)
    SCORE_CHUNK: tl.constexpr,  # > 0: the score dot in chunks of this many channels, q re-read per tile
    BLOCK_DV: tl.constexpr,  # output channels per program (a power of two)
    LAYOUT: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SHIFTS: tl.constexpr,  # PAGED: every cache's page size is a power of two (page_shift, x_page_shift)
    HAS_TOPK_LENGTH: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    HAS_EXTRA_TOPK_LENGTH: tl.constexpr,
    HAS_SINK: tl.constexpr,
    SPLIT: tl.constexpr,  # write normalised partials and their LSEs (combined by another kernel)
    WRITE_MAX: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    FP8_CVT: tl.constexpr,  # fp8 caches: the hardware's e4m3 conversion (NVIDIA sm_89+)
    LAUNCH_DEPENDENTS: tl.constexpr = False,  # SPLIT: let the combine start (device.programmatic_launch)
    PREFETCH_ENTRIES: tl.constexpr = False,  # each tile's index entries loaded one tile ahead
):
    NUM_DV: tl.constexpr = (D_V + BLOCK_DV - 1) // BLOCK_DV
    # the K tile of the held-q path is V too when one program owns all output channels in it
    V_FROM_K: tl.constexpr = (SCORE_CHUNK == 0 and NUM_DV == 1) and BLOCK_DV == BLOCK_MAIN
    # the score dot's tail piece starts here (below BLOCK_MAIN only for d_qk < 16)
    TAIL_AT: tl.constexpr = D_QK if D_QK < BLOCK_MAIN else BLOCK_MAIN
    DTYPE: tl.constexpr = q_ptr.dtype.element_ty
    t = tl.program_id(0)  # token (axis 0: up to 2^31 - 1 tokens)
    pid = tl.program_id(1)
    split = tl.program_id(2)
    b32 = t // tokens_per_batch  # 32-bit division (see _cache_rows), then 64-bit offsets
    sq = (t - b32 * tokens_per_batch).to(tl.int64)
    b = b32.to(tl.int64)
    dv_tile = pid % NUM_DV
    head_block = pid // NUM_DV
    blocks_per_group = tl.cdiv(group, BLOCK_H)
    kv_head = head_block // blocks_per_group
    local = (head_block % blocks_per_group) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = local < group
    head = (kv_head * group + local).to(tl.int64)

    # entries that count: the first topk_length of the list (clamped to [0, topk]), then (HAS_EXTRA)
    # the first extra_topk_length of the extra list: the joined list [main | extra] splits share out
    # (the loop below walks it list by list)
    n_main = topk
    if HAS_TOPK_LENGTH:
        n_main = tl.minimum(tl.maximum(tl.load(topk_length_ptr + b * stride_tl_b + sq * stride_tl_s), 0), topk)
    n_all = n_main
    if HAS_EXTRA:
        n_extra = x_topk
        if HAS_EXTRA_TOPK_LENGTH:
            n_extra = tl.minimum(tl.maximum(tl.load(x_topk_length_ptr + b * x_stride_tl_b), 0), x_topk)
        n_all = n_main + n_extra
    lo = 0
    hi = n_all
    if SPLIT:
        # this program's share of the joined list: entries [split * split_len, + split_len)
        lo = split * split_len
        hi = tl.minimum(lo + split_len, n_all)

    q_rows = q_ptr + b * stride_q_b + sq * stride_q_s + head * stride_q_h  # [BLOCK_H] row starts
    if SCORE_CHUNK == 0:
        cm = tl.arange(0, BLOCK_MAIN)
        q_main = tl.load(q_rows[:, None] + cm[None, :], mask=_rows_cols_mask(row_ok, cm, TAIL_AT, BLOCK_MAIN), other=0.0)
        if BLOCK_TAIL > 0:
            ct = TAIL_AT + tl.arange(0, BLOCK_TAIL)
            q_tail = tl.load(q_rows[:, None] + ct[None, :],
                             mask=_rows_cols_mask(row_ok, ct, D_QK, TAIL_AT + BLOCK_TAIL), other=0.0)
    dv = dv_tile * BLOCK_DV + tl.arange(0, BLOCK_DV)
    idx_row = idx_ptr + b * stride_i_b + sq * stride_i_s + kv_head.to(tl.int64) * stride_i_h
    kv_head_start = kv_head.to(tl.int64) * stride_kv_h
    if HAS_EXTRA:
        x_idx_row = x_idx_ptr + b * x_stride_i_b + sq * x_stride_i_s

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    # the joined list walked as its two lists in turn, tile by tile in one loop: the main list's tiles
    # [lo, main_hi), then the extra list's [x_lo, hi), so that each tile's entries name one cache
    # whose page geometry is a scalar (its row addresses computed once in each layout that uses
    # them, not for both caches and selected entry by entry: sm_90, V4 64 x 64: 3132 -> 2416 loop
    # instructions a warp a tile). The loop runs over tile starts in [lo, loop_hi): the main tiles'
    # own, then the extra tiles' shifted to follow them
    loop_hi = hi
    if HAS_EXTRA:
        main_hi = tl.minimum(hi, n_main)
        main_end = lo + tl.cdiv(tl.maximum(main_hi - lo, 0), BLOCK_N) * BLOCK_N  # the main tiles' end
        x_lo = tl.maximum(lo, n_main)
        loop_hi = main_end + tl.cdiv(tl.maximum(hi - x_lo, 0), BLOCK_N) * BLOCK_N
    else:
        # _tile_entries' extra-list arguments, not read without the extra list
        main_hi = hi
        main_end = loop_hi
        x_lo = hi
        x_idx_row = idx_row
    if PREFETCH_ENTRIES:
        # a tile's index entries are loaded while the tile before it is worked on, their latency
        # hidden instead of starting the tile; Triton carries them in each layout the tile uses
        # them in (sm_90, V4 64 x 64: 212 B spilled against 60), which pays on long walks only
        # (tune: prefetch_from_tiles)
        idx_next, listed_next = _tile_entries(lo, hi, n_main, main_hi, main_end, x_lo, idx_row, stride_i_k,
                                              x_idx_row, x_stride_i_k, BLOCK_N, HAS_EXTRA)
    for tile_start in range(lo, loop_hi, BLOCK_N):
        if PREFETCH_ENTRIES:
            idx = idx_next
            listed = listed_next
            idx_next, listed_next = _tile_entries(tile_start + BLOCK_N, hi, n_main, main_hi, main_end, x_lo, idx_row,
                                                  stride_i_k, x_idx_row, x_stride_i_k, BLOCK_N, HAS_EXTRA)
        else:
            idx, listed = _tile_entries(tile_start, hi, n_main, main_hi, main_end, x_lo, idx_row, stride_i_k,
                                        x_idx_row, x_stride_i_k, BLOCK_N, HAS_EXTRA)
        list_base = kv_head_start
        list_stride_page = stride_kv_page
        list_stride_slot = stride_kv_slot
        list_page_size = page_size
        list_page_shift = page_shift
        list_num_rows = num_rows
        if HAS_EXTRA:
            main = tile_start < main_end
            list_base = tl.where(main, kv_head_start, x_kv_offset)
            list_stride_page = tl.where(main, stride_kv_page, x_stride_kv_page)
            list_stride_slot = tl.where(main, stride_kv_slot, x_stride_kv_slot)
            list_page_size = tl.where(main, page_size, x_page_size)
            list_page_shift = tl.where(main, page_shift, x_page_shift)
            list_num_rows = tl.where(main, num_rows, x_num_rows)
        valid, rows, scale_rows = _cache_rows(list_base, idx, listed, list_page_size, list_page_shift,
                                              list_stride_page, list_stride_slot, list_num_rows, LAYOUT, PAGED,
                                              PAGE_SHIFTS)
        rows = kv_ptr + rows
        scale_rows = kv_ptr + scale_rows
        if SCORE_CHUNK == 0:
            k_main = _k_cols(rows, scale_rows, valid, 0, BLOCK_MAIN, 0, BLOCK_MAIN, TAIL_AT, LAYOUT, DTYPE, FP8_CVT, True)
            s = _score_dot(q_main, k_main, DOT_PRECISION)
            if BLOCK_TAIL > 0:
                k_tail = _k_cols(rows, scale_rows, valid, TAIL_AT, BLOCK_TAIL, TAIL_AT, TAIL_AT + BLOCK_TAIL, D_QK,
                                 LAYOUT, DTYPE, FP8_CVT, True)
                s = s + _score_dot(q_tail, k_tail, DOT_PRECISION)
        else:
            for c in tl.static_range((D_QK + SCORE_CHUNK - 1) // SCORE_CHUNK):
                cc = c * SCORE_CHUNK + tl.arange(0, SCORE_CHUNK)
                q_c = tl.load(q_rows[:, None] + cc[None, :],
                              mask=_rows_cols_mask(row_ok, cc, D_QK, (c + 1) * SCORE_CHUNK), other=0.0)
                k_c = _k_cols(rows, scale_rows, valid, c * SCORE_CHUNK, SCORE_CHUNK, c * SCORE_CHUNK, (c + 1) * SCORE_CHUNK,
                              D_QK, LAYOUT, DTYPE, FP8_CVT, False)
                part = _score_dot(q_c.to(DTYPE), k_c, DOT_PRECISION)
                s = part if c == 0 else s + part
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
        p, alpha, m_i, l_i = softmax_step(s, m_i, l_i)
        if V_FROM_K:
            v = k_main
        else:
            v = _k_cols(rows, scale_rows, valid, dv_tile * BLOCK_DV, BLOCK_DV, 0, NUM_DV * BLOCK_DV, D_QK, LAYOUT, DTYPE,
                        FP8_CVT, False)
        acc = _value_dot(p, v, acc * alpha[:, None], DOT_PRECISION)

    if SPLIT and LAUNCH_DEPENDENTS:
        # the split combine, launched programmatically after this kernel, may start once every
        # program of this grid is past its key loop (it waits in-kernel for this grid's writes;
        # earlier, its programs would take the place of this grid's later ones)
        gdc_launch_dependents()
    if D_V % BLOCK_DV == 0:
        o_mask = row_ok[:, None]
    else:
        o_mask = row_ok[:, None] & (dv < D_V)[None, :]
    no_key = l_i == 0.0  # NaN from a selected row stays NaN
    l_safe = tl.where(no_key, 1.0, l_i)
    lse_row = lse_ptr + b * stride_l_b + sq * stride_l_s + head * stride_l_h
    if SPLIT:
        # this split's normalised output and natural-log LSE (-inf: no entry; the combine weighs it 0)
        o_rows = out_ptr + b * stride_o_b + sq * stride_o_s + head * stride_o_h + split * stride_o_split
        tl.store(o_rows[:, None] + dv[None, :], acc / l_safe[:, None], mask=o_mask)
        if dv_tile == 0:
            lse = tl.where(no_key, float("-inf"), (m_i + tl.log2(l_safe)) * _LN2)
            tl.store(lse_row + split * stride_l_split, lse, mask=row_ok)
    else:
        # l_i > 0 for every row that saw a valid entry; a token without one has acc = 0 and gives 0
        # (with or without a sink), never 0 / 0; NaN from a selected row propagates
        denom = l_i
        if HAS_SINK:
            sink = tl.load(sink_ptr + head * stride_sink, mask=row_ok, other=float("-inf")).to(tl.float32) * _LOG2E
            m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
            denom = l_i + tl.exp2(sink - m_safe)  # a +inf sink: denominator inf, output 0
        denom_safe = tl.where(denom > 0.0, denom, 1.0)
        o = acc / denom_safe[:, None]
        o_rows = out_ptr + b * stride_o_b + sq * stride_o_s + head * stride_o_h
        tl.store(o_rows[:, None] + dv[None, :], o.to(out_ptr.dtype.element_ty), mask=o_mask)
        if dv_tile == 0:
            # natural-log units of the scaled logits; a token without a valid entry: max -inf, lse +inf
            lse = tl.where(no_key, float("inf"), (m_i + tl.log2(l_safe)) * _LN2)
            tl.store(lse_row, lse, mask=row_ok)
            if WRITE_MAX:
                tl.store(max_logits_ptr + b * stride_m_b + sq * stride_m_s + head * stride_m_h, m_i * _LN2,
                         mask=row_ok)


#: the XPU heuristic's tile as kernel constexprs (see ``_heuristic_config``): 0 B spilled on pvc and
#: bmg (triton-xpu 3.3 -> ocloc, the registered variants below)
_XPU_TILES_CONSTEXPRS = dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=64, BLOCK_DV=64)


def _register_compile_variants():
    deepseek = dict(
        q_ptr="*bf16", stride_q_b="i64", stride_q_s="i32", stride_q_h="i32",
        kv_ptr="*bf16", stride_kv_page="i64", stride_kv_slot="i32", stride_kv_h="i32", page_size="i32", page_shift="i32",
        num_rows="i32",
        idx_ptr="*i32", stride_i_b="i64", stride_i_s="i32", stride_i_h="i32", stride_i_k="i32",
        topk_length_ptr="*i32", stride_tl_b="i32", stride_tl_s="i32",
        x_kv_offset="i64", x_stride_kv_page="i64", x_stride_kv_slot="i32", x_page_size="i32", x_page_shift="i32",
        x_num_rows="i32",
        x_idx_ptr="*i32", x_stride_i_b="i64", x_stride_i_s="i32", x_stride_i_k="i32",
        x_topk_length_ptr="*i32", x_stride_tl_b="i32",
        sink_ptr="*fp32", stride_sink="i32",
        out_ptr="*bf16", stride_o_b="i64", stride_o_s="i32", stride_o_h="i32", stride_o_split="i32",
        max_logits_ptr="*fp32", stride_m_b="i32", stride_m_s="i32", stride_m_h="i32",
        lse_ptr="*fp32", stride_l_b="i32", stride_l_s="i32", stride_l_h="i32", stride_l_split="i32",
        qk_scale="fp32", tokens_per_batch="i32", topk="i32", x_topk="i32", split_len="i32", group="i32",
        D_QK=576, D_V=512, BLOCK_H=16, BLOCK_N=16, BLOCK_MAIN=512, BLOCK_TAIL=64, LAYOUT=LAYOUT_PLAIN,
        PAGED=False, PAGE_SHIFTS=False,
        HAS_TOPK_LENGTH=True, HAS_EXTRA=False, HAS_EXTRA_TOPK_LENGTH=False, HAS_SINK=True, SPLIT=False,
        WRITE_MAX=True, DOT_PRECISION="tf32", FP8_CVT=False,
        LAUNCH_DEPENDENTS=False,  # a CUDA launch mode (device.programmatic_launch)
        PREFETCH_ENTRIES=False,  # a launch mode of long walks (config prefetch_from_tiles)
    )
    opts = dict(dots=2, op="mla_sparse", num_warps=8, num_stages=1, grf_mode=_device.xpu_large_grf_mode())
    # as the XPU heuristic launches it: 16 heads x 16 entries, the score dot in 64-channel chunks,
    # 64 output channels a program (gathered rows: no 2D block reads)
    register_xpu_compile(_mla_sparse_kernel, "bf16,D576,DV512,BH16xDV64,chunks64,sink,topk_length",
                         {**deepseek, **_XPU_TILES_CONSTEXPRS}, **opts)
    register_xpu_compile(_mla_sparse_kernel, "fp16,D512,DV512,BH16xDV64,chunks64",
                         {**deepseek, **_XPU_TILES_CONSTEXPRS, "q_ptr": "*fp16", "kv_ptr": "*fp16", "out_ptr": "*fp16",
                          "D_QK": 512, "BLOCK_TAIL": 0, "HAS_TOPK_LENGTH": False,
                          "HAS_SINK": False}, **opts)
    # sparse decode (flash_mla_with_kvcache): paged caches, the extra cache, split partials
    decode = {**deepseek, **_XPU_TILES_CONSTEXPRS, "PAGED": True, "PAGE_SHIFTS": True, "HAS_EXTRA": True,
              "HAS_EXTRA_TOPK_LENGTH": True, "WRITE_MAX": False}
    register_xpu_compile(_mla_sparse_kernel, "decode,bf16,D576,paged,extra,split,BH16xDV64,chunks64",
                         {**decode, "out_ptr": "*fp32", "HAS_SINK": False, "SPLIT": True}, **opts)
    # DeepSeek-V4's packed fp8 pages (bytes), dequantised to bf16 before each dot
    v4 = {**decode, "kv_ptr": "*u8", "D_QK": 512, "BLOCK_TAIL": 0, "LAYOUT": LAYOUT_FP8_V4}
    fp8_opts = {**opts, "num_warps": 16}
    register_xpu_compile(_mla_sparse_kernel, "decode,fp8-v4,D512,paged,extra,sink,BH16xDV64,chunks64,16warps", v4,
                         **fp8_opts)
    register_xpu_compile(_mla_sparse_kernel, "decode,fp8-v4,D512,paged,extra,split,BH16xDV64,chunks64,16warps",
                         {**v4, "out_ptr": "*fp32", "HAS_SINK": False, "SPLIT": True}, **fp8_opts)
    # DeepSeek-V3.2's fp8 records (656 bytes: fp32 tile scales inline)
    register_xpu_compile(_mla_sparse_kernel, "decode,fp8-v32,D576,paged,sink,BH16xDV64,chunks64,16warps",
                         {**decode, "kv_ptr": "*u8", "LAYOUT": LAYOUT_FP8_V32, "HAS_EXTRA": False,
                          "HAS_EXTRA_TOPK_LENGTH": False}, **fp8_opts)


_register_compile_variants()


def _heuristic_config(group: int, dtype: torch.dtype, cache: str | None = None) -> dict:
    """Built-in tiles, where no config file covers ``mla_sparse`` / ``mla_sparse_decode`` (the H100's
    does; the H200's for the buckets timed there)."""
    # ``SCORE_CHUNK`` 0 = the score dot in two held pieces, ``BLOCK_DV`` 0 = all output channels in
    # one program. ``cache``: the decode's cache layout (None: prefill).
    backend = _device.backend()
    if backend == "interpreter":
        return dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=4, num_stages=1)
    if backend == "xpu":
        # MLA's Intel tiles (mla.xpu_tiles, chosen on native code): 16 entries, 64 output channels
        # a program, the score dot in 64-channel chunks beside them; fp8 pages dequantised in
        # registers on 16 warps (8 spill 0.4-1.9 KB with the extra cache; ocloc, pvc and bmg)
        fp8 = cache is not None and cache != "plain"
        return dict(_XPU_TILES_CONSTEXPRS, num_warps=16 if fp8 else 8, num_stages=1, grf_mode="256")
    # NVIDIA without a config file: the largest tiles that compile without spilling for sm_90 at
    # d_qk 576 / d_v 512 (ptxas through Triton 3.9; on the H100 its file's tiles ran 1.8-3x faster
    # although they spill): 16 or 32 heads
    # x 32 entries on 8 warps, 198 / 254 registers. 64-head tiles spill 0.7-1.4 KB a thread there
    # (the 64 x 512 fp32 accumulator), as do 64-entry tiles (184-992 B)
    if dtype == torch.float32:
        return dict(BLOCK_H=16 if group <= 16 else 32, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0,
                    num_warps=4 if group <= 16 else 8, num_stages=1)
    if cache is not None:
        # the decode (paged rows, the extra list, split partials): 16-entry tiles, 0 B spilled at
        # sm_90 (16 / 32 heads over bf16 rows: 188 / 255 registers; fp8 pages, dequantised in
        # registers: 16 heads, 250; their 32-head or 32-entry tiles spill 0.3-1.1 KB)
        block_h = 16 if group <= 16 or cache != "plain" else 32
        return dict(BLOCK_H=block_h, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=8, num_stages=2)
    return dict(BLOCK_H=16 if group <= 16 else 32, BLOCK_N=32, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=8, num_stages=2)


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def sparse_tiles(h_q: int, h_kv: int, d_qk: int, d_v: int, dtype: torch.dtype, device, *, op: str = "mla_sparse",
                 cache: str | None = None) -> dict:
    """The kernel's tiles for these sizes: ``tune.lookup(op, ...)`` over the built-in heuristic,
    checked, with the derived constexprs and ``programs_per_token`` (head blocks x channel slices
    per token). ``cache``: the bucket's cache field (the layout), when not q's dtype."""
    group = h_q // h_kv
    fields = {"h": tune.pow2_bucket(group, 16, 128), "d": d_qk, "dtype": str(dtype).replace("torch.", "")}
    if cache is not None:
        fields["cache"] = cache
    config = tune.lookup(op, fields, _heuristic_config(group, dtype, cache), device=device)
    block_h = config_pow2("mla_sparse", "BLOCK_H", config["BLOCK_H"])
    block_n = config_pow2("mla_sparse", "BLOCK_N", config["BLOCK_N"])
    score_chunk = int(config.get("SCORE_CHUNK", 0) or 0)
    if score_chunk:
        score_chunk = config_pow2("mla_sparse", "SCORE_CHUNK", score_chunk)
    if cache not in (None, "plain") and _device.backend() == "cuda":
        # tiles over fp8 caches that sm_90 compiles wrongly (Triton 3.6; the interpreter's outputs
        # are right): refused, not run. 64 heads x 128 entries gave wrong outputs (relative error
        # ~1); 64 or 128 heads x 16 or 32 entries with the score dot in chunks gave wrong outputs or
        # illegal memory accesses (DeepSeek-V4 and V3.2 pages, 4 and 8 warps, 1 and 2 stages, with
        # and without the hardware e4m3 conversion; H200, 2026-11-28). The same tiles over bf16
        # rows, and chunked tiles of 64 entries or of 16 / 32 heads, compute right.
        if block_n > 64:
            raise ValueError(f"BLOCK_N must be at most 64 for fp8 caches on CUDA, got {block_n}")
        if score_chunk and block_h >= 64 and block_n < 64:
            raise ValueError(f"BLOCK_N must be at least 64 for fp8 caches on CUDA when BLOCK_H >= 64 and "
                             f"SCORE_CHUNK > 0, got BLOCK_N {block_n} (BLOCK_H {block_h}, SCORE_CHUNK {score_chunk})")
    block_dv_all = max(16, next_power_of_2(d_v))
    block_dv = int(config.get("BLOCK_DV", 0) or 0)
    block_dv = min(config_pow2("mla_sparse", "BLOCK_DV", block_dv), block_dv_all) if block_dv else block_dv_all
    num_dv = cdiv(d_v, block_dv)
    # the score dot's held pieces: the largest power of two <= d_qk (at least 16), then the rest
    block_main = max(16, 1 << (d_qk.bit_length() - 1))
    rest = d_qk - min(d_qk, block_main)
    block_tail = max(16, next_power_of_2(rest)) if rest > 0 else 0
    programs_per_token = h_kv * cdiv(group, block_h) * num_dv
    if programs_per_token > MAX_GRID_DIM_1:
        raise ValueError(
            f"q has too many heads for one launch: {h_q} heads in blocks of {block_h} x {num_dv} channel slices "
            f"need {programs_per_token} programs a token (at most {MAX_GRID_DIM_1})"
        )
    return dict(config=config, group=group, d_qk=d_qk, d_v=d_v, BLOCK_H=block_h, BLOCK_N=block_n,
                BLOCK_MAIN=block_main, BLOCK_TAIL=block_tail, SCORE_CHUNK=score_chunk, BLOCK_DV=block_dv,
                programs_per_token=programs_per_token)


def _offset_from(base: torch.Tensor, other: torch.Tensor) -> int:
    """Where ``other``'s data starts, in elements of ``base`` from ``base``'s (the kernel addresses
    both caches from one pointer); a host-side value (no sync)."""
    delta = other.data_ptr() - base.data_ptr()
    if delta % base.element_size():
        raise ValueError("extra_k_cache must be aligned to its element size like k_cache")
    return delta // base.element_size()


def launch_sparse(tiles: dict, *, grid, device, q, q_strides, kv, kv_strides, page_size: int, num_rows: int,
                  indices, idx_strides, topk_length, tl_strides, attn_sink, out, o_strides, lse, l_strides,
                  sm_scale: float, tokens_per_batch: int, topk: int, layout: int, paged: bool,
                  max_logits=None, m_strides=(0, 0, 0), extra=None, split_len: int = 0) -> None:
    """One launch of ``_mla_sparse_kernel`` (internal; no argument checks). Strides are in
    elements of each tensor (bytes for packed fp8 caches); token strides ``(b, s, ...)``.
    ``extra``: the extra cache's ``dict(kv, kv_strides (page, slot), page_size, num_rows, indices,
    idx_strides (b, s, k), topk, topk_length, tl_stride)``. ``grid[2] > 1``: split mode, ``out`` /
    ``lse`` are the fp32 partials (``o_strides`` / ``l_strides`` end with the split stride)."""
    split = grid[2] > 1
    # absent optional inputs: any tensor in their place (never read)
    x = extra or {}
    # a program's walk, in tiles: entries loaded a tile ahead from the config's prefetch_from_tiles on
    walk_tiles = cdiv(split_len if split else topk + x.get("topk", 0), tiles["BLOCK_N"])
    prefetch_from = int(tiles["config"].get("prefetch_from_tiles", 0) or 0)
    x_lengths = x.get("topk_length")
    x_page_size = x.get("page_size", 1)
    page_shifts = paged and _pow2(page_size) and _pow2(x_page_size)
    with device_guard(device):
        _mla_sparse_kernel[grid](
            q, *q_strides,
            kv, *kv_strides, page_size, page_size.bit_length() - 1, num_rows,
            indices, *idx_strides,
            topk_length if topk_length is not None else indices, *tl_strides,
            _offset_from(kv, x["kv"]) if extra else 0, *x.get("kv_strides", (0, 0)), x_page_size,
            x_page_size.bit_length() - 1,
            x.get("num_rows", 0),
            x.get("indices", indices), *x.get("idx_strides", (0, 0, 0)),
            x_lengths if x_lengths is not None else indices, x.get("tl_stride", 0),
            attn_sink if attn_sink is not None else lse, attn_sink.stride(0) if attn_sink is not None else 0,
            out, *o_strides,
            max_logits if max_logits is not None else lse, *m_strides,
            lse, *l_strides,
            sm_scale * LOG2E, tokens_per_batch, topk, x.get("topk", 0), split_len, tiles["group"],
            D_QK=tiles["d_qk"], D_V=tiles["d_v"], BLOCK_H=tiles["BLOCK_H"], BLOCK_N=tiles["BLOCK_N"],
            BLOCK_MAIN=tiles["BLOCK_MAIN"], BLOCK_TAIL=tiles["BLOCK_TAIL"],
            SCORE_CHUNK=tiles["SCORE_CHUNK"],
            BLOCK_DV=tiles["BLOCK_DV"], LAYOUT=layout, PAGED=paged, PAGE_SHIFTS=page_shifts,
            HAS_TOPK_LENGTH=topk_length is not None, HAS_EXTRA=extra is not None,
            HAS_EXTRA_TOPK_LENGTH=x_lengths is not None, HAS_SINK=attn_sink is not None and not split,
            SPLIT=split, WRITE_MAX=max_logits is not None,
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            FP8_CVT=layout != LAYOUT_PLAIN and _device.cuda_fp8(device),
            LAUNCH_DEPENDENTS=split and _device.programmatic_launch(device),
            PREFETCH_ENTRIES=0 < prefetch_from <= walk_tiles,
            **tune.launch_options(tiles["config"], fp32_dot_columns=max(tiles["BLOCK_N"], tiles["BLOCK_DV"] or tiles["d_v"])
                                  if q.dtype == torch.float32 else 0),
        )
