"""MLA decode (DeepSeek-style latent attention): ``flash_mla_decode`` and
``flash_mla_get_workspace_size`` (also as ``flash_mla_decode_get_workspace_size``, the name sglang
0.5.23 imports), drop-ins for sgl-kernel-xpu's functions of the same names. The kernel also serves
``flash_mla_prefill`` (``mla_prefill.py``) in its ragged mode (``RAGGED``).

K of a token is its whole cached row (``R`` latent channels + ``Dr`` rope channels), V is the
first ``R`` channels of the same row: the kernel loads each KV tile once and uses it for both
dots. A program owns

* a block of ``BLOCK_H`` query rows of one request, packed into the ``tl.dot`` M dimension
  (rows are ``(token, head)`` pairs, so with q_len > 1 the new tokens share the tile), so a KV
  tile is read once for all of them and both dots run on the matrix units;
* a slice of ``BLOCK_DV`` output channels (all ``R`` on NVIDIA; narrower on Intel, where the
  ``BLOCK_H x 512`` fp32 accumulator would not fit the register file);
* one KV split: the request's keys are cut into ``num_kv_splits`` tile-aligned ranges whose
  partial results ``combine_splits`` merges in a fixed order.

The split count is a function of host-known values only (batch, heads, page-table width times
page size, device compute units), so ``flash_mla_get_workspace_size`` can reproduce it and no
launch syncs with the host; each request then uses as many of those splits as its real length
fills (on the device).

Configs (``tune.lookup("mla_decode", ...)``; bucket fields ``rows`` = q_len x H rounded up to a
power of two in 16..128, ``r`` = R, ``w`` = ``tune.work_bucket`` of the programs at 16-row tiles,
``kv`` = "gather" for pages shorter than 16 tokens else "page", ``dtype``): ``BLOCK_H`` (rows per program, >= 16),
``BLOCK_N`` (keys per tile, >= 16), ``BLOCK_DV`` (output channels per program, 0 = all R),
``num_warps``, ``num_stages``, ``grf_mode`` (XPU), ``PREFETCH_PAGES`` (default 1: with pages shorter than
a tile, load the next tile's page ids one iteration ahead; H100, P=1, H=128: 163 -> 238 TFLOP/s). ``tune.override("mla_decode", config)`` forces one.
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
    INDEX_DTYPES,
    block_rows,
    cdiv,
    check_bool,
    check_int,
    check_page_size,
    check_real,
    check_same_device,
    check_tensor,
    device_guard,
    interpreter_float32,
    next_power_of_2,
    paged_rows_descriptors,
    tile_row,
    clamp_page,
    register_xpu_compile,
    softmax_step,
    validate_lengths_and_pages,
)
from .merge_state import combine_splits

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
def _mla_decode_kernel(
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
    LATENT_CHUNK: tl.constexpr = 0,  # > 0: latent tiles through block pointers, score dot per chunk
):
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
            for c in tl.static_range(BLOCK_R // LATENT_CHUNK):
                lc = c * LATENT_CHUNK + tl.arange(0, LATENT_CHUNK)
                if Q_LEN == 1 and not RAGGED:  # one token's heads: a plain 2D block of q
                    q_c = tl.load(tl.make_block_ptr(q_nope_ptr + b * stride_qn_b, shape=(num_heads, R),
                                                    strides=(stride_qn_h, 1), offsets=(head_block * BLOCK_H, c * LATENT_CHUNK),
                                                    block_shape=(BLOCK_H, LATENT_CHUNK), order=(1, 0)),
                                  boundary_check=(0, 1), padding_option="zero")
                else:
                    q_c = tl.load(q_n_rows + lc[None, :], mask=row_ok[:, None] & (lc[None, :] < R), other=0.0)
                k_c = tl.load(block_rows(kv_tile + c * LATENT_CHUNK, stride_kv_row, R - c * LATENT_CHUNK, rows_here, 0,
                                         BLOCK_N, LATENT_CHUNK, True),
                              boundary_check=(0, 1), padding_option="zero")
                part = _latent_dot(q_c, tl.trans(k_c.to(q_c.dtype)), DOT_PRECISION)
                s_lat = part if c == 0 else s_lat + part
            k_pe = tl.load(block_rows(kv_tile + R, stride_kv_row, DR, rows_here, 0, BLOCK_N, BLOCK_DR, False),
                           boundary_check=(0, 1), padding_option="zero").to(q_n.dtype)
            v = tl.load(block_rows(kv_tile + dv_tile * BLOCK_DV, stride_kv_row, R - dv_tile * BLOCK_DV, rows_here, 0,
                                   BLOCK_N, BLOCK_DV, False),
                        boundary_check=(0, 1), padding_option="zero").to(q_n.dtype)
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
        LATENT_CHUNK=0,
    )
    # as XPU launches them (xpu_tiles): 16-key tiles, 64 output channels a program; over pages of
    # 16+ tokens latent tiles through block pointers in 64-channel chunks (2D block reads), one stage
    opts = dict(dots=3, op="mla_decode", num_warps=8, num_stages=2, grf_mode=_device.xpu_large_grf_mode())
    tile = {"BLOCK_N": 16, "BLOCK_DV": 64}
    chunks = {**tile, "LATENT_CHUNK": 64}
    block_2d = dict(opts, num_stages=1, block_2d=("K", "V"))
    register_xpu_compile(_mla_decode_kernel, "bf16,H16,P64,BH16xDV64,split,latent chunks", {**deepseek, **chunks},
                         **block_2d)
    register_xpu_compile(
        _mla_decode_kernel, "bf16,H128,P64,BH32xDV64,single,latent chunks",
        {**deepseek, **chunks, "out_ptr": "*bf16", "BLOCK_H": 32, "SPLIT": False, "WRITE_LSE": False}, **block_2d,
    )
    register_xpu_compile(
        _mla_decode_kernel, "bf16,fp8-e4m3 cache,H16,P1,q_len2,BH32xDV64",
        {**deepseek, **tile, "kv_ptr": "*fp8e4nv", "PAGE_SIZE": 1, "Q_LEN": 2, "BLOCK_H": 32, "HAS_KV_SCALE": True}, **opts,
    )
    register_xpu_compile(
        _mla_decode_kernel, "fp16,R256+32,H32,P16,BH32xDV64,latent chunks",
        {**deepseek, "q_nope_ptr": "*fp16", "q_pe_ptr": "*fp16", "kv_ptr": "*fp16", "out_ptr": "*fp16", "R": 256, "DR": 32,
         "PAGE_SIZE": 16, "BLOCK_H": 32, "BLOCK_R": 256, "BLOCK_DR": 32, "SPLIT": False, **chunks},
        **block_2d,
    )
    # ragged mode (flash_mla_prefill): the XPU heuristic's 32-row x 64-channel tile, P=1 fp8 with LSE,
    # and a non-causal fp16 variant with 16-row tiles
    prefill = {**deepseek, "out_ptr": "*bf16", "stride_qn_b": "i32", "stride_qp_b": "i32", "BLOCK_H": 32, "BLOCK_N": 16,
               "BLOCK_DV": 64, "SPLIT": False, "WRITE_LSE": False, "RAGGED": True}
    prefill_opts = {**opts, "op": "mla_prefill"}
    prefill_2d = {**block_2d, "op": "mla_prefill"}
    register_xpu_compile(_mla_decode_kernel, "prefill,bf16,H128,P64,BH32xDV64,causal,latent chunks",
                         {**prefill, "LATENT_CHUNK": 64}, **prefill_2d)
    register_xpu_compile(
        _mla_decode_kernel, "prefill,bf16,fp8-e4m3 cache,P1,BH32xDV64,lse",
        {**prefill, "kv_ptr": "*fp8e4nv", "PAGE_SIZE": 1, "HAS_KV_SCALE": True, "WRITE_LSE": True}, **prefill_opts,
    )
    register_xpu_compile(
        _mla_decode_kernel, "prefill,fp16,R256+32,P16,BH16xDV64,non-causal,latent chunks",
        {**prefill, "q_nope_ptr": "*fp16", "q_pe_ptr": "*fp16", "kv_ptr": "*fp16", "out_ptr": "*fp16", "R": 256, "DR": 32,
         "PAGE_SIZE": 16, "BLOCK_H": 16, "BLOCK_R": 256, "BLOCK_DR": 32, "CAUSAL": False, "LATENT_CHUNK": 64},
        **prefill_2d,
    )


_register_compile_variants()


# ------------------------------------------------------------------------------------------
# launcher
# ------------------------------------------------------------------------------------------

#: combined-q widths whose latent/rope split is known (DeepSeek 512 + 64; sglang's 256 + 32)
_KNOWN_SPLITS = {576: 512, 288: 256}
#: an automatic split never covers fewer keys than this, nor exceeds this many splits (H200
#: sweep with the sliced combine: one request wants one 64-key tile per split, up to 128
#: splits at H=16 (B=1, L=1k-16k: 1.15-1.22x over 128-key splits capped at 64); a batch fills
#: the device first and never reaches these bounds)
_MIN_SPLIT_TOKENS = 64
_MAX_AUTO_SPLITS = 128
#: automatic splits are computed on the length rounded up to this (the largest page size), so
#: the page-table width of decode and the max_seq_len of the workspace query give the same count
_LENGTH_QUANTUM = 256
_ALIGN = 256


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _auto_splits(batch: int, rows: int, max_len: int, compute_units: int) -> int:
    """KV splits that fill the device: ``compute_units x programs-per-unit`` slots over the
    ``batch x head-blocks`` programs, at most ``max_len / 64`` splits and 128. Non-decreasing in
    ``max_len``, so a workspace sized for a longer bound is always large enough."""
    length = cdiv(max(max_len, 1), _LENGTH_QUANTUM) * _LENGTH_QUANTUM
    head_blocks = cdiv(rows, 64)
    per_unit = 2 if rows <= 32 else 1  # small tiles: two programs share a compute unit
    slots = compute_units * per_unit
    fill = slots // max(batch * head_blocks, 1)
    return max(1, min(fill, cdiv(length, _MIN_SPLIT_TOKENS), _MAX_AUTO_SPLITS))


def _workspace_layout(rows_n: int, num_heads: int, splits: int, head_dim_v: int) -> tuple[int, int, int]:
    """(bytes of the partial outputs section, offset of the LSE section, total bytes)."""
    if splits <= 1:
        return 0, 0, 0
    po = _align(rows_n * num_heads * splits * head_dim_v * 4)
    pl = _align(rows_n * num_heads * splits * 4)
    return po, po, po + pl


def flash_mla_get_workspace_size(
    max_seq_len: int,
    num_batches: int,
    num_heads: int = 0,
    page_size: int = 0,
    num_kv_splits: int = -1,
    *,
    q_len: int = 1,
    head_dim_v: int = 512,
    device=None,
) -> int:
    """Bytes of workspace that :func:`flash_mla_decode` needs for the same arguments.

    Parameters
    ----------
    max_seq_len : int
        Upper bound of the KV length of any request (sglang passes ``max_context_len``). For the
        automatic split count, ``flash_mla_decode`` uses ``page_table.shape[1] * page_size`` as the
        bound; a table no wider than ``cdiv(max_seq_len, page_size)`` pages gives the same count.
    num_batches : int
        Number of requests ``B``.
    num_heads : int
        Query heads ``H`` (required when ``num_kv_splits != 1``).
    page_size : int
        Tokens per page (a power of two 1..256), or 0 if unknown (the split count does not depend
        on it).
    num_kv_splits : int
        1: no split (0 bytes); > 1: that many splits; <= 0: the automatic count of
        ``flash_mla_decode``.
    q_len : int
        New tokens per request (1 for plain decode; 2..4 for MTP / speculative decoding).
    head_dim_v : int
        Latent width ``R`` (the output width), 512 for DeepSeek.
    device : torch.device, optional
        Device whose compute units set the automatic split count (default: the current one).

    Returns
    -------
    int
        Bytes: fp32 partial outputs ``[B * q_len, H, splits, R]`` and fp32 partial LSEs
        ``[B * q_len, H, splits]``, each section 256-byte aligned; 0 when ``splits == 1``.
    """
    for name, v in (("max_seq_len", max_seq_len), ("num_batches", num_batches), ("num_heads", num_heads),
                    ("page_size", page_size), ("num_kv_splits", num_kv_splits), ("q_len", q_len), ("head_dim_v", head_dim_v)):
        check_int(v, name)
    if max_seq_len < 0 or num_batches < 0 or num_heads < 0:
        raise ValueError("max_seq_len, num_batches and num_heads must be non-negative")
    if page_size != 0:
        check_page_size(page_size)
    if q_len < 1:
        raise ValueError(f"q_len must be positive, got {q_len}")
    if head_dim_v < 1:
        raise ValueError(f"head_dim_v must be positive, got {head_dim_v}")
    if num_kv_splits == 1:
        return 0
    if num_heads == 0:
        raise ValueError("num_heads must be given (> 0) unless num_kv_splits == 1")
    if num_kv_splits <= 0:
        splits = _auto_splits(num_batches, q_len * num_heads, max_seq_len, _device.compute_units(device))
    else:
        splits = num_kv_splits
    return _workspace_layout(num_batches * q_len, num_heads, splits, head_dim_v)[2]


#: sglang 0.5.23's name for the same function (sgl-kernel-xpu renamed it when MLA prefill arrived)
flash_mla_decode_get_workspace_size = flash_mla_get_workspace_size


def xpu_tiles(rows: int, latent: int, ragged: bool = False, gather: bool = False) -> dict:
    """MLA tiles for Intel GPUs, chosen on the native code (triton-xpu 3.3 -> ocloc,
    bench/results/xpu_codegen.md) so nothing spills at 256 GRF; compiler facts, no Intel GPU
    timed them. The score dot reads the whole ``[R, BLOCK_N]`` latent tile per sub-group (warps
    split the rows), so 16-key tiles; the output channels are split across programs
    (``BLOCK_DV`` 64). Over pages of 16+ tokens the latent tile loads through block pointers in
    64-channel chunks (``latent_chunk``: 2D block reads, the score dot summed over chunks);
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
    return tiles


