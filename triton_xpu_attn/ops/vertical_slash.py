"""Vertical/slash sparse attention (MInference, arXiv 2407.02490 appendix C.4.2): sglang's
dual-chunk long-context path, sgl-kernel-xpu's ``sgl_kernel.sparse_flash_attn``.

Two steps, one kernel each:

* ``convert_vertical_slash_indexes`` (and ``_mergehead``): per head, a list of vertical lines
  (key columns every query sees) and slash lines (diagonals, as distances from the causal
  diagonal) become, for each row block of ``block_size_M`` queries, key blocks of
  ``block_size_N`` keys (``block_offset``, ``block_count``) and single key columns
  (``column_index``, ``column_count``). The kernel runs sgl-kernel's two-pointer merge with one
  lane per row block (every lane reads the same lists), so its results equal upstream's on any
  input.
* ``sparse_attn_func`` / ``sparse_attn_varlen_func``: attention of each row block over the union
  of its key blocks and columns (a key named twice counts once), bottom-right causal, softcap,
  natural-log LSE. A key the lists do not name, one outside ``[0, seqlen_k)`` or one no query of
  the tile may see is never loaded.
"""
from __future__ import annotations

import torch

from .. import device as _device
from .._common import (
    FLOAT_DTYPES, INDEX_DTYPES, LaunchShape, cdiv, check_bool, check_int, check_real, check_same_device, check_tensor,
    device_guard, interpreter_float32, next_power_of_2, register_xpu_compile, softmax_step,
)
import triton  # noqa: E402  (after the package's device selection)
import triton.language as tl  # noqa: E402

LOG2E = 1.4426950408889634
# states of a row block's merge (convert kernel)
_FIRST, _MERGE, _TAIL, _NO_SLASH, _DONE = 0, 1, 2, 3, 4


