"""The MLA kernel family (DeepSeek-style latent attention): one kernel, ``_mla_attention_kernel``,
serves ``flash_mla_decode`` (``mla_decode.py``: one tile of query rows per request, KV splits)
and ``flash_mla_prefill`` (``mla_prefill.py``: its ragged mode, ``RAGGED``: query tiles over
``cu_seqlens_q``, causal or not). This module holds the kernel, its XPU compile variants, and what
both launchers share: the XPU tiles, the latent-chunk and tensor-descriptor choices, and the
argument checks of the queries, the latent cache and the scales.

K of a token is its whole cached row (``R`` latent channels + ``Dr`` rope channels), V is the
first ``R`` channels of the same row: the kernel loads each KV tile once and uses it for both
dots. A program owns

* a block of ``BLOCK_H`` query rows of one request, packed into the ``tl.dot`` M dimension
  (rows are ``(token, head)`` pairs, so with q_len > 1 the new tokens share the tile), so a KV
  tile is read once for all of them and both dots run on the matrix units;
* a slice of ``BLOCK_DV`` output channels (all ``R`` on NVIDIA; narrower on Intel, where the
  ``BLOCK_H x 512`` fp32 accumulator would not fit the register file);
* one KV split (decode): the request's keys are cut into ``num_kv_splits`` tile-aligned ranges
  whose partial results ``combine_splits`` merges in a fixed order.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device
from .. import tune
from .._common import (
    FP8_DTYPES,
    LaunchShape,
    block_rows,
    cdiv,
    check_int,
    check_page_size,
    check_real,
    check_tensor,
    gdc_launch_dependents,
    next_power_of_2,
    paged_rows_descriptors,
    tile_row,
    clamp_page,
    register_xpu_compile,
    rows_descriptor,
    softmax_step,
)

LOG2E = 1.4426950408889634


@triton.jit
def _tile_mask(rows_ok, cols, LIMIT: tl.constexpr, BLOCK: tl.constexpr):
    """2-D load/store mask of rows ``rows_ok`` x columns ``cols < LIMIT``; the column test is left
    out when every column is valid, so the mask stays uniform along the contiguous dimension
    (vectorised accesses)."""
    if LIMIT == BLOCK:
        return rows_ok[:, None]
    else:
        return rows_ok[:, None] & (cols < LIMIT)[None, :]


@triton.jit
def _ragged_tile_request(cu_seqlens_q_ptr, tile, batch, num_heads, BLOCK_H: tl.constexpr):
    """Largest ``b`` in ``[0, batch]`` with ``first_tile(b) <= tile``, where request ``b``'s row
    tiles are numbered from ``first_tile(b) = cu_seqlens_q[b] * num_heads // BLOCK_H + b`` (every
    request gets at least ``cdiv(q_len * num_heads, BLOCK_H)`` numbers; ``b == batch`` is the
    padding past ``cu_seqlens_q[batch]``)."""
    lo = tl.zeros([], dtype=tl.int32)
    hi = lo + batch
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first_tile = tl.load(cu_seqlens_q_ptr + mid) * num_heads // BLOCK_H + mid
        if first_tile <= tile:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit
def _latent_dot(q_n, kv, DOT_PRECISION: tl.constexpr):
    """``q_n @ kv^T`` in fp32 over latent channels (the whole tile, or one chunk of it)."""
    return tl.dot(q_n, tl.trans(kv), out_dtype=tl.float32, input_precision=DOT_PRECISION)


@triton.jit
def _mla_tile(q_n, q_p, kv, k_pe, v, acc, m_i, l_i, scale, start, hi, key_end, full_end,
              Q_LEN: tl.constexpr, BLOCK_N: tl.constexpr, RAGGED: tl.constexpr, CAUSAL: tl.constexpr,
              DOT_PRECISION: tl.constexpr, LATENT_SCORES: tl.constexpr = False):
    """One key tile: scores over the latent (``kv``) and rope (``k_pe``) channels, the mask of
    keys past ``hi`` / past each row's causal end, the online-softmax update, ``acc += P @ v``."""
    offs_n = start + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hi
    s = kv if LATENT_SCORES else _latent_dot(q_n, kv, DOT_PRECISION)
    s = tl.dot(q_p, tl.trans(k_pe), acc=s, input_precision=DOT_PRECISION)
    s = s * scale
    if RAGGED:
        if start + BLOCK_N > full_end:
            # the diagonal tiles and the last partial tile: keys past `hi` were loaded as 0
            # (never garbage) and get probability 0 here
            if CAUSAL:
                s = tl.where((offs_n[None, :] < key_end[:, None]) & n_ok[None, :], s, float("-inf"))
            else:
                s = tl.where(n_ok[None, :], s, float("-inf"))
    elif Q_LEN == 1:
        s = tl.where(n_ok[None, :], s, float("-inf"))  # key_end == seq_len >= hi for every row
    else:
        s = tl.where((offs_n[None, :] < key_end[:, None]) & n_ok[None, :], s, float("-inf"))
    p, alpha, m_i, l_i = softmax_step(s, m_i, l_i)
    acc = tl.dot(p.to(v.dtype), v, acc=acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def _mla_attention_kernel(
    q_nope_ptr,  # [B, S, H, R] (any strides, last dim contiguous)
    q_pe_ptr,  # [B, S, H, Dr]
    stride_qn_b,
    stride_qn_t,
    stride_qn_h,
    stride_qp_b,
    stride_qp_t,
    stride_qp_h,
    kv_ptr,  # [num_pages, PAGE_SIZE, R + Dr] (row stride and page stride free, channel stride 1)
    stride_kv_page,
    stride_kv_row,
    kv_desc,  # tensor descriptors of the cache's [pages * PAGE_SIZE, R + Dr] rows (KV_DESC):
    pe_desc,  # [BLOCK_N, R] latent blocks and [BLOCK_N, Dr] rope blocks
    seq_lens_ptr,  # [B]
    page_table_ptr,  # [B, max_pages]
    stride_pt_b,
    max_pages,
    num_pages,  # pages in the cache: a page id outside [0, num_pages) is never followed (the last page is read)
    kv_scale_ptr,  # [1] fp32 dequant scale of an fp8 cache (read when HAS_KV_SCALE)
    out_ptr,  # out [B*S, H, R] (q dtype), or partial outputs [B*S, H, splits, R] fp32 when SPLIT
    stride_o_n,
    stride_o_h,
    stride_o_s,
    lse_ptr,  # lse [B*S, H], or partial LSEs [B*S, H, splits] fp32
    stride_lse_n,
    stride_lse_h,
    stride_lse_s,
    qk_scale,  # sm_scale * log2(e) (times a host-side kv scale)
    v_scale,  # host-side kv scale applied to the output
    num_heads,
    num_splits,
    cu_seqlens_q_ptr,  # [B + 1] query offsets of a ragged batch (read when RAGGED)
    batch,  # B (RAGGED)
    total_q,  # rows of the ragged q / out (RAGGED; rows past cu_seqlens_q[B] are padding)
    Q_LEN: tl.constexpr,
    R: tl.constexpr,
    DR: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_KV_SCALE: tl.constexpr,
    PREFETCH_PAGES: tl.constexpr,
    SPLIT: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    RAGGED: tl.constexpr,
    CAUSAL: tl.constexpr,
    KV_DESC: tl.constexpr = False,
    LATENT_CHUNK: tl.constexpr = 0,  # > 0: latent tiles read in 2D, score dot per chunk
    LAUNCH_DEPENDENTS: tl.constexpr = False,  # let the split combine start (device.programmatic_launch)
    LATENT_DESC: tl.constexpr = False,  # LATENT_CHUNK tiles through device-side descriptors, else block pointers
):
    if SPLIT and LAUNCH_DEPENDENTS:
        # the split combine, launched programmatically after this kernel, may start as soon as
        # every program of this grid has (it waits in-kernel for this grid's writes)
        gdc_launch_dependents()
    NUM_DV: tl.constexpr = BLOCK_R // BLOCK_DV
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    head_block = pid_m // NUM_DV
    dv_tile = pid_m % NUM_DV
    if RAGGED:
        # prefill: the row tiles of all requests form one sequence (grid axis 0), walked from its
        # end so the tiles that see the most keys (a request's last rows) start first
        tile = tl.num_programs(0) // NUM_DV - 1 - head_block
        b32 = _ragged_tile_request(cu_seqlens_q_ptr, tile, batch, num_heads, BLOCK_H)
        q_start = tl.load(cu_seqlens_q_ptr + b32)
        q_len = tl.where(b32 < batch, tl.load(cu_seqlens_q_ptr + tl.minimum(b32 + 1, batch)), total_q) - q_start
        head_block = tile - (q_start * num_heads // BLOCK_H + b32)  # row tile inside the request
        if head_block * BLOCK_H >= q_len * num_heads:
            return
        b = b32.to(tl.int64)
    else:
        q_len = Q_LEN

    # rows of this program: (token, head) pairs, head fastest
    rows = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = rows < q_len * num_heads
    tok = rows // num_heads
    head = rows % num_heads

    if RAGGED:
        # the padding "request" b == batch has no keys: its rows get 0 and LSE -inf
        seq_len = tl.load(seq_lens_ptr + b, mask=b < batch, other=0).to(tl.int32)
    else:
        seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    seq_len = tl.minimum(tl.maximum(seq_len, 0), max_pages * PAGE_SIZE)  # never read past the table
    if RAGGED:
        # query token t sits at position seq_len - q_len + t and sees keys j <= that position
        # (causal, bottom-right: a cached prefix is fully visible). Causal tile bound: the loop
        # stops after the last key the tile's last row sees; keys below `full_end` (whole key
        # tiles) are seen by every row of the tile and skip the per-element mask.
        lo = 0
        if CAUSAL:
            key_end = seq_len - q_len + 1 + tok
            first_tok = head_block * BLOCK_H // num_heads
            last_tok = (tl.minimum(head_block * BLOCK_H + BLOCK_H, q_len * num_heads) - 1) // num_heads
            hi = tl.minimum(tl.maximum(seq_len - q_len + 1 + last_tok, 0), seq_len)
            full_end = tl.minimum(tl.maximum(seq_len - q_len + 1 + first_tok, 0), seq_len) // BLOCK_N * BLOCK_N
        else:
            hi = seq_len
            full_end = seq_len // BLOCK_N * BLOCK_N
            key_end = tok  # unused without the causal mask
    else:
        # keys of this request and of this split (tile aligned; later splits may be empty)
        split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        lo = split * split_len
        hi = tl.minimum(lo + split_len, seq_len)
        # query token t sits at position seq_len - Q_LEN + t and sees keys j <= that position
        key_end = seq_len - Q_LEN + 1 + tok
        full_end = 0  # RAGGED only

    r = tl.arange(0, BLOCK_R)
    dr = tl.arange(0, BLOCK_DR)
    if RAGGED:
        q_tok = q_start + tok  # row of the ragged q / out (the launcher passes stride_qn_b = stride_qp_b = 0)
        # whatever cu_seqlens_q holds (validate=False trusts it), no row outside q / out is touched
        row_ok = row_ok & (q_tok >= 0) & (q_tok < total_q)
    else:
        q_tok = tok
    q_n = tl.load(
        q_nope_ptr + (b * stride_qn_b + q_tok.to(tl.int64) * stride_qn_t + head * stride_qn_h)[:, None] + r[None, :],
        mask=_tile_mask(row_ok, r, R, BLOCK_R),
        other=0.0,
    )
    q_p = tl.load(
        q_pe_ptr + (b * stride_qp_b + q_tok.to(tl.int64) * stride_qp_t + head * stride_qp_h)[:, None] + dr[None, :],
        mask=_tile_mask(row_ok, dr, DR, BLOCK_DR),
        other=0.0,
    )
    scale = qk_scale
    out_scale = v_scale
    if HAS_KV_SCALE:
        kv_scale = tl.load(kv_scale_ptr).to(tl.float32)
        scale = scale * kv_scale
        out_scale = out_scale * kv_scale

    dv = dv_tile * BLOCK_DV + tl.arange(0, BLOCK_DV)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    pt_row = page_table_ptr + b * stride_pt_b
    if PAGE_SIZE < BLOCK_N and PREFETCH_PAGES:
        # short pages: the page ids of a tile are loaded one iteration ahead, so the KV gather of a
        # tile never waits on the page-table read that addresses it
        first = lo + tl.arange(0, BLOCK_N)
        next_pages = tl.load(pt_row + first // PAGE_SIZE, mask=first < hi, other=0)

    if KV_DESC:
        # pages of whole key tiles: whole tiles below `hi` through the descriptors (every key of
        # them is a real key of this request), each tile's page row read one tile ahead; the last,
        # partial tile through masked pointer loads (the rows past `hi` may hold NaN)
        desc_hi = lo + (hi - lo) // BLOCK_N * BLOCK_N
        next_row = tile_row(pt_row, 0, lo, desc_hi, PAGE_SIZE)
        for start in range(lo, desc_hi, BLOCK_N):
            row = next_row
            next_row = tile_row(pt_row, 0, start + BLOCK_N, desc_hi, PAGE_SIZE)
            kv = kv_desc.load([row, 0]).to(q_n.dtype)
            k_pe = pe_desc.load([row, R]).to(q_n.dtype)
            acc, m_i, l_i = _mla_tile(
                q_n, q_p, kv, k_pe, kv, acc, m_i, l_i, scale, start, hi, key_end, full_end,
                Q_LEN, BLOCK_N, RAGGED, CAUSAL, DOT_PRECISION)
        tail = desc_hi
    else:
        tail = lo
    if LATENT_CHUNK > 0:  # q rows read a latent chunk at a time beside each K^T chunk
        q_n_rows = q_nope_ptr + (b * stride_qn_b + q_tok.to(tl.int64) * stride_qn_t + head * stride_qn_h)[:, None]
    for start in range(tail, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        if LATENT_CHUNK > 0:
            page = clamp_page(tl.load(pt_row + start // PAGE_SIZE), num_pages).to(tl.int64)
            kv_tile = kv_ptr + page * stride_kv_page + (start % PAGE_SIZE) * stride_kv_row
            rows_here = tl.minimum(hi - start, BLOCK_N)
            if LATENT_DESC:
                # descriptors over the tile's whole latent rows (and one token's q rows), read a
                # chunk at a time at its column: rows past the length and channels past R read 0
                lat_desc = rows_descriptor(kv_tile, stride_kv_row, R, rows_here, BLOCK_N, LATENT_CHUNK)
                if Q_LEN == 1 and not RAGGED:
                    q_desc = rows_descriptor(q_nope_ptr + b * stride_qn_b + (head_block * BLOCK_H).to(tl.int64) * stride_qn_h,
                                             stride_qn_h, R, num_heads - head_block * BLOCK_H, BLOCK_H, LATENT_CHUNK)
            for c in tl.static_range(BLOCK_R // LATENT_CHUNK):
                lc = c * LATENT_CHUNK + tl.arange(0, LATENT_CHUNK)
                if Q_LEN == 1 and not RAGGED:  # one token's heads: a plain 2D block of q
                    if LATENT_DESC:
                        q_c = q_desc.load([0, c * LATENT_CHUNK])
                    else:
                        q_c = tl.load(tl.make_block_ptr(q_nope_ptr + b * stride_qn_b, shape=(num_heads, R),
                                                        strides=(stride_qn_h, 1), offsets=(head_block * BLOCK_H, c * LATENT_CHUNK),
                                                        block_shape=(BLOCK_H, LATENT_CHUNK), order=(1, 0)),
                                      boundary_check=(0, 1), padding_option="zero")
                else:
                    q_c = tl.load(q_n_rows + lc[None, :], mask=row_ok[:, None] & (lc[None, :] < R), other=0.0)
                if LATENT_DESC:  # [BLOCK_N, LATENT_CHUNK] rows, transposed by the dot
                    k_c = lat_desc.load([0, c * LATENT_CHUNK])
                    part = _latent_dot(q_c, k_c.to(q_c.dtype), DOT_PRECISION)
                else:  # K^T through a column-major block
                    k_c = tl.load(block_rows(kv_tile + c * LATENT_CHUNK, stride_kv_row, R - c * LATENT_CHUNK, rows_here,
                                             0, BLOCK_N, LATENT_CHUNK, True),
                                  boundary_check=(0, 1), padding_option="zero")
                    part = _latent_dot(q_c, tl.trans(k_c.to(q_c.dtype)), DOT_PRECISION)
                s_lat = part if c == 0 else s_lat + part
            if LATENT_DESC:
                k_pe = rows_descriptor(kv_tile + R, stride_kv_row, DR, rows_here, BLOCK_N, BLOCK_DR).load([0, 0])
                v = rows_descriptor(kv_tile, stride_kv_row, R, rows_here, BLOCK_N, BLOCK_DV).load([0, dv_tile * BLOCK_DV])
            else:
                k_pe = tl.load(block_rows(kv_tile + R, stride_kv_row, DR, rows_here, 0, BLOCK_N, BLOCK_DR, False),
                               boundary_check=(0, 1), padding_option="zero")
                v = tl.load(block_rows(kv_tile + dv_tile * BLOCK_DV, stride_kv_row, R - dv_tile * BLOCK_DV, rows_here, 0,
                                       BLOCK_N, BLOCK_DV, False),
                            boundary_check=(0, 1), padding_option="zero")
            k_pe = k_pe.to(q_n.dtype)
            v = v.to(q_n.dtype)
            acc, m_i, l_i = _mla_tile(
                q_n, q_p, s_lat, k_pe, v, acc, m_i, l_i, scale, start, hi, key_end, full_end,
                Q_LEN, BLOCK_N, RAGGED, CAUSAL, DOT_PRECISION, True)
        else:
            if PAGE_SIZE >= BLOCK_N:
                # the tile lies inside one page (tiles are BLOCK_N aligned, both powers of two)
                page = clamp_page(tl.load(pt_row + start // PAGE_SIZE), num_pages)
                row_off = page.to(tl.int64) * stride_kv_page + (offs_n % PAGE_SIZE) * stride_kv_row
            else:
                if PREFETCH_PAGES:
                    page = next_pages
                    ahead = offs_n + BLOCK_N
                    next_pages = tl.load(pt_row + ahead // PAGE_SIZE, mask=ahead < hi, other=0)
                else:
                    page = tl.load(pt_row + offs_n // PAGE_SIZE, mask=n_ok, other=0)
                page = clamp_page(page, num_pages)
                row_off = page.to(tl.int64) * stride_kv_page + (offs_n % PAGE_SIZE).to(tl.int64) * stride_kv_row
            kv = tl.load(kv_ptr + row_off[:, None] + r[None, :], mask=_tile_mask(n_ok, r, R, BLOCK_R),
                         other=0.0)
            k_pe = tl.load(kv_ptr + row_off[:, None] + R + dr[None, :], mask=_tile_mask(n_ok, dr, DR, BLOCK_DR),
                           other=0.0)
            kv = kv.to(q_n.dtype)  # fp8 cache: upcast so both dot operands share q's dtype
            k_pe = k_pe.to(q_n.dtype)
            if NUM_DV == 1:
                v = kv  # V = the first R channels of the tile already loaded for K
            else:
                v = tl.load(kv_ptr + row_off[:, None] + dv[None, :], mask=_tile_mask(n_ok, dv, R, BLOCK_R), other=0.0)
                v = v.to(q_n.dtype)
            acc, m_i, l_i = _mla_tile(
                q_n, q_p, kv, k_pe, v, acc, m_i, l_i, scale, start, hi, key_end, full_end,
                Q_LEN, BLOCK_N, RAGGED, CAUSAL, DOT_PRECISION)

    has_key = l_i > 0.0
    o = acc * (out_scale / tl.where(has_key, l_i, 1.0))[:, None]
    if RAGGED:
        n = q_tok.to(tl.int64)
    else:
        n = b * Q_LEN + tok.to(tl.int64)
    o_ptrs = out_ptr + (n * stride_o_n + head * stride_o_h + split * stride_o_s)[:, None] + dv[None, :]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=_tile_mask(row_ok, dv, R, BLOCK_R))
    if WRITE_LSE:
        if dv_tile == 0:
            lse = tl.where(has_key, (m_i + tl.log2(tl.where(has_key, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
            tl.store(lse_ptr + n * stride_lse_n + head * stride_lse_h + split * stride_lse_s, lse, mask=row_ok)



def xpu_launch_shape(c: dict, heads: int, keys: int = 4096, batch: int = 1, splits: int = 1,
                     kv_bytes: int = 2) -> LaunchShape:
    """The work of one decode launch with the kernel's constexprs ``c`` (``LaunchShape``: the XPU
    native-code table's work columns, bench/experiments/xpu_cost_model.py): ``batch`` requests of
    ``heads`` query heads (``Q_LEN`` tokens each) over ``keys`` cached tokens in ``splits`` KV
    splits. A program loads per key tile the whole latent + rope row (the score dot; its value
    channels are part of that row, read again from cache where loaded apart); the minimum reads
    each cached byte once (all heads share the latent row) and multiplies each (row, key) pair once
    over ``R + Dr`` score and ``R`` value channels."""
    rows = heads * c["Q_LEN"]
    width = c["R"] + c["DR"]
    programs = batch * splits * cdiv(rows, c["BLOCK_H"]) * (c["BLOCK_R"] // c["BLOCK_DV"])
    return LaunchShape(
        shape=f"B{batch} H{heads}" + (f" q{c['Q_LEN']}" if c["Q_LEN"] > 1 else "") + f" L{keys}"
        + (f" s{splits}" if splits > 1 else ""),
        programs=programs,
        iterations=cdiv(cdiv(keys, splits), c["BLOCK_N"]),
        loaded_bytes=c["BLOCK_N"] * width * kv_bytes,
        min_macs=batch * rows * keys * (width + c["R"]),
        min_bytes=batch * keys * width * kv_bytes,
    )


def _launch(heads: int, **kw):
    """``launch=`` of a decode compile variant: its work at ``heads`` query heads, 4096 keys."""
    return lambda c: xpu_launch_shape(c, heads, **kw)


def _register_compile_variants():
    deepseek = dict(
        q_nope_ptr="*bf16", q_pe_ptr="*bf16", stride_qn_b="i64", stride_qn_t="i32", stride_qn_h="i32",
        stride_qp_b="i64", stride_qp_t="i32", stride_qp_h="i32",
        kv_ptr="*bf16", stride_kv_page="i64", stride_kv_row="i32",
        seq_lens_ptr="*i32", page_table_ptr="*i32", stride_pt_b="i32", max_pages="i32", num_pages="i32", kv_scale_ptr="*fp32",
        out_ptr="*fp32", stride_o_n="i64", stride_o_h="i32", stride_o_s="i32",
        lse_ptr="*fp32", stride_lse_n="i32", stride_lse_h="i32", stride_lse_s="i32",
        qk_scale="fp32", v_scale="fp32", num_heads="i32", num_splits="i32",
        cu_seqlens_q_ptr="*i32", batch="i32", total_q="i32",
        Q_LEN=1, R=512, DR=64, PAGE_SIZE=64, BLOCK_H=16, BLOCK_N=32, BLOCK_R=512, BLOCK_DR=64, BLOCK_DV=512,
        HAS_KV_SCALE=False, PREFETCH_PAGES=True, SPLIT=True, WRITE_LSE=True, DOT_PRECISION="tf32",
        RAGGED=False, CAUSAL=True,
        kv_desc=None, pe_desc=None, KV_DESC=False,  # descriptor loads need Triton >= 3.4 (not triton-xpu 3.3)
        LATENT_CHUNK=0, LAUNCH_DEPENDENTS=False,  # a CUDA launch mode (device.programmatic_launch)
        LATENT_DESC=False,  # descriptor latent tiles need Triton >= 3.4 (not triton-xpu 3.3)
    )
    # as XPU launches them (xpu_tiles): 16-key tiles, 64 output channels a program; over pages of
    # 16+ tokens latent tiles through block pointers in 64-channel chunks (2D block reads), one stage
    opts = dict(dots=3, op="mla_decode", num_warps=8, num_stages=2, grf_mode=_device.xpu_large_grf_mode())
    tile = {"BLOCK_N": 16, "BLOCK_DV": 64}
    chunks = {**tile, "LATENT_CHUNK": 64}
    block_2d = dict(opts, num_stages=1, block_2d=("K", "V"))
    # the defaults xpu_tiles picks by the cost model (bench/experiments/xpu_cost_model.py): 16 heads
    # in 128-channel slices on 2 warps, 32-channel score chunks; 128 heads in 64-channel slices on 16
    register_xpu_compile(_mla_attention_kernel, "bf16,H16,P64,BH16xDV128,split,latent chunks",
                         {**deepseek, **chunks, "BLOCK_DV": 128, "LATENT_CHUNK": 32},
                         launch=_launch(16, splits=4), **dict(block_2d, num_warps=2))
    register_xpu_compile(
        _mla_attention_kernel, "bf16,H128,P64,BH128xDV64,single,latent chunks",
        {**deepseek, **chunks, "out_ptr": "*bf16", "BLOCK_H": 128, "SPLIT": False, "WRITE_LSE": False},
        launch=_launch(128), **dict(block_2d, num_warps=16),
    )
    register_xpu_compile(
        _mla_attention_kernel, "bf16,fp8-e4m3 cache,H16,P1,q_len2,BH32xDV64",
        {**deepseek, **tile, "kv_ptr": "*fp8e4nv", "PAGE_SIZE": 1, "Q_LEN": 2, "BLOCK_H": 32, "HAS_KV_SCALE": True},
        launch=_launch(16, kv_bytes=1), **opts,
    )
    register_xpu_compile(
        _mla_attention_kernel, "fp16,R256+32,H32,P16,BH32xDV64,latent chunks",
        {**deepseek, "q_nope_ptr": "*fp16", "q_pe_ptr": "*fp16", "kv_ptr": "*fp16", "out_ptr": "*fp16", "R": 256, "DR": 32,
         "PAGE_SIZE": 16, "BLOCK_H": 32, "BLOCK_R": 256, "BLOCK_DR": 32, "SPLIT": False, **chunks},
        launch=_launch(32), **block_2d,
    )
    # ragged mode (flash_mla_prefill): the XPU heuristic's 32-row x 64-channel tile, P=1 fp8 with LSE,
    # and a non-causal fp16 variant with 16-row tiles
    prefill = {**deepseek, "out_ptr": "*bf16", "stride_qn_b": "i32", "stride_qp_b": "i32", "BLOCK_H": 32, "BLOCK_N": 16,
               "BLOCK_DV": 64, "SPLIT": False, "WRITE_LSE": False, "RAGGED": True}
    prefill_opts = {**opts, "op": "mla_prefill"}
    prefill_2d = {**block_2d, "op": "mla_prefill"}
    register_xpu_compile(_mla_attention_kernel, "prefill,bf16,H128,P64,BH32xDV64,causal,latent chunks",
                         {**prefill, "LATENT_CHUNK": 64}, **prefill_2d)
    register_xpu_compile(
        _mla_attention_kernel, "prefill,bf16,fp8-e4m3 cache,P1,BH32xDV64,lse",
        {**prefill, "kv_ptr": "*fp8e4nv", "PAGE_SIZE": 1, "HAS_KV_SCALE": True, "WRITE_LSE": True}, **prefill_opts,
    )
    register_xpu_compile(
        _mla_attention_kernel, "prefill,fp16,R256+32,P16,BH16xDV64,non-causal,latent chunks",
        {**prefill, "q_nope_ptr": "*fp16", "q_pe_ptr": "*fp16", "kv_ptr": "*fp16", "out_ptr": "*fp16", "R": 256, "DR": 32,
         "PAGE_SIZE": 16, "BLOCK_H": 16, "BLOCK_R": 256, "BLOCK_DR": 32, "CAUSAL": False, "LATENT_CHUNK": 64},
        **prefill_2d,
    )


_register_compile_variants()


#: combined-q widths whose latent/rope split is known (DeepSeek 512 + 64; sglang's 256 + 32)
_KNOWN_SPLITS = {576: 512, 288: 256}


def xpu_tiles(rows: int, latent: int, ragged: bool = False, gather: bool = False) -> dict:
    """MLA tiles for Intel GPUs, chosen on the native code (triton-xpu 3.3 -> ocloc,
    bench/results/xpu_codegen.md) so nothing spills at 256 GRF; compiler facts, no Intel GPU
    timed them. The score dot reads the whole ``[R, BLOCK_N]`` latent tile per sub-group (warps
    split the rows), so 16-key tiles; the output channels are split across programs
    (``BLOCK_DV`` 64). Over pages of 16+ tokens the latent tile loads through block pointers in
    64-channel chunks (``latent_chunk``: 2D block reads, the score dot summed over chunks; through
    device-side tensor descriptors where Triton builds them, ``latent_device_desc``);
    shorter pages gather rows. The split repeats the score dot once per channel slice (4 or 8
    times the QK work): the price of no spill, not timed. Measured (bf16 R = 512 decode, 8 warps): 32-key tiles at 128 channels
    2368 B, 256 channels 29-33 KB; 16 keys x 128 channels 0 B; before (32 keys, 256-512
    channels) 14-96 KB (bench/results/xpu_native/tiles.txt). Used by the XPU heuristics of
    ``flash_mla_decode`` / ``flash_mla_prefill`` and by ``autotune_configs/seed_xpu_configs.py``."""
    tiles = dict(BLOCK_H=16 if rows <= 16 else 32, BLOCK_N=16, BLOCK_DV=64, num_warps=8, num_stages=2, grf_mode="256")
    if not gather:
        # pages of whole key tiles: the latent tile through block pointers (2D block reads), its
        # score dot in 64-channel chunks (q chunks beside K^T chunks), 64 output channels: 0 B at
        # every registered shape (the whole latent tile in 2D spilled 25.6 KB, 128 channels 1.5-2.8 KB);
        # SLM 30-59 KB -> 3-8 KB, fewer instructions over all channel slices (xpu_native/tiles.txt)
        tiles.update(latent_chunk=64, num_stages=1)
        if latent == 512 and not ragged:
            tiles.update(_COST_MODEL_TILES[min(_COST_MODEL_TILES, key=lambda h: (h < rows, h if h >= rows else -h))])
    return tiles


#: decode tiles at R = 512 over pages, by rows (heads x query tokens) up to the key: the cheapest
#: by the cost model over the native code (bench/experiments/xpu_cost_model.py, its record
#: bench/results/xpu/cost_model.md; time = max(DPAS / peak, (K/V + spill bytes) / bandwidth) on
#: Max 1100 and B580 alike). Warps split the rows 8 a sub-group, so BLOCK_H = 8 x warps runs no dot
#: twice (16 rows on 8 warps repeated the score dot 4 times); every channel slice re-reads the
#: latent tile, so 128-channel slices (2.4-2.9 KB spill, ~3 KB of spill traffic a thread per key
#: tile) win at 16-32 rows, 64-channel slices with all rows of 64-128 heads in one program (0 B)
#: above. Model time over the minimum: 5.4-5.5x (16 rows), 6.8-6.9x (32), 8x (64, 128): each
#: channel slice reads the latent row again, and one 512-channel slice spills 40 KB (34-36x)
_COST_MODEL_TILES = {
    16: dict(BLOCK_H=16, BLOCK_DV=128, num_warps=2, latent_chunk=32),
    32: dict(BLOCK_H=32, BLOCK_DV=128, num_warps=4),
    64: dict(BLOCK_H=64, BLOCK_DV=64, num_warps=8),
    128: dict(BLOCK_H=128, BLOCK_DV=64, num_warps=16),
}


def latent_chunk(config: dict, page_size: int, block_n: int, block_r: int, latent_descs,
                 device_desc: bool = False) -> int:
    """``LATENT_CHUNK`` of a launch: the config's ``latent_chunk`` (latent channels per score dot,
    read in 2D) where every key tile lies in one page, no host tensor descriptors were made, and
    the tiles can be read in 2D: through device-side tensor descriptors (``device_desc``:
    ``latent_device_desc``) or block pointers (``device.block_pointers``); else 0 (pointer loads,
    one score dot)."""
    chunk = int(config.get("latent_chunk", 0) or 0)
    if chunk <= 0 or latent_descs[0] is not None or page_size < block_n:
        return 0
    if not (device_desc or _device.block_pointers()):
        return 0
    return min(chunk, block_r)


def _rows_aligned(t: torch.Tensor, strides) -> bool:
    """``t``'s base and the given element strides 16-byte aligned (device-side descriptors)."""
    size = t.element_size()
    return t.data_ptr() % 16 == 0 and all(int(s) * size % 16 == 0 for s in strides)


def latent_device_desc(cache: torch.Tensor, R: int, q_nope: torch.Tensor | None = None,
                       q_strides: tuple = ()) -> bool:
    """``LATENT_DESC`` of a launch: the latent-chunk tiles (``LATENT_CHUNK``) through device-side
    tensor descriptors instead of block pointers, where Triton builds them
    (``device.device_descriptors``) and either the kernels run on Intel GPUs (the 2D load newer
    Intel Triton prefers; its block pointers are deprecated, removed on its main) or Triton has
    no block pointers; CUDA with block pointers keeps them. Descriptors need 16-byte aligned
    bases and row pitches: the cache's (page and row strides, the rope channels at ``R``) and,
    for a one-query decode, whose q rows are read as one 2D block, ``q_nope``'s (its batch and
    head strides ``q_strides``)."""
    if not _device.device_descriptors():
        return False
    if _device.backend() != "xpu" and _device.block_pointers():
        return False
    if not _rows_aligned(cache, (cache.stride(0), cache.stride(1), R)):
        return False
    return q_nope is None or _rows_aligned(q_nope, q_strides)


def launch_constexprs(config: dict, chunk: int, device_desc: bool = False, device=None,
                      fp32_dot_columns: int = 0) -> dict:
    """The config's launch options and the latent loads (``LATENT_CHUNK``, ``LATENT_DESC``): one
    stage with 2D latent tiles on XPU (triton-xpu 3.3's pipeliner asserts on block pointers
    whose address comes from a page id) and with descriptors made in the loop anywhere (Triton
    3.6's pipeliner cannot predicate them); descriptors made on the device get a global-scratch
    allocator (CUDA) where the caller set none. ``fp32_dot_columns``: the widest N of an fp32
    launch's dots (``tune.launch_options``)."""
    options = tune.launch_options(config, fp32_dot_columns)
    desc = bool(chunk) and device_desc
    if chunk and (_device.backend() == "xpu" or desc):
        options["num_stages"] = 1
    if desc:
        _device.ensure_scratch_allocator(device)
    return dict(LATENT_CHUNK=chunk, LATENT_DESC=desc, **options)


def split_queries(q_nope: torch.Tensor, q_pe: torch.Tensor | None, head_dim_v: int | None):
    """``(q_nope, q_pe)`` with last dims contiguous: ``q_pe`` checked against ``q_nope`` (dtype,
    leading shape), or, when it is None, both cut from the combined queries ``q_nope [..., R + Dr]``
    at ``head_dim_v`` (default from the known DeepSeek / sglang widths)."""
    dtype = q_nope.dtype
    lead = tuple(q_nope.shape[:-1])
    if q_pe is None:
        width = q_nope.shape[-1]
        if head_dim_v is None:
            if width not in _KNOWN_SPLITS:
                raise ValueError(f"q_nope holds combined queries of width {width}: pass head_dim_v (the latent width R)")
            head_dim_v = _KNOWN_SPLITS[width]
        head_dim_v = check_int(head_dim_v, "head_dim_v")
        if not 0 < head_dim_v < width:
            raise ValueError(f"head_dim_v must be in [1, {width - 1}] for combined queries of width {width}, got {head_dim_v}")
        if q_nope.stride(-1) != 1:
            q_nope = q_nope.contiguous()
        q_pe = q_nope[..., head_dim_v:]
        q_nope = q_nope[..., :head_dim_v]
    else:
        check_tensor("q_pe", q_pe, dtypes=(dtype,), ndim=q_nope.dim())
        if tuple(q_pe.shape[:-1]) != lead:
            raise ValueError(f"q_pe must have shape [{', '.join(map(str, lead))}, Dr], got {list(q_pe.shape)}")
        if head_dim_v is not None and check_int(head_dim_v, "head_dim_v") != q_nope.shape[-1]:
            raise ValueError(f"head_dim_v ({head_dim_v}) must equal q_nope.shape[-1] ({q_nope.shape[-1]})")
        if q_nope.stride(-1) != 1:
            q_nope = q_nope.contiguous()
        if q_pe.stride(-1) != 1:
            q_pe = q_pe.contiguous()
    if q_nope.shape[-1] < 1 or q_pe.shape[-1] < 1:
        raise ValueError(f"q_nope and q_pe need at least one channel each, got R={q_nope.shape[-1]}, Dr={q_pe.shape[-1]}")
    return q_nope, q_pe


def check_latent_cache(cache, dtype: torch.dtype, R: int, DR: int) -> int:
    """Check ``kv_c_and_k_pe_cache`` (``[pages, P, R + Dr]`` or ``[pages, P, 1, R + Dr]``, q's dtype
    or fp8, last dim contiguous, P a power of two 1..256); returns the page size."""
    check_tensor("kv_c_and_k_pe_cache", cache, dtypes=(dtype,) + FP8_DTYPES, ndim=(3, 4), last_dim_contiguous=True)
    if cache.dim() == 4 and cache.shape[2] != 1:
        raise ValueError(f"kv_c_and_k_pe_cache must have one KV head (shape [pages, P, 1, R + Dr]), got {list(cache.shape)}")
    if cache.shape[-1] != R + DR:
        raise ValueError(
            f"kv_c_and_k_pe_cache rows hold {cache.shape[-1]} channels but q_nope/q_pe give R + Dr = {R} + {DR} = {R + DR}"
        )
    page_size = cache.shape[1]
    check_page_size(page_size, "kv_c_and_k_pe_cache.shape[1] (page size)")
    return page_size


def check_sm_scale(sm_scale) -> float:
    """``sm_scale`` as a finite float (the argument contract: ``_common.check_real``)."""
    return check_real(sm_scale, "sm_scale")


def as_kv_scale(kv_scale, device):
    """(host float factor, device tensor or None) for the cache's dequant scale."""
    if kv_scale is None:
        return 1.0, None
    if isinstance(kv_scale, torch.Tensor):
        if kv_scale.numel() != 1 or not kv_scale.dtype.is_floating_point:
            raise ValueError(f"kv_scale must be a float or a one-element float tensor, got {kv_scale.dtype} {list(kv_scale.shape)}")
        if kv_scale.device != device:
            raise ValueError(f"kv_scale is on {kv_scale.device} but q_nope is on {device}")
        return 1.0, kv_scale.reshape(1)
    if isinstance(kv_scale, bool) or not isinstance(kv_scale, (int, float)):
        raise TypeError(f"kv_scale must be a float or a tensor, got {type(kv_scale).__name__}")
    return float(kv_scale), None


def latent_descriptors(cache: torch.Tensor, R: int, config: dict, block_n: int, block_dv: int, device):
    """``(kv_desc, pe_desc)``: tensor descriptors of the latent cache seen as ``[pages * P, R + Dr]``
    rows, loading ``[BLOCK_N, R]`` latent and ``[BLOCK_N, Dr]`` rope blocks, or ``(None, None)``
    where the config does not ask for them (``kv_desc``) or they cannot be used
    (``paged_rows_descriptors``; a key tile must lie in one page, R and Dr must be powers of two
    and all R channels in one program: ``BLOCK_DV = R``)."""
    page_size, width = cache.shape[1], cache.shape[-1]
    dr = width - R
    if (not config.get("kv_desc") or page_size < block_n or block_dv != R or R != next_power_of_2(R)
            or dr != next_power_of_2(dr)):
        return None, None
    found = paged_rows_descriptors(cache, page_size, width, [(block_n, R), (block_n, dr)], device)
    return tuple(found) if found is not None else (None, None)