def latent_chunk(config: dict, page_size: int, block_n: int, block_r: int, latent_descs) -> int:
    """``LATENT_CHUNK`` of a launch: the config's ``latent_chunk`` (latent channels per score dot,
    through block pointers) where Triton has block pointers, every key tile lies in one page and
    no tensor descriptors were made; else 0 (pointer loads, one score dot)."""
    chunk = int(config.get("latent_chunk", 0) or 0)
    if chunk <= 0 or latent_descs[0] is not None or page_size < block_n or not _device.block_pointers():
        return 0
    return min(chunk, block_r)


def launch_constexprs(config: dict, chunk: int) -> dict:
    """The config's launch options, one stage with block-pointer latent tiles on XPU
    (triton-xpu 3.3's pipeliner asserts on block pointers whose address comes from a page id)."""
    options = tune.launch_options(config)
    if chunk and _device.backend() == "xpu":
        options["num_stages"] = 1
    return dict(LATENT_CHUNK=chunk, **options)


def _heuristic_config(rows: int, head_dim_v: int, dtype: torch.dtype, work: int, gather: bool) -> dict:
    backend = _device.backend()
    block_r = max(16, next_power_of_2(head_dim_v))
    if backend == "interpreter":
        return dict(BLOCK_H=16, BLOCK_N=16, BLOCK_DV=0, num_warps=4, num_stages=1)
    if backend == "xpu":
        return xpu_tiles(rows, head_dim_v, gather=gather)
    big = dtype == torch.float32
    if big:
        block_h = 16 if rows <= 16 else (32 if rows <= 32 else 64)
        return dict(BLOCK_H=block_h, BLOCK_N=16, BLOCK_DV=0, num_warps=4 if block_h < 64 else 8, num_stages=1)
    # measured on H200 (bf16, R=512, tuner and sweeps): 64-row tiles with 64-key tiles for 64+
    # rows (B=64, H=128: ~250 TFLOP/s), 16-row tiles for H=16; 32-key tiles once the batch is large.
    # 64+ rows read whole-page tiles through tensor descriptors (kv_desc; H100, P = 64: 1.07-1.12x
    # at H = 64/128; 0.55-0.86x at H <= 32, whose 16/32-row tiles stay on pointer loads:
    # bench/results/NVIDIA_H100_80GB_HBM3/experiments/mla_desc.txt)
    if rows >= 64:
        return dict(BLOCK_H=64, BLOCK_N=64, BLOCK_DV=0, num_warps=8, num_stages=2, kv_desc=backend == "cuda")
    if rows <= 16:
        return dict(BLOCK_H=16, BLOCK_N=32 if work >= 16 else 64, BLOCK_DV=0, num_warps=4, num_stages=2)
    if gather:
        # 32-row tiles over per-token gathers (H = 32, or H = 16 with two queries, on page-1
        # tables): 32-key tiles, 3 stages, 1.53-1.97x the 64-key tile at every batch (H100 tuner,
        # rows=32 gather buckets, 2026-11-22); over pages the 64-key tile stays (within 0.96-1.05x)
        return dict(BLOCK_H=32, BLOCK_N=32, BLOCK_DV=0, num_warps=4, num_stages=3)
    return dict(BLOCK_H=32, BLOCK_N=64, BLOCK_DV=0, num_warps=4, num_stages=2)


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
        check_int(head_dim_v, "head_dim_v")
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
        if head_dim_v is not None and head_dim_v != q_nope.shape[-1]:
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