@triton.jit
def _vs_convert_kernel(
    q_seqlens_ptr, kv_seqlens_ptr,
    v_idx_ptr, stride_vb, stride_vh, stride_vi,
    s_idx_ptr, stride_sb, stride_sh, stride_si,
    v_count_ptr, stride_vc, s_count_ptr, stride_sc,
    bc_ptr, bo_ptr, cc_ptr, ci_ptr,
    num_heads, num_rows, nnz_v, nnz_s, block_m, block_n,
    CAUSAL: tl.constexpr, PER_HEAD_COUNTS: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """One lane per row block ``r`` of head ``h``, batch ``b``: the merge of the vertical list
    (read in order) with the slash list (read in order) into block offsets and columns. Outputs
    are contiguous and zero-filled by the launcher; a row's blocks stop at ``nnz_s`` entries."""
    pid_r = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    live = rows < num_rows
    q_len = tl.load(q_seqlens_ptr + b).to(tl.int64)
    kv_len = tl.load(kv_seqlens_ptr + b).to(tl.int64)
    nv = nnz_v
    ns = nnz_s
    if PER_HEAD_COUNTS:
        nv = tl.minimum(tl.maximum(tl.load(v_count_ptr + h * stride_vc).to(tl.int64), 0), nnz_v).to(tl.int32)
        ns = tl.minimum(tl.maximum(tl.load(s_count_ptr + h * stride_sc).to(tl.int64), 0), nnz_s).to(tl.int32)
    v_base = v_idx_ptr + b * stride_vb + h * stride_vh
    s_base = s_idx_ptr + b * stride_sb + h * stride_sh
    flat = (b * num_heads + h) * num_rows + rows.to(tl.int64)
    bo_row = bo_ptr + flat * nnz_s
    ci_row = ci_ptr + flat * nnz_v
    end_m = (rows.to(tl.int64) + 1) * block_m
    delta = kv_len - q_len
    limit = end_m + delta  # causal: slashes and merged columns below it
    state = tl.where(live, 0, 4)
    s_ptr = tl.zeros([BLOCK_R], dtype=tl.int32)
    v_ptr = tl.zeros([BLOCK_R], dtype=tl.int32)
    blk = tl.zeros([BLOCK_R], dtype=tl.int32)
    col = tl.zeros([BLOCK_R], dtype=tl.int32)
    rs = tl.zeros([BLOCK_R], dtype=tl.int64)
    re = tl.zeros([BLOCK_R], dtype=tl.int64)
    # every step consumes a slash or a vertical, or moves a lane on (at most twice): it ends
    while tl.min(state, axis=0) < 4:
        first = state == 0
        merge = state == 1
        tail = state == 2
        no_slash = state == 3
        has_s = (s_ptr < ns) & (state < 2)
        has_v = (v_ptr < nv) & (state > 0) & (state < 4)
        sv = tl.load(s_base + s_ptr.to(tl.int64) * stride_si, mask=has_s, other=0).to(tl.int64)
        vv = tl.load(v_base + v_ptr.to(tl.int64) * stride_vi, mask=has_v, other=0).to(tl.int64)
        if CAUSAL:
            s_ok = sv < limit
            conv = tl.maximum(delta + end_m - sv, block_m)
        else:
            s_ok = sv == sv
            conv = kv_len + end_m - sv
        # merge: a vertical before the range's end is consumed (a column when left of the range)
        take_v = merge & has_v & (vv < re)
        add = take_v & (vv < rs)
        if CAUSAL:
            add = add & (vv < limit)
        # merge: else the next slash extends the range, starts a new one after a gap, or ends it
        m_slash = merge & ~take_v & has_s
        m_end = merge & ~take_v & ~has_s
        use = m_slash & s_ok
        gap = use & (conv > re + block_m)
        extend = use & ~gap & (conv > re)
        # tail (after the last range) and no-slash rows: the remaining verticals, in order
        walk = (tail | no_slash) & has_v
        stop = (tail | no_slash) & ~has_v
        if CAUSAL:
            brk = walk & (vv >= limit - 1)
        else:
            brk = walk & (vv != vv)
        add = add | (tail & walk & ~brk & (vv >= re))
        add = add | (no_slash & walk & ~brk & (vv >= 0) & (vv < kv_len))
        # a finished range becomes blocks of block_n keys from its start, below kv_len
        flush = gap | m_end
        hi = tl.minimum(re, kv_len)
        nblk = tl.where(flush & (rs < hi), (hi - rs + block_n - 1) // block_n, 0)
        nblk = tl.minimum(nblk, (nnz_s - blk).to(tl.int64)).to(tl.int32)
        for t in range(0, tl.max(nblk, axis=0)):
            tl.store(bo_row + blk + t, (rs + t * block_n).to(bo_ptr.dtype.element_ty), mask=t < nblk)
        blk += nblk
        tl.store(ci_row + col, vv.to(ci_ptr.dtype.element_ty), mask=add)
        col += add.to(tl.int32)
        found = first & has_s & s_ok
        rs = tl.where(found | gap, conv - block_m, rs)
        re = tl.where(found | gap, conv, tl.where(extend, re + block_m, re))
        s_ptr += ((first & has_s) | m_slash).to(tl.int32)
        v_ptr += (take_v | walk).to(tl.int32)
        state = tl.where(found, 1, state)
        state = tl.where(first & ~has_s, 3, state)
        state = tl.where(m_end, 2, state)
        state = tl.where(stop | brk, 4, state)
    tl.store(bc_ptr + flat, blk.to(bc_ptr.dtype.element_ty), mask=live)
    tl.store(cc_ptr + flat, col.to(cc_ptr.dtype.element_ty), mask=live)


@triton.jit
def _vs_attn_kernel(
    q_ptr, stride_qb, stride_qt, stride_qh,
    k_ptr, stride_kb, stride_kt, stride_kh,
    v_ptr, stride_vb, stride_vt, stride_vh,
    o_ptr, stride_ob, stride_ot, stride_oh,
    lse_ptr, stride_lb, stride_lh, stride_lt,
    cu_q_ptr, cu_k_ptr, seqlen_q, seqlen_k, total_q, total_k,
    bc_ptr, stride_bcb, stride_bch, stride_bcr,
    bo_ptr, stride_bob, stride_boh, stride_bor, stride_boj,
    cc_ptr, stride_ccb, stride_cch, stride_ccr,
    ci_ptr, stride_cib, stride_cih, stride_cir, stride_cij,
    num_rows, nnz_s, nnz_v, group, head_dim, block_m, block_n, qk_scale, softcap,
    HEAD_DIM: tl.constexpr, TILE_M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_I: tl.constexpr, BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr,
    VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """``BLOCK_M`` queries (inside one row block of ``block_m``; a tile of ``TILE_M >= BLOCK_M``
    rows) of head ``h``, request ``b``, output channels ``[dv_tile * BLOCK_DV, + BLOCK_DV)``: one
    loop over the row's work list, first its key blocks (in ``BLOCK_N``-key tiles), then its
    columns (``BLOCK_N`` a tile). A key is counted once: a block key already in an earlier block,
    or a column in a block or equal to an earlier column, is dropped (checks skipped when the
    row's lists are ascending and apart). With ``BLOCK_DV < HEAD_DIM`` each channel slice is its
    own program, repeating the score dot. Keys no row of the tile sees are not loaded."""
    LN2E: tl.constexpr = 1.4426950408889634
    NUM_DV: tl.constexpr = HEAD_DIM // BLOCK_DV
    pid_m = tl.program_id(0) // NUM_DV
    dv_tile = tl.program_id(0) % NUM_DV
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    kvh = h // group
    m0 = pid_m * BLOCK_M
    if VARLEN:
        q_start = tl.load(cu_q_ptr + b).to(tl.int64)
        q_len = tl.maximum(tl.load(cu_q_ptr + b + 1).to(tl.int64) - q_start, 0)
        k_start = tl.load(cu_k_ptr + b).to(tl.int64)
        k_len = tl.maximum(tl.load(cu_k_ptr + b + 1).to(tl.int64) - k_start, 0)
    else:
        q_start = tl.zeros([], dtype=tl.int64)
        q_len = tl.zeros([], dtype=tl.int64) + seqlen_q
        k_start = tl.zeros([], dtype=tl.int64)
        k_len = tl.zeros([], dtype=tl.int64) + seqlen_k
    offs_m = tl.arange(0, TILE_M)
    t = m0 + offs_m
    row_ok = (offs_m < BLOCK_M) & (t < q_len) & (q_start + t >= 0) & (q_start + t < total_q)
    if CAUSAL:
        last_key = tl.where(row_ok, t + k_len - q_len, -1)
    else:
        last_key = tl.where(row_ok, k_len - 1, -1)
    max_key = tl.max(last_key, axis=0)
    offs_dv = dv_tile * BLOCK_DV + tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < head_dim
    q_rows = q_ptr + b * stride_qb + (q_start + t) * stride_qt + h * stride_qh
    offs_d = tl.arange(0, HEAD_DIM)
    d_ok = offs_d < head_dim
    q = tl.load(q_rows[:, None] + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = k_ptr + b * stride_kb + k_start * stride_kt + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + k_start * stride_vt + kvh * stride_vh

    r = m0 // block_m
    in_table = (r < num_rows) & (m0 < q_len)
    r64 = r.to(tl.int64)
    bc = tl.load(bc_ptr + b * stride_bcb + h * stride_bch + r64 * stride_bcr, mask=in_table, other=0).to(tl.int64)
    cc = tl.load(cc_ptr + b * stride_ccb + h * stride_cch + r64 * stride_ccr, mask=in_table, other=0).to(tl.int64)
    nb = tl.minimum(tl.maximum(bc, 0), nnz_s).to(tl.int32)
    nc = tl.minimum(tl.maximum(cc, 0), nnz_v).to(tl.int32)
    bo_row = bo_ptr + b * stride_bob + h * stride_boh + r64 * stride_bor
    ci_row = ci_ptr + b * stride_cib + h * stride_cih + r64 * stride_cir
    offs_i = tl.arange(0, BLOCK_I)
    offs_n = tl.arange(0, BLOCK_N)
    # keys of the request that exist: [0, k_len) and inside k / v
    lo_key = tl.maximum(-k_start, 0)
    hi_key = tl.minimum(k_len, total_k - k_start)

    # lists ascending and apart (what convert_vertical_slash_indexes writes): no duplicate checks
    unsorted_b = 0
    for i0 in range(0, nb, BLOCK_I):
        i = i0 + offs_i
        cur = tl.load(bo_row + i * stride_boj, mask=i < nb, other=0).to(tl.int64)
        prev = tl.load(bo_row + (i - 1) * stride_boj, mask=(i >= 1) & (i < nb), other=0).to(tl.int64)
        unsorted_b += tl.sum(((i >= 1) & (i < nb) & (cur - prev < block_n)).to(tl.int32), axis=0)
    unsorted_c = 0
    for i0 in range(0, nc, BLOCK_I):
        i = i0 + offs_i
        cur = tl.load(ci_row + i * stride_cij, mask=i < nc, other=0).to(tl.int64)
        prev = tl.load(ci_row + (i - 1) * stride_cij, mask=(i >= 1) & (i < nc), other=0).to(tl.int64)
        unsorted_c += tl.sum(((i >= 1) & (i < nc) & (cur <= prev)).to(tl.int32), axis=0)

    m_i = tl.full([TILE_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([TILE_M], dtype=tl.float32)
    acc = tl.zeros([TILE_M, BLOCK_DV], dtype=tl.float32)
    # the work list: tiles_per_block steps a key block, then one step per BLOCK_N columns
    tiles_per_block = (block_n + BLOCK_N - 1) // BLOCK_N
    block_steps = nb * tiles_per_block
    for step in range(0, block_steps + (nc + BLOCK_N - 1) // BLOCK_N):
        is_blk = step < block_steps
        j = step // tiles_per_block
        n0 = (step - j * tiles_per_block) * BLOCK_N
        c = (step - block_steps) * BLOCK_N + offs_n
        off = tl.load(bo_row + j * stride_boj, mask=is_blk, other=0).to(tl.int64)
        col = tl.load(ci_row + c * stride_cij, mask=(c >= 0) & (c < nc), other=0).to(tl.int64)
        key = tl.where(is_blk, off + n0 + offs_n, col)
        key_ok = tl.where(is_blk, n0 + offs_n < block_n, (c >= 0) & (c < nc)) & (key >= lo_key) & (key < hi_key)
        # a block key in an earlier block (only when the blocks are not ascending and apart), a
        # column in any block, a column equal to an earlier one (only when not ascending).
        # (loop bounds of 0, not ifs: triton-xpu 3.3 fails on an if's yielded mask)
        seen = tl.zeros([BLOCK_N], dtype=tl.int32)
        nb_check = tl.where(is_blk, tl.where(unsorted_b > 0, j, 0), nb)
        for i0 in range(0, nb_check, BLOCK_I):
            i = i0 + offs_i
            start = tl.load(bo_row + i * stride_boj, mask=i < nb_check, other=0).to(tl.int64)
            hit = (key[:, None] >= start[None, :]) & (key[:, None] < start[None, :] + block_n) & (i < nb_check)[None, :]
            seen += tl.sum(hit.to(tl.int32), axis=1)
        for i0 in range(0, tl.where(is_blk | (unsorted_c == 0), 0, step - block_steps + 1) * BLOCK_N, BLOCK_I):
            i = i0 + offs_i
            other = tl.load(ci_row + i * stride_cij, mask=i < nc, other=0).to(tl.int64)
            hit = (key[:, None] == other[None, :]) & (i[None, :] < c[:, None])
            seen += tl.sum(hit.to(tl.int32), axis=1)
        key_ok = key_ok & (seen == 0) & (key <= max_key)
        if tl.max(key_ok.to(tl.int32), axis=0) > 0:
            kt = tl.load(k_base + key[None, :] * stride_kt + offs_d[:, None], mask=key_ok[None, :] & d_ok[:, None],
                         other=0.0)
            s = tl.dot(q, kt.to(q.dtype), out_dtype=tl.float32, input_precision=DOT_PRECISION) * qk_scale
            if HAS_SOFTCAP:
                s = softcap * (1.0 - 2.0 / (tl.exp2(s * (2.0 * LN2E / softcap)) + 1.0)) * LN2E
            visible = key_ok[None, :] & (key[None, :] <= last_key[:, None])
            s = tl.where(visible, s, float("-inf"))
            p, alpha, m_i, l_i = softmax_step(s, m_i, l_i)
            v = tl.load(v_base + key[:, None] * stride_vt + offs_dv[None, :], mask=key_ok[:, None] & dv_ok[None, :],
                        other=0.0)
            acc = tl.dot(p.to(v.dtype), v, acc=acc * alpha[:, None], out_dtype=tl.float32,
                         input_precision=DOT_PRECISION)

    has_key = l_i > 0.0
    out = acc / tl.where(has_key, l_i, 1.0)[:, None]
    out = tl.where(has_key[:, None], out, 0.0)
    o_rows = o_ptr + b * stride_ob + (q_start + t) * stride_ot + h * stride_oh
    tl.store(o_rows[:, None] + offs_dv[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])
    if WRITE_LSE:
        if dv_tile == 0:  # the first channel slice writes it
            lse = tl.where(has_key, (m_i + tl.log2(tl.where(has_key, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
            tl.store(lse_ptr + b * stride_lb + h * stride_lh + (q_start + t) * stride_lt, lse, mask=row_ok)


def _register_compile_variants():
    index = dict(q_seqlens_ptr="*i32", kv_seqlens_ptr="*i32",
                 v_idx_ptr="*i32", stride_vb="i64", stride_vh="i32", stride_vi="i32",
                 s_idx_ptr="*i32", stride_sb="i64", stride_sh="i32", stride_si="i32",
                 v_count_ptr="*i32", stride_vc="i32", s_count_ptr="*i32", stride_sc="i32",
                 bc_ptr="*i32", bo_ptr="*i32", cc_ptr="*i32", ci_ptr="*i32",
                 num_heads="i32", num_rows="i32", nnz_v="i32", nnz_s="i32", block_m="i32", block_n="i32",
                 CAUSAL=True, PER_HEAD_COUNTS=False, BLOCK_R=_CONVERT_ROWS)
    register_xpu_compile(_vs_convert_kernel, "convert,causal", index, num_warps=1)
    register_xpu_compile(_vs_convert_kernel, "convert,mergehead,noncausal",
                         {**index, "CAUSAL": False, "PER_HEAD_COUNTS": True}, num_warps=1)
    attn = dict(q_ptr="*bf16", stride_qb="i64", stride_qt="i64", stride_qh="i32",
                k_ptr="*bf16", stride_kb="i64", stride_kt="i64", stride_kh="i32",
                v_ptr="*bf16", stride_vb="i64", stride_vt="i64", stride_vh="i32",
                o_ptr="*bf16", stride_ob="i64", stride_ot="i64", stride_oh="i32",
                lse_ptr="*fp32", stride_lb="i64", stride_lh="i64", stride_lt="i32",
                cu_q_ptr="*i32", cu_k_ptr="*i32", seqlen_q="i32", seqlen_k="i32", total_q="i32", total_k="i32",
                bc_ptr="*i32", stride_bcb="i64", stride_bch="i32", stride_bcr="i32",
                bo_ptr="*i32", stride_bob="i64", stride_boh="i32", stride_bor="i32", stride_boj="i32",
                cc_ptr="*i32", stride_ccb="i64", stride_cch="i32", stride_ccr="i32",
                ci_ptr="*i32", stride_cib="i64", stride_cih="i32", stride_cir="i32", stride_cij="i32",
                num_rows="i32", nnz_s="i32", nnz_v="i32", group="i32", head_dim="i32", block_m="i32",
                block_n="i32", qk_scale="fp32", softcap="fp32",
                HEAD_DIM=128, TILE_M=64, BLOCK_M=64, BLOCK_N=64, BLOCK_I=_BLOCK_I, BLOCK_DV=128,
                CAUSAL=True, VARLEN=False, HAS_SOFTCAP=False, WRITE_LSE=True, DOT_PRECISION="tf32")
    # the Intel tiles (_xpu_tiles): 0 B spilled on pvc and bmg. Sweep, native code (work x min
    # at the _launch_shape pattern): docs/xpu.md "Vertical/slash sparse attention"
    for d in (64, 128):
        xpu = dict(attn, HEAD_DIM=d, BLOCK_I=_BLOCK_I)
        opts = _xpu_tiles(64, d)
        for name in ("BLOCK_M", "TILE_M", "BLOCK_N", "BLOCK_DV"):
            xpu[name] = opts.pop(name)
        tile = f"D{d},M{xpu['BLOCK_M']}xN{xpu['BLOCK_N']}" + (f",DV{xpu['BLOCK_DV']}" if xpu["BLOCK_DV"] < d else "")
        register_xpu_compile(_vs_attn_kernel, f"bf16,{tile},causal,lse", xpu, dots=2, launch=_launch_shape, **opts)
        register_xpu_compile(_vs_attn_kernel, f"fp16,{tile},varlen,softcap",
                             {**xpu, "q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "o_ptr": "*fp16",
                              "VARLEN": True, "CAUSAL": False, "HAS_SOFTCAP": True, "WRITE_LSE": False}, dots=2,
                             launch=_launch_shape, **opts)


def _launch_shape(c: dict, heads: int = 32, kv_heads: int = 8, seqlen: int = 8192, blocks: int = 16,
                  columns: int = 1024, block_m: int = 64, block_n: int = 64) -> LaunchShape:
    """The work of one launch with the kernel's constexprs ``c`` (``LaunchShape``: the XPU
    native-code table's work columns): one request of ``seqlen`` queries, ``heads`` / ``kv_heads``
    heads, every row block of ``block_m`` queries seeing ``blocks`` key blocks of ``block_n`` and
    ``columns`` columns (no key named twice, all visible: a non-causal pattern). A program loads per
    step ``BLOCK_N`` keys of K (all channels: the score dot) and of its ``BLOCK_DV`` value channels;
    the minimum multiplies each (query, key) pair once over ``D + D`` channels and reads each row
    block's keys once per KV head."""
    d, dv = c["HEAD_DIM"], c["BLOCK_DV"]
    keys = blocks * block_n + columns
    return LaunchShape(
        shape=f"H{heads}/{kv_heads} D{d} L{seqlen} {blocks}x{block_n}+{columns}",
        programs=heads * cdiv(seqlen, c["BLOCK_M"]) * (d // dv),
        iterations=blocks * cdiv(block_n, c["BLOCK_N"]) + cdiv(columns, c["BLOCK_N"]),
        loaded_bytes=c["BLOCK_N"] * (d + dv) * 2,
        min_macs=heads * seqlen * keys * 2 * d,
        min_bytes=kv_heads * cdiv(seqlen, block_m) * keys * 2 * d * 2,
    )


#: rows (lanes) of one convert program; duplicate-check chunk of the attention kernel
_CONVERT_ROWS = 32
_BLOCK_I = 32


def _xpu_tiles(block_rows: int, head: int) -> dict:
    """Tiles and launch options on Intel GPUs (native code of triton-xpu 3.3 -> ocloc, pvc and
    bmg; docs/xpu.md): ``block_rows`` queries a program (at most 64), 16-key steps, one warp per
    8 rows (at least 2: a DPAS row tile each, so no warp repeats another's dot), 256 GRF. Each
    sub-group gathers the whole ``[HEAD_DIM, 16]`` K^T tile (keys are scattered: no 2D read), so
    above head dim 64 the output channels go to 64-wide slices on separate programs, each
    repeating the score dot (1.5x the minimum DPAS work at head dim 128, 0 B spilled; whole rows
    spill 4.5-26 KB at every tile tried, and score-dot chunks with q re-read 8-24 KB)."""
    rows = min(64, block_rows)
    tile_m = max(16, rows)
    return dict(BLOCK_M=rows, TILE_M=tile_m, BLOCK_N=16, BLOCK_DV=min(head, 64),
                num_warps=max(2 if head <= 64 else 4, tile_m // 8), num_stages=1,
                grf_mode=_device.xpu_large_grf_mode())


_register_compile_variants()

# ------------------------------------------------------------------------------------------
# launchers
# ------------------------------------------------------------------------------------------


def _check_indices(q_seqlens, kv_seqlens, vertical_indexes, slash_indexes):
    check_tensor("q_seqlens", q_seqlens, dtypes=INDEX_DTYPES, ndim=1)
    batch = q_seqlens.shape[0]
    check_tensor("kv_seqlens", kv_seqlens, dtypes=INDEX_DTYPES, shape=(batch,))
    check_tensor("vertical_indexes", vertical_indexes, dtypes=INDEX_DTYPES, ndim=3)
    check_tensor("slash_indexes", slash_indexes, dtypes=INDEX_DTYPES, ndim=3)
    if vertical_indexes.shape[0] != batch or slash_indexes.shape[0] != batch:
        raise ValueError(f"vertical_indexes and slash_indexes must have batch {batch} (q_seqlens) in dim 0, got "
                         f"{list(vertical_indexes.shape)} and {list(slash_indexes.shape)}")
    if vertical_indexes.shape[1] != slash_indexes.shape[1]:
        raise ValueError(f"vertical_indexes and slash_indexes must have the same heads, got "
                         f"{vertical_indexes.shape[1]} and {slash_indexes.shape[1]}")


def _convert(q_seqlens, kv_seqlens, vertical_indexes, slash_indexes, vertical_indices_count, slash_indices_count,
             context_size, block_size_M, block_size_N, causal):
    _check_indices(q_seqlens, kv_seqlens, vertical_indexes, slash_indexes)
    context_size = check_int(context_size, "context_size", minimum=0)
    block_m = check_int(block_size_M, "block_size_M", minimum=1)
    block_n = check_int(block_size_N, "block_size_N", minimum=1)
    causal = check_bool(causal, "causal")
    batch, heads, nnz_s = slash_indexes.shape
    nnz_v = vertical_indexes.shape[2]
    per_head = vertical_indices_count is not None
    if per_head:
        check_tensor("vertical_indices_count", vertical_indices_count, dtypes=INDEX_DTYPES, shape=(heads,))
        check_tensor("slash_indices_count", slash_indices_count, dtypes=INDEX_DTYPES, shape=(heads,))
    device = check_same_device(q_seqlens=q_seqlens, kv_seqlens=kv_seqlens, vertical_indexes=vertical_indexes,
                               slash_indexes=slash_indexes, vertical_indices_count=vertical_indices_count,
                               slash_indices_count=slash_indices_count)
    rows = cdiv(context_size, block_m)
    dtype = q_seqlens.dtype
    block_count = torch.zeros(batch, heads, rows, dtype=dtype, device=device)
    block_offset = torch.zeros(batch, heads, rows, nnz_s, dtype=dtype, device=device)
    column_count = torch.zeros(batch, heads, rows, dtype=dtype, device=device)
    column_index = torch.zeros(batch, heads, rows, nnz_v, dtype=dtype, device=device)
    if batch == 0 or heads == 0 or rows == 0:
        return block_count, block_offset, column_count, column_index
    counts = (vertical_indices_count, slash_indices_count) if per_head else (q_seqlens, q_seqlens)
    grid = (cdiv(rows, _CONVERT_ROWS), heads, batch)
    with device_guard(device):
        _vs_convert_kernel[grid](
            q_seqlens.contiguous(), kv_seqlens.contiguous(),
            vertical_indexes, *vertical_indexes.stride(), slash_indexes, *slash_indexes.stride(),
            counts[0], counts[0].stride(0), counts[1], counts[1].stride(0),
            block_count, block_offset, column_count, column_index,
            heads, rows, nnz_v, nnz_s, block_m, block_n,
            CAUSAL=causal, PER_HEAD_COUNTS=per_head, BLOCK_R=_CONVERT_ROWS, num_warps=1,
        )
    return block_count, block_offset, column_count, column_index


def convert_vertical_slash_indexes(
    q_seqlens: torch.Tensor,
    kv_seqlens: torch.Tensor,
    vertical_indexes: torch.Tensor,
    slash_indexes: torch.Tensor,
    context_size: int,
    block_size_M: int,
    block_size_N: int,
    causal: bool = True,
):
    """Vertical and slash lines to the per-row-block key blocks and columns of
    :func:`sparse_attn_func` (sgl-kernel-xpu's ``convert_vertical_slash_indexes``, same results).

    For row block ``r`` (queries ``r * block_size_M ..``, ``end = (r + 1) * block_size_M``,
    ``delta = kv_len - q_len``): slash ``s`` (taken in list order; causal: only ``s < end +
    delta``) marks the key range ``[c - M, c)`` with ``c = max(delta + end - s, M)`` (causal) or
    ``kv_len + end - s``; a slash whose ``c`` lies at most ``M`` past the current range's end
    extends it by ``M``, one further away starts a new range, one at or before the end is
    ignored. Each range becomes blocks starting at ``range_start, + N, ...`` below
    ``min(range_end, kv_len)``. Verticals (in list order) left of the range current when they
    are reached become columns; after the last range, those at or right of its end do until the
    first one ``>= end + delta - 1`` (causal). With no slash a row takes verticals in
    ``[0, kv_len)`` until that same limit.

    Parameters
    ----------
    q_seqlens, kv_seqlens : torch.Tensor
        ``[B]`` int32 (or int64) query and key lengths (any values; not read on the host).
    vertical_indexes : torch.Tensor
        ``[B, H, NNZ_V]`` int32/int64 key columns, ascending as sglang writes them (other orders
        are merged in list order, as upstream does).
    slash_indexes : torch.Tensor
        ``[B, H, NNZ_S]`` int32/int64 diagonal distances, descending as sglang writes them.
    context_size : int
        Queries the tables cover: ``NUM_ROWS = ceil(context_size / block_size_M)``.
    block_size_M, block_size_N : int
        Query rows per row block; keys per block (>= 1).
    causal : bool
        Drop lines past each row block's causal limit.

    Returns
    -------
    tuple of torch.Tensor
        ``block_count [B, H, NUM_ROWS]``, ``block_offset [B, H, NUM_ROWS, NNZ_S]``,
        ``column_count [B, H, NUM_ROWS]``, ``column_index [B, H, NUM_ROWS, NNZ_V]``, all of
        ``q_seqlens``' dtype, zero past each count. A row's blocks stop at ``NNZ_S`` (upstream
        writes past the row when ``block_size_N < block_size_M`` makes more). Offsets and columns
        that do not fit the dtype wrap.
    """
    return _convert(q_seqlens, kv_seqlens, vertical_indexes, slash_indexes, None, None, context_size,
                    block_size_M, block_size_N, causal)


def convert_vertical_slash_indexes_mergehead(
    q_seqlens: torch.Tensor,
    kv_seqlens: torch.Tensor,
    vertical_indexes: torch.Tensor,
    slash_indexes: torch.Tensor,
    vertical_indices_count: torch.Tensor,
    slash_indices_count: torch.Tensor,
    context_size: int,
    block_size_M: int,
    block_size_N: int,
    causal: bool = True,
):
    """:func:`convert_vertical_slash_indexes` with per-head list lengths: head ``h`` reads only
    the first ``vertical_indices_count[h]`` verticals and ``slash_indices_count[h]`` slashes
    (``[H]`` int32/int64; a count outside ``[0, NNZ]`` is clamped to it). Same outputs."""
    check_tensor("vertical_indices_count", vertical_indices_count, dtypes=INDEX_DTYPES, ndim=1)
    check_tensor("slash_indices_count", slash_indices_count, dtypes=INDEX_DTYPES, ndim=1)
    return _convert(q_seqlens, kv_seqlens, vertical_indexes, slash_indexes, vertical_indices_count,
                    slash_indices_count, context_size, block_size_M, block_size_N, causal)


def _check_options(dropout_p, softmax_scale, softcap, alibi_slopes, deterministic, return_attn_probs, causal,
                   return_softmax_lse, block_size_M, block_size_N, head_dim):
    if check_real(dropout_p, "dropout_p", minimum=0.0) != 0.0:
        raise ValueError("dropout_p must be 0: dropout is not supported (inference only)")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes is not supported: pass None")
    check_bool(deterministic, "deterministic")  # always deterministic
    check_bool(return_attn_probs, "return_attn_probs")  # probabilities exist only with dropout
    scale = check_real(softmax_scale, "softmax_scale", allow_none=True)
    scale = head_dim ** -0.5 if scale is None else scale
    softcap = check_real(softcap, "softcap", minimum=0.0)
    block_m = check_int(block_size_M, "block_size_M", minimum=1)
    block_n = check_int(block_size_N, "block_size_N", minimum=1)
    return scale, softcap, check_bool(causal, "causal"), check_bool(return_softmax_lse, "return_softmax_lse"), \
        block_m, block_n


def _check_tables(block_count, block_offset, column_count, column_index, batch, heads):
    check_tensor("block_count", block_count, dtypes=INDEX_DTYPES, ndim=3)
    rows = block_count.shape[2]
    check_tensor("block_count", block_count, shape=(batch, heads, rows))
    check_tensor("block_offset", block_offset, dtypes=INDEX_DTYPES, shape=(batch, heads, rows, None))
    check_tensor("column_count", column_count, dtypes=INDEX_DTYPES, shape=(batch, heads, rows))
    check_tensor("column_index", column_index, dtypes=INDEX_DTYPES, shape=(batch, heads, rows, None))
    return rows


def _tiles(block_m: int, head_dim: int) -> dict:
    """Tile sizes: ``BLOCK_M`` queries a program (the largest power of two dividing
    ``block_size_M``, at most 64; a tile of at least 16 rows for tl.dot), 64 keys a step (32 past
    head dim 128), whole head rows; on Intel ``_xpu_tiles``."""
    block_rows = min(64, block_m & -block_m)
    head = max(16, next_power_of_2(head_dim))
    config = dict(BLOCK_M=block_rows, TILE_M=max(16, block_rows), BLOCK_N=64 if head <= 128 else 32,
                  HEAD_DIM=head, BLOCK_I=_BLOCK_I, BLOCK_DV=head)
    if _device.is_interpreter():
        config.update(BLOCK_N=16, num_warps=4, num_stages=1)
    elif _device.backend() == "xpu":
        config.update(_xpu_tiles(block_rows, head))
    else:  # NVIDIA: not yet timed
        config.update(num_warps=4, num_stages=2)
    return config


def _attention(q, k, v, tables, *, varlen, cu_seqlens_q, cu_seqlens_k, grid_q, softmax_scale, causal, softcap,
               block_m, block_n, return_lse, out, lse):
    """One launch over ``grid_q`` queries a request (no checks here). Dense: ``[B, S, H, D]``
    views; varlen: ``[total, H, D]`` with a batch stride of 0."""
    block_count, block_offset, column_count, column_index = tables
    batch, heads = block_count.shape[0], block_count.shape[1]
    head_dim = q.shape[-1]
    cfg = _tiles(block_m, head_dim)
    grid = (cdiv(grid_q, cfg["BLOCK_M"]) * (cfg["HEAD_DIM"] // cfg["BLOCK_DV"]), heads, batch)
    if grid[0] == 0 or heads == 0 or batch == 0:
        return
    q_k, k_k, v_k, out_k = interpreter_float32(q, k, v, out)
    if varlen:
        qs, ks, vs, os_ = ((0, t.stride(0), t.stride(1)) for t in (q_k, k_k, v_k, out_k))
        seqlen_q, seqlen_k, total_q, total_k = 0, 0, q.shape[0], k.shape[0]
        ls = (0, lse.stride(0), lse.stride(1))
        cu_q, cu_k = cu_seqlens_q, cu_seqlens_k
    else:
        qs, ks, vs, os_ = (t.stride()[:3] for t in (q_k, k_k, v_k, out_k))
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        total_q, total_k = seqlen_q, seqlen_k
        ls = lse.stride()
        cu_q = cu_k = block_count
    with device_guard(q.device):
        _vs_attn_kernel[grid](
            q_k, *qs, k_k, *ks, v_k, *vs, out_k, *os_, lse, *ls,
            cu_q, cu_k, seqlen_q, seqlen_k, total_q, total_k,
            block_count, *block_count.stride(), block_offset, *block_offset.stride(),
            column_count, *column_count.stride(), column_index, *column_index.stride(),
            block_count.shape[2], block_offset.shape[3], column_index.shape[3], q.shape[-2] // k.shape[-2],
            head_dim, block_m, block_n, softmax_scale if softcap > 0 else softmax_scale * LOG2E, softcap,
            HEAD_DIM=cfg["HEAD_DIM"], TILE_M=cfg["TILE_M"], BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
            BLOCK_I=cfg["BLOCK_I"], BLOCK_DV=cfg["BLOCK_DV"], CAUSAL=causal, VARLEN=varlen, HAS_SOFTCAP=softcap > 0, WRITE_LSE=return_lse,
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
    if out_k is not out:
        out.copy_(out_k)


def _check_qkv(q, k, v, ndim):
    check_tensor("q", q, dtypes=FLOAT_DTYPES, ndim=ndim, last_dim_contiguous=True)
    check_tensor("k", k, dtypes=(q.dtype,), ndim=ndim, last_dim_contiguous=True)
    check_tensor("v", v, dtypes=(q.dtype,), shape=tuple(k.shape), last_dim_contiguous=True)
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must have q's head dim {q.shape[-1]}, got {list(k.shape)}")
    if k.shape[-2] == 0 or q.shape[-2] % k.shape[-2]:
        raise ValueError(f"q's heads ({q.shape[-2]}) must be a multiple of k's ({k.shape[-2]})")


def _check_rest(q, k, v, tables, out, batch, **offsets):
    """The tables, ``out`` (allocated when None, returned) and one device for everything."""
    _check_tables(*tables, batch, q.shape[-2])
    if out is not None:
        check_tensor("out", out, dtypes=(q.dtype,), shape=tuple(q.shape), last_dim_contiguous=True)
    else:
        out = torch.empty_like(q)
    names = ("block_count", "block_offset", "column_count", "column_index")
    check_same_device(q=q, k=k, v=v, **dict(zip(names, tables)), **offsets, out=out)
    return out


def sparse_attn_func(
    q, k, v, block_count, block_offset, column_count, column_index,
    dropout_p=0.0, softmax_scale=None, causal=False, softcap=0.0, alibi_slopes=None, deterministic=False,
    return_attn_probs=False, *, return_softmax_lse=False, out=None, block_size_M=64, block_size_N=64,
):
    """Attention with a vertical/slash pattern (sgl-kernel-xpu's ``sparse_attn_func``).

    Query ``t`` of row block ``r = t // block_size_M`` sees the keys of blocks
    ``[block_offset[b, h, r, j], + block_size_N)`` for ``j < block_count[b, h, r]`` and the
    columns ``column_index[b, h, r, j]`` for ``j < column_count[b, h, r]``: their union (a key
    named twice counts once), within ``[0, seqlen_k)``, and with ``causal`` up to
    ``t + seqlen_k - seqlen_q`` (bottom-right). Counts are clamped to ``[0, NNZ]``; offsets
    and columns are untrusted (the keys they name outside ``[0, seqlen_k)`` are skipped).
    Queries past ``NUM_ROWS * block_size_M`` and queries that see no key give 0 and LSE -inf.

    Parameters
    ----------
    q : torch.Tensor
        ``[B, seqlen_q, H, D]`` fp16, bf16 or fp32, last dim contiguous.
    k, v : torch.Tensor
        ``[B, seqlen_k, H_kv, D]``, q's dtype; ``H % H_kv == 0`` (GQA).
    block_count, column_count : torch.Tensor
        ``[B, H, NUM_ROWS]`` int32/int64.
    block_offset : torch.Tensor
        ``[B, H, NUM_ROWS, NNZ_S]`` int32/int64: first key of each block.
    column_index : torch.Tensor
        ``[B, H, NUM_ROWS, NNZ_V]`` int32/int64: single keys.
    dropout_p : float
        Must be 0 (``ValueError`` otherwise).
    softmax_scale : float, optional
        Scale of ``q . k``; default ``D ** -0.5``.
    causal : bool
        Bottom-right causal mask on top of the pattern.
    softcap : float
        If > 0, logits become ``softcap * tanh(logits / softcap)``.
    alibi_slopes
        Must be None (``ValueError`` otherwise).
    deterministic, return_attn_probs : bool
        Accepted; the kernel is deterministic and returns no probabilities.
    return_softmax_lse : bool
        Also return the natural-log LSE ``[B, H, seqlen_q]`` fp32.
    out : torch.Tensor, optional
        ``[B, seqlen_q, H, D]`` destination in q's dtype.
    block_size_M, block_size_N : int
        Queries per row block of the tables; keys per block (sgl-kernel-xpu's, default 64).

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, torch.Tensor]
        ``out [B, seqlen_q, H, D]``, and with ``return_softmax_lse`` ``lse [B, H, seqlen_q]``.
    """
    _check_qkv(q, k, v, 4)
    batch, seqlen_q, heads, head_dim = q.shape
    if k.shape[0] != batch:
        raise ValueError(f"k must have q's batch {batch}, got {list(k.shape)}")
    scale, softcap, causal, return_lse, block_m, block_n = _check_options(
        dropout_p, softmax_scale, softcap, alibi_slopes, deterministic, return_attn_probs, causal,
        return_softmax_lse, block_size_M, block_size_N, head_dim)
    out = _check_rest(q, k, v, (block_count, block_offset, column_count, column_index), out, batch)
    lse = torch.empty(batch, heads, seqlen_q, dtype=torch.float32, device=q.device)
    _attention(q, k, v, (block_count, block_offset, column_count, column_index), varlen=False, cu_seqlens_q=None,
               cu_seqlens_k=None, grid_q=seqlen_q, softmax_scale=scale, causal=causal, softcap=softcap,
               block_m=block_m, block_n=block_n, return_lse=return_lse, out=out, lse=lse)
    return (out, lse) if return_lse else out


def sparse_attn_varlen_func(
    q, k, v, block_count, block_offset, column_count, column_index, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False, softcap=0.0, alibi_slopes=None,
    deterministic=False, return_attn_probs=False, *, return_softmax_lse=False, out=None, block_size_M=64,
    block_size_N=64,
):
    """:func:`sparse_attn_func` over ragged requests (sgl-kernel-xpu's ``sparse_attn_varlen_func``).

    ``q [total_q, H, D]``, ``k``/``v [total_k, H_kv, D]``; request ``b`` owns rows
    ``cu_seqlens_q[b] ..`` of q and ``cu_seqlens_k[b] ..`` of k/v (``[B + 1]`` int32), its row
    blocks start at its first query and its offsets / columns count from its first key, with
    ``block_count[b]`` etc. as in :func:`sparse_attn_func`. ``max_seqlen_q`` (int) sizes the grid:
    a promise, queries past it are not computed (0, LSE -inf); ``max_seqlen_k`` is unused.
    Queries of no request give 0 and LSE -inf; rows and keys outside ``q``/``k`` are never read
    whatever the offsets hold. Returns ``out [total_q, H, D]`` and with ``return_softmax_lse``
    ``lse [H, total_q]`` fp32. Other arguments as :func:`sparse_attn_func`.
    """
    _check_qkv(q, k, v, 3)
    total_q, heads, head_dim = q.shape
    check_tensor("cu_seqlens_q", cu_seqlens_q, dtypes=(torch.int32,), ndim=1)
    if cu_seqlens_q.shape[0] < 1:
        raise ValueError("cu_seqlens_q must have B + 1 >= 1 entries, got an empty tensor")
    batch = cu_seqlens_q.shape[0] - 1
    check_tensor("cu_seqlens_k", cu_seqlens_k, dtypes=(torch.int32,), shape=(batch + 1,))
    max_q = check_int(max_seqlen_q, "max_seqlen_q", minimum=0)
    check_int(max_seqlen_k, "max_seqlen_k", minimum=0, allow_none=True)
    scale, softcap, causal, return_lse, block_m, block_n = _check_options(
        dropout_p, softmax_scale, softcap, alibi_slopes, deterministic, return_attn_probs, causal,
        return_softmax_lse, block_size_M, block_size_N, head_dim)
    out = _check_rest(q, k, v, (block_count, block_offset, column_count, column_index), out, batch,
                      cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    # rows of no request (and past max_seqlen_q): 0 and -inf, then each request's rows written
    out.zero_()
    lse = torch.full((heads, total_q), float("-inf"), dtype=torch.float32, device=q.device)
    _attention(q, k, v, (block_count, block_offset, column_count, column_index), varlen=True,
               cu_seqlens_q=cu_seqlens_q.contiguous(), cu_seqlens_k=cu_seqlens_k.contiguous(),
               grid_q=min(max_q, total_q), softmax_scale=scale, causal=causal, softcap=softcap, block_m=block_m,
               block_n=block_n, return_lse=return_lse, out=out, lse=lse)
    return (out, lse) if return_lse else out
