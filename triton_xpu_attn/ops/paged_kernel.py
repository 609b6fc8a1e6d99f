"""The paged attention kernel, ``_paged_attention_kernel``: decode, drafts, chunked prefill and
(``PAGE_SIZE = 0``) non-paged ragged prefill, one program per (query tile x head block, KV head,
KV split); the key tiles come from ``paged_tiles``. The launcher is ``paged_attention``; the XPU
compile variants CI builds are in ``paged_registry``."""
from __future__ import annotations

import triton
import triton.language as tl

from .._common import gdc_launch_dependents
from .paged_tiles import _descriptor_tiles, _query_rows_block, _query_rows_desc, _tile

#: head dims (D and Dv) the paged kernel takes: multiples of 8 up to MAX_HEAD_DIM; tiles are the next
#: power of two (at least 16, tl.dot's K) with the padded channels masked
MAX_HEAD_DIM = 512
#: D (not Dv) may reach MAX_HEAD_DIM_QK: the channels past MAX_HEAD_DIM are the score dot's second
#: chunk (``D_TAIL``, the next power of two of what is left: 576 = 512 + 64, MLA's latent + rope)
MAX_HEAD_DIM_QK = 576

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
    alibi_ptr, stride_alibi_b,
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
    D_TAIL: tl.constexpr = 0,
    HAS_ALIBI: tl.constexpr = False,
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
    # D_TAIL: head-dim channels past BLOCK_D (D = 576: 512 + 64), the score dot's second chunk.
    # With D_CHUNK the chunk loop reads them; else q's tail rows here, once
    TAIL_DOT: tl.constexpr = D_TAIL > 0 and D_CHUNK == 0
    q_tail = 0
    if TAIL_DOT:
        dt = BLOCK_D + tl.arange(0, D_TAIL)
        q_tail = tl.load(q_ptr + token[:, None] * stride_q_t + q_head[:, None] * stride_q_h + dt[None, :],
                         mask=row_valid[:, None] & (dt[None, :] < head_dim), other=0.0)

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
    # ALiBi: pointers to each row's slope (request b, its query head; stride_alibi_b = 0 for [Hq]
    # slopes; rows no query owns read head 0), read per key tile (_logits), and their factor to the
    # units of the tile scores: base 2, or unscaled with SCALE_IN_EXP (the softmax multiplies the
    # biased score by qk_scale)
    alibi = 0
    alibi_scale = LOG2E
    if HAS_ALIBI:
        alibi = alibi_ptr + b * stride_alibi_b + tl.where(row_valid, q_head, 0)
        if SCALE_IN_EXP:
            alibi_scale = LOG2E / qk_scale

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
                SCALE_IN_EXP=SCALE_IN_EXP, alibi=alibi, alibi_pos=pos, alibi_scale=alibi_scale, HAS_ALIBI=HAS_ALIBI)
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
                SCALE_IN_EXP, alibi, pos, alibi_scale, HAS_ALIBI)
            acc, m_i, l_i = _descriptor_tiles(
                q, acc, m_i, l_i, whole_lo, whole_hi, mid_lo, mid_hi, row_lo, row_hi, qk_scale, softcap, pt_row,
                kv_start, k_desc, k_col, v_desc, v_col, 0, BLOCK_N, PAGE_SIZE, HAS_SOFTCAP, DOT_PRECISION,
                SCALE_IN_EXP, alibi, pos, alibi_scale, HAS_ALIBI)
            acc, m_i, l_i = _descriptor_tiles(
                q, acc, m_i, l_i, whole_hi, desc_hi, mid_lo, mid_hi, row_lo, row_hi, qk_scale, softcap, pt_row,
                kv_start, k_desc, k_col, v_desc, v_col, 1, BLOCK_N, PAGE_SIZE, HAS_SOFTCAP, DOT_PRECISION,
                SCALE_IN_EXP, alibi, pos, alibi_scale, HAS_ALIBI)
        else:
            acc, m_i, l_i = _descriptor_tiles(
                q, acc, m_i, l_i, desc_lo, desc_hi, mid_lo, mid_hi, row_lo, row_hi, qk_scale, softcap, pt_row,
                kv_start, k_desc, k_col, v_desc, v_col, 2, BLOCK_N, PAGE_SIZE, HAS_SOFTCAP, DOT_PRECISION,
                SCALE_IN_EXP, alibi, pos, alibi_scale, HAS_ALIBI)
        for n0 in range(desc_hi, end, BLOCK_N):
            acc, m_i, l_i = _tile(
                q, acc, m_i, l_i, n0, kv_start, first_key, end, True, row_lo, row_hi, qk_scale, softcap,
                pt_row, pool_size, k_base, stride_k_page, stride_k_tok, v_base, stride_v_page, stride_v_tok, head_dim,
                head_dim_v,
                BLOCK_N, BLOCK_D, BLOCK_DV, PAGE_SIZE, HAS_SOFTCAP, DOT_PRECISION, HOIST_GATHER,
                SCALE_IN_EXP=SCALE_IN_EXP, alibi=alibi, alibi_pos=pos, alibi_scale=alibi_scale, HAS_ALIBI=HAS_ALIBI)
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
                D_CHUNK, QO_BLOCK, INTEL_GPU, page_ids, PREFETCH, Q_DESC, SCALE_IN_EXP, q_tail, D_TAIL, alibi, pos, alibi_scale,
                HAS_ALIBI)

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