def flash_mla_decode(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor | None,
    kv_c_and_k_pe_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    workspace: torch.Tensor | None,
    sm_scale: float,
    num_kv_splits: int = 1,
    *,
    return_lse: bool = False,
    kv_scale: float | torch.Tensor | None = None,
    head_dim_v: int | None = None,
    validate: bool = False,
):
    """Multi-head latent attention decode over a paged latent cache (sgl-kernel-xpu drop-in).

    For each request ``b``, query token ``t`` and head ``h``:
    ``out = softmax(sm_scale * [q_nope, q_pe] . K^T) V`` with ``K = cache rows`` (all ``R + Dr``
    channels) and ``V = K[:, :R]``, over the request's first ``seq_lens[b]`` tokens (with
    ``q_len > 1`` query token ``t`` sees keys ``j <= seq_lens[b] - q_len + t``).

    Parameters
    ----------
    q_nope : torch.Tensor
        ``[B, H, R]`` (decode) or ``[B, S, H, R]`` (``S = q_len`` new tokens per request, MTP /
        speculative decoding), fp16/bf16/fp32: the latent (absorbed) part of the queries. Any
        strides; a last dim that is not contiguous is copied. When ``q_pe`` is None, the
        combined ``[B, (S,) H, R + Dr]`` queries (see ``head_dim_v``).
    q_pe : torch.Tensor or None
        ``[B, H, Dr]`` / ``[B, S, H, Dr]`` rope part of the queries, q_nope's dtype.
    kv_c_and_k_pe_cache : torch.Tensor
        ``[num_pages, page_size, R + Dr]`` or ``[num_pages, page_size, 1, R + Dr]``: per token
        the latent ``c_kv`` (R channels, also V) followed by ``k_pe`` (Dr channels). q's dtype or
        fp8 (e4m3/e5m2, dequantised with ``kv_scale``). Any page and row strides (e.g. one layer
        of a multi-layer pool) with ``stride(-1) == 1``; ``page_size`` a power of two 1..256.
    seq_lens : torch.Tensor
        ``[B]`` int32 (or int64): KV length of each request, the new tokens included.
    page_table : torch.Tensor
        ``[B, max_pages]`` int32 (or int64), page-granular: physical page of each logical page.
        Any width; lengths beyond ``max_pages * page_size`` are clamped to it.
    workspace : torch.Tensor or None
        Contiguous (uint8) scratch of at least
        ``flash_mla_get_workspace_size(page_table.shape[1] * page_size, B, H, page_size,
        num_kv_splits, q_len=S, head_dim_v=R)`` bytes, 16-byte aligned; may be None (or empty)
        when that is 0 (``num_kv_splits == 1``).
    sm_scale : float
        Softmax scale applied to the full ``R + Dr`` dot (DeepSeek: ``192 ** -0.5``).
    num_kv_splits : int
        1: one pass, no workspace (sglang's call); > 1: that many KV splits merged by a
        combine kernel; <= 0: automatic, from the device's compute units, ``B x H x S`` and
        ``page_table.shape[1] * page_size``.
    return_lse : bool
        Also return the natural-log LSE of the scaled logits.
    kv_scale : float or torch.Tensor, optional
        Per-tensor dequantisation scale of the cache (``real = stored * kv_scale``): a float or a
        one-element float tensor on the device (read by the kernel; no host sync).
    head_dim_v : int, optional
        ``R`` when ``q_pe`` is None (default 512 for width 576, 256 for width 288).
    validate : bool
        Check, with a host sync (not for graph capture), that every ``seq_lens`` fits the page
        table and every page id that will be read lies in ``[0, num_pages)``; raise ``ValueError``
        otherwise. Without it longer lengths are clamped to the table and page ids are trusted.

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, torch.Tensor]
        ``out [B, H, R]`` (``[B, S, H, R]``) in q's dtype; with ``return_lse`` also
        ``lse [B, H]`` (``[B, S, H]``) fp32. A query with no visible key gives 0 and LSE -inf.
    """
    check_tensor("q_nope", q_nope, dtypes=FLOAT_DTYPES, ndim=(3, 4))
    q_nope, q_pe = split_queries(q_nope, q_pe, head_dim_v)
    dtype = q_nope.dtype
    lead = tuple(q_nope.shape[:-1])
    R, DR = q_nope.shape[-1], q_pe.shape[-1]
    if q_nope.dim() == 3:
        batch, num_heads = lead
        q_len = 1
    else:
        batch, q_len, num_heads = lead
        if q_len < 1:
            raise ValueError(f"q_nope must hold at least one token per request, got shape {list(q_nope.shape)}")

    cache = kv_c_and_k_pe_cache
    page_size = check_latent_cache(cache, dtype, R, DR)
    check_tensor("seq_lens", seq_lens, dtypes=INDEX_DTYPES, shape=(batch,))
    check_tensor("page_table", page_table, dtypes=INDEX_DTYPES, ndim=2, last_dim_contiguous=True)
    if page_table.shape[0] != batch:
        raise ValueError(f"page_table must have {batch} rows (one per request), got shape {list(page_table.shape)}")
    sm_scale = check_sm_scale(sm_scale)
    check_int(num_kv_splits, "num_kv_splits")
    if workspace is not None:
        check_tensor("workspace", workspace, ndim=1)
    device = check_same_device(
        q_nope=q_nope, q_pe=q_pe, kv_c_and_k_pe_cache=cache, seq_lens=seq_lens, page_table=page_table, workspace=workspace
    )
    host_scale, scale_tensor = as_kv_scale(kv_scale, device)
    if check_bool(validate, "validate"):
        validate_lengths_and_pages("seq_lens", seq_lens, page_table, page_size, cache.shape[0])

    out = torch.empty((*lead, R), dtype=dtype, device=device)
    lse = torch.empty(lead, dtype=torch.float32, device=device) if check_bool(return_lse, "return_lse") else None
    rows = q_len * num_heads
    max_pages = page_table.shape[1]
    compute_units = _device.compute_units(device)
    if num_kv_splits <= 0:
        splits = _auto_splits(batch, rows, max_pages * page_size, compute_units)
    else:
        splits = num_kv_splits
    _, lse_offset, need = _workspace_layout(batch * q_len, num_heads, splits, R)
    if need > 0:
        have = 0 if workspace is None else workspace.numel() * workspace.element_size()
        if have < need:
            raise ValueError(
                f"workspace holds {have} bytes but flash_mla_decode needs {need} bytes for {splits} KV splits "
                f"(B={batch}, q_len={q_len}, H={num_heads}, R={R}): size it with flash_mla_get_workspace_size"
            )
        if not workspace.is_contiguous():
            raise ValueError("workspace must be contiguous")
        if workspace.data_ptr() % 16 != 0:
            raise ValueError("workspace must be 16-byte aligned")
    if batch == 0 or num_heads == 0:
        return (out, lse) if return_lse else out
    if cache.shape[0] == 0:  # no page to read (any length is then impossible): no key anywhere
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return (out, lse) if return_lse else out
    # the interpreter's bf16 arithmetic is wrong: bf16 runs in fp32 there (no copy when compiled)
    dest = out
    q_nope, q_pe, cache, out = interpreter_float32(q_nope, q_pe, cache, out)

    # work bucket: programs at the smallest (16-row) tile against the device's compute units
    work = tune.work_bucket(batch * cdiv(rows, 16), compute_units)
    # kv: "gather" when pages are shorter than a key tile (per-token addressing), else "page";
    # the two want different tiles (H200: P=64-tuned tiles ran 0.7x the heuristic at P=1)
    gather = page_size < 16
    fields = {"rows": tune.pow2_bucket(rows, 16, 128), "r": R, "w": work, "kv": "gather" if gather else "page",
              "dtype": str(dtype).replace("torch.", "")}
    config = tune.lookup("mla_decode", fields, _heuristic_config(rows, R, dtype, work, gather), device=device)
    block_r = max(16, next_power_of_2(R))
    block_dr = max(16, next_power_of_2(DR))
    block_h = max(16, int(config["BLOCK_H"]))
    block_n = max(16, int(config["BLOCK_N"]))
    block_dv = int(config.get("BLOCK_DV", 0) or block_r)
    block_dv = max(16, min(block_dv, block_r))
    num_dv = block_r // block_dv
    grid = (cdiv(rows, block_h) * num_dv, splits, batch)

    out_n = out.view(batch * q_len, num_heads, R)
    lse_n = lse.view(batch * q_len, num_heads) if lse is not None else None
    if splits > 1:
        ws = workspace.view(-1).view(torch.uint8)
        n = batch * q_len
        target = ws[: n * num_heads * splits * R * 4].view(torch.float32).view(n, num_heads, splits, R)
        target_lse = ws[lse_offset:lse_offset + n * num_heads * splits * 4].view(torch.float32).view(n, num_heads, splits)
        o_strides = target.stride()[:3]
        l_strides = target_lse.stride()
    else:
        target, target_lse = out_n, lse_n
        o_strides = (*out_n.stride()[:2], 0)
        l_strides = (*lse_n.stride(), 0) if lse_n is not None else (0, 0, 0)
    qn_s = q_nope.stride()
    qp_s = q_pe.stride()
    if q_len == 1 and q_nope.dim() == 3:
        qn_strides = (qn_s[0], 0, qn_s[1])
        qp_strides = (qp_s[0], 0, qp_s[1])
    else:
        qn_strides, qp_strides = qn_s[:3], qp_s[:3]
    latent_descs = latent_descriptors(cache, R, config, block_n, block_dv, device)
    with device_guard(device):
        _mla_decode_kernel[grid](
            q_nope, q_pe, *qn_strides, *qp_strides,
            cache, cache.stride(0), cache.stride(1),
            *latent_descs,
            seq_lens, page_table, page_table.stride(0), max_pages, cache.shape[0],
            scale_tensor if scale_tensor is not None else seq_lens,
            target, *o_strides,
            target_lse if target_lse is not None else out, *l_strides,
            float(sm_scale) * host_scale * LOG2E, host_scale,
            num_heads, splits,
            seq_lens, 0, 0,  # cu_seqlens_q, batch, total_q: ragged mode only
            Q_LEN=q_len, R=R, DR=DR, PAGE_SIZE=page_size,
            BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_R=block_r, BLOCK_DR=block_dr, BLOCK_DV=block_dv,
            HAS_KV_SCALE=scale_tensor is not None,
            PREFETCH_PAGES=bool(config.get("PREFETCH_PAGES", 1)),
            SPLIT=splits > 1,
            WRITE_LSE=splits > 1 or lse is not None,
            DOT_PRECISION="ieee" if q_nope.dtype == torch.float32 else "tf32",
            RAGGED=False, CAUSAL=True,
            KV_DESC=latent_descs[0] is not None,
            **launch_constexprs(config, latent_chunk(config, page_size, block_n, block_r, latent_descs)),
        )
        if splits > 1:
            combine_splits(target, target_lse, out_n, lse_n, compute_units=compute_units)
    if out is not dest:
        dest.copy_(out)
    return (dest, lse) if return_lse else dest
