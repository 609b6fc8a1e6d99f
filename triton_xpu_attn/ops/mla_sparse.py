"""DeepSeek sparse attention (DSA) prefill: ``flash_mla_sparse_fwd``, a drop-in for sgl-kernel-xpu's
``sgl_kernel.flash_mla_sparse_fwd`` (FlashMLA's function of the same name and contract).

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

Tiles: ``BLOCK_H`` heads x ``BLOCK_N`` entries; the score dot over ``d_qk`` either in two pieces
held for the whole loop (the power-of-two part of ``d_qk`` and the rest: 512 + 64, ``SCORE_CHUNK =
0``; the K tile's first ``d_v`` channels are then V) or in ``SCORE_CHUNK``-channel chunks re-read
per tile, with the output channels split over ``BLOCK_DV``-wide slices, one program each (each
repeats the score dot: the Intel tiles, where a ``16 x 512`` fp32 accumulator beside a
``16 x 576`` K tile would spill). Configs come from ``tune.lookup("mla_sparse", ...)`` (bucket
fields ``h`` = query heads per KV head rounded up to a power of two in 16..128, ``d`` = d_qk,
``dtype``); no file has tuned them yet and nothing has been timed: the built-in tiles are the
largest that compile without spilling (Intel: native code through ocloc; NVIDIA: sm_90 through
ptxas), tuning pending GPU time.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import device as _device
from .. import tune
from .._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    MAX_GRID_DIM_1,
    cdiv,
    check_int,
    check_real,
    check_same_device,
    check_tensor,
    device_guard,
    interpreter_float32,
    next_power_of_2,
    register_xpu_compile,
    softmax_step,
)

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# the same, for kernels (a kernel reads module globals only as constexprs)
_LOG2E = tl.constexpr(LOG2E)
_LN2 = tl.constexpr(LN2)

#: head dims this op accepts: d_qk (and d_v <= d_qk) multiples of 8 up to this
MAX_HEAD_DIM = 1024


@triton.jit
def _rows_cols_mask(rows_ok, cols, LIMIT: tl.constexpr, END: tl.constexpr):
    """2-D mask of rows ``rows_ok`` x columns ``cols < LIMIT`` of a block whose columns end at
    ``END``; the column test is left out when the whole block lies below ``LIMIT`` (a mask uniform
    along the contiguous dimension keeps accesses vectorised)."""
    if END <= LIMIT:
        return rows_ok[:, None]
    else:
        return rows_ok[:, None] & (cols < LIMIT)[None, :]


@triton.jit
def _score_dot(q, k, DOT_PRECISION: tl.constexpr):
    """``q @ k^T`` accumulated in fp32 (``q [BLOCK_H, C]``, ``k [BLOCK_N, C]``, one dtype): every
    score dot of the kernel goes through this one site."""
    return tl.dot(q, tl.trans(k), out_dtype=tl.float32, input_precision=DOT_PRECISION)


@triton.jit
def _mla_sparse_kernel(
    q_ptr,  # [s_q, h_q, D_QK] (any token / head strides, channels contiguous)
    stride_q_s,
    stride_q_h,
    kv_ptr,  # [s_kv, h_kv, D_QK] (channels contiguous)
    stride_kv_s,
    stride_kv_h,
    idx_ptr,  # [s_q, h_kv, topk] int32 / int64 rows of kv (any strides)
    stride_i_s,
    stride_i_h,
    stride_i_k,
    topk_length_ptr,  # [s_q] int32 / int64 (read when HAS_TOPK_LENGTH)
    stride_tl,
    sink_ptr,  # [h_q] float (read when HAS_SINK)
    stride_sink,
    out_ptr,  # [s_q, h_q, D_V] (channels contiguous)
    stride_o_s,
    stride_o_h,
    max_logits_ptr,  # [s_q, h_q] fp32
    stride_m_s,
    stride_m_h,
    lse_ptr,  # [s_q, h_q] fp32
    stride_l_s,
    stride_l_h,
    qk_scale,  # sm_scale * log2(e)
    s_kv,  # rows of kv: an index outside [0, s_kv) is never followed
    topk,  # entries per index list
    group,  # query heads per KV head (h_q // h_kv)
    D_QK: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_MAIN: tl.constexpr,  # SCORE_CHUNK == 0: channels [0, BLOCK_MAIN) of the score dot ...
    BLOCK_TAIL: tl.constexpr,  # ... and [BLOCK_MAIN, BLOCK_MAIN + BLOCK_TAIL) (0: none)
    SCORE_CHUNK: tl.constexpr,  # > 0: the score dot in chunks of this many channels, q re-read per tile
    BLOCK_DV: tl.constexpr,  # output channels per program (a power of two)
    HAS_TOPK_LENGTH: tl.constexpr,
    HAS_SINK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    NUM_DV: tl.constexpr = (D_V + BLOCK_DV - 1) // BLOCK_DV
    # the K tile of the held-q path is V too when one program owns all output channels in it
    V_FROM_K: tl.constexpr = (SCORE_CHUNK == 0 and NUM_DV == 1) and BLOCK_DV == BLOCK_MAIN
    t = tl.program_id(0).to(tl.int64)  # token (axis 0: up to 2^31 - 1 tokens)
    pid = tl.program_id(1)
    dv_tile = pid % NUM_DV
    head_block = pid // NUM_DV
    blocks_per_group = tl.cdiv(group, BLOCK_H)
    kv_head = head_block // blocks_per_group
    local = (head_block % blocks_per_group) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = local < group
    head = (kv_head * group + local).to(tl.int64)

    # entries of this token's list that count: the first topk_length[t] (clamped to [0, topk])
    n_entries = topk
    if HAS_TOPK_LENGTH:
        n_entries = tl.minimum(tl.maximum(tl.load(topk_length_ptr + t * stride_tl), 0), topk)

    q_rows = q_ptr + t * stride_q_s + head * stride_q_h  # [BLOCK_H] row starts
    kv_rows0 = kv_ptr + kv_head.to(tl.int64) * stride_kv_h
    idx_row = idx_ptr + t * stride_i_s + kv_head.to(tl.int64) * stride_i_h
    cm = tl.arange(0, BLOCK_MAIN)
    if SCORE_CHUNK == 0:
        q_main = tl.load(q_rows[:, None] + cm[None, :], mask=_rows_cols_mask(row_ok, cm, D_QK, BLOCK_MAIN), other=0.0)
        if BLOCK_TAIL > 0:
            ct = BLOCK_MAIN + tl.arange(0, BLOCK_TAIL)
            q_tail = tl.load(q_rows[:, None] + ct[None, :],
                             mask=_rows_cols_mask(row_ok, ct, D_QK, BLOCK_MAIN + BLOCK_TAIL), other=0.0)
    dv = dv_tile * BLOCK_DV + tl.arange(0, BLOCK_DV)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    for start in range(0, n_entries, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        listed = offs < n_entries
        idx = tl.load(idx_row + offs.to(tl.int64) * stride_i_k, mask=listed, other=-1)
        valid = listed & (idx >= 0) & (idx < s_kv)
        # row starts of the selected rows (64-bit: s_kv x row stride may pass 2^31); an invalid
        # entry points at row 0 but is never loaded
        rows = kv_rows0 + tl.where(valid, idx, 0).to(tl.int64) * stride_kv_s
        if SCORE_CHUNK == 0:
            k_main = tl.load(rows[:, None] + cm[None, :], mask=_rows_cols_mask(valid, cm, D_QK, BLOCK_MAIN), other=0.0)
            s = _score_dot(q_main, k_main.to(q_main.dtype), DOT_PRECISION)
            if BLOCK_TAIL > 0:
                k_tail = tl.load(rows[:, None] + ct[None, :],
                                 mask=_rows_cols_mask(valid, ct, D_QK, BLOCK_MAIN + BLOCK_TAIL), other=0.0)
                s = s + _score_dot(q_tail, k_tail.to(q_tail.dtype), DOT_PRECISION)
        else:
            for c in tl.static_range((D_QK + SCORE_CHUNK - 1) // SCORE_CHUNK):
                cc = c * SCORE_CHUNK + tl.arange(0, SCORE_CHUNK)
                q_c = tl.load(q_rows[:, None] + cc[None, :],
                              mask=_rows_cols_mask(row_ok, cc, D_QK, (c + 1) * SCORE_CHUNK), other=0.0)
                k_c = tl.load(rows[:, None] + cc[None, :],
                              mask=_rows_cols_mask(valid, cc, D_QK, (c + 1) * SCORE_CHUNK), other=0.0)
                part = _score_dot(q_c, k_c.to(q_c.dtype), DOT_PRECISION)
                s = part if c == 0 else s + part
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
        p, alpha, m_i, l_i = softmax_step(s, m_i, l_i)
        if V_FROM_K:
            v = k_main
        else:
            if D_V % BLOCK_DV == 0:
                v_mask = valid[:, None]
            else:
                v_mask = valid[:, None] & (dv < D_V)[None, :]
            v = tl.load(rows[:, None] + dv[None, :], mask=v_mask, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc=acc * alpha[:, None], input_precision=DOT_PRECISION)

    # l_i > 0 for every row that saw a valid entry; a token without one has acc = 0 and gives 0
    # (with or without a sink), never 0 / 0; NaN from a selected row propagates
    denom = l_i
    if HAS_SINK:
        sink = tl.load(sink_ptr + head * stride_sink, mask=row_ok, other=float("-inf")).to(tl.float32) * _LOG2E
        m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
        denom = l_i + tl.exp2(sink - m_safe)  # a +inf sink: denominator inf, output 0
    o = acc / tl.where(denom > 0.0, denom, 1.0)[:, None]
    o_rows = out_ptr + t * stride_o_s + head * stride_o_h
    if D_V % BLOCK_DV == 0:
        o_mask = row_ok[:, None]
    else:
        o_mask = row_ok[:, None] & (dv < D_V)[None, :]
    tl.store(o_rows[:, None] + dv[None, :], o.to(out_ptr.dtype.element_ty), mask=o_mask)
    if dv_tile == 0:
        # natural-log units of the scaled logits; a token without a valid entry: max -inf, lse +inf
        no_key = l_i == 0.0  # NaN from a selected row stays NaN
        lse = tl.where(no_key, float("inf"), (m_i + tl.log2(tl.where(no_key, 1.0, l_i))) * _LN2)
        tl.store(max_logits_ptr + t * stride_m_s + head * stride_m_h, m_i * _LN2, mask=row_ok)
        tl.store(lse_ptr + t * stride_l_s + head * stride_l_h, lse, mask=row_ok)


#: the XPU heuristic's tile as kernel constexprs (see ``_heuristic_config``): 0 B spilled on pvc and
#: bmg (triton-xpu 3.3 -> ocloc, the registered variants below)
_XPU_TILES_CONSTEXPRS = dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=64, BLOCK_DV=64)


def _register_compile_variants():
    deepseek = dict(
        q_ptr="*bf16", stride_q_s="i64", stride_q_h="i32",
        kv_ptr="*bf16", stride_kv_s="i64", stride_kv_h="i32",
        idx_ptr="*i32", stride_i_s="i64", stride_i_h="i32", stride_i_k="i32",
        topk_length_ptr="*i32", stride_tl="i32", sink_ptr="*fp32", stride_sink="i32",
        out_ptr="*bf16", stride_o_s="i64", stride_o_h="i32",
        max_logits_ptr="*fp32", stride_m_s="i32", stride_m_h="i32",
        lse_ptr="*fp32", stride_l_s="i32", stride_l_h="i32",
        qk_scale="fp32", s_kv="i32", topk="i32", group="i32",
        D_QK=576, D_V=512, BLOCK_H=16, BLOCK_N=16, BLOCK_MAIN=512, BLOCK_TAIL=64,
        HAS_TOPK_LENGTH=True, HAS_SINK=True, DOT_PRECISION="tf32",
    )
    opts = dict(dots=2, op="mla_sparse", num_warps=8, num_stages=1, grf_mode=_device.xpu_large_grf_mode())
    # as the XPU heuristic launches it: 16 heads x 16 entries, the score dot in 64-channel chunks,
    # 64 output channels a program (gathered rows: no 2D block reads)
    register_xpu_compile(_mla_sparse_kernel, "bf16,D576,DV512,BH16xDV64,chunks64,sink,topk_length",
                         {**deepseek, **_XPU_TILES_CONSTEXPRS}, **opts)
    register_xpu_compile(_mla_sparse_kernel, "fp16,D512,DV512,BH16xDV64,chunks64",
                         {**deepseek, **_XPU_TILES_CONSTEXPRS, "q_ptr": "*fp16", "kv_ptr": "*fp16", "out_ptr": "*fp16",
                          "D_QK": 512, "BLOCK_TAIL": 0, "HAS_TOPK_LENGTH": False, "HAS_SINK": False}, **opts)


_register_compile_variants()


def _heuristic_config(group: int, dtype: torch.dtype) -> dict:
    """Built-in tiles (no tuned file covers ``mla_sparse`` yet). ``SCORE_CHUNK`` 0 = the score dot
    in two held pieces, ``BLOCK_DV`` 0 = all output channels in one program."""
    backend = _device.backend()
    if backend == "interpreter":
        return dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=4, num_stages=1)
    if backend == "xpu":
        # MLA's Intel tiles (mla.xpu_tiles, chosen on native code): 16 entries, 64 output channels
        # a program, the score dot in 64-channel chunks beside them
        return dict(_XPU_TILES_CONSTEXPRS, num_warps=8, num_stages=1, grf_mode="256")
    # NVIDIA: not yet timed (tuning is pending GPU time); the largest tiles that compile without
    # spilling for sm_90 at d_qk 576 / d_v 512 (ptxas through Triton 3.9, no GPU run): 16 or 32 heads
    # x 32 entries on 8 warps, 198 / 254 registers. 64-head tiles spill 0.7-1.4 KB a thread there
    # (the 64 x 512 fp32 accumulator), as do 64-entry tiles (184-992 B)
    if dtype == torch.float32:
        return dict(BLOCK_H=16 if group <= 16 else 32, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0,
                    num_warps=4 if group <= 16 else 8, num_stages=1)
    return dict(BLOCK_H=16 if group <= 16 else 32, BLOCK_N=32, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=8, num_stages=2)


def _pow2_at_least_16(value, name: str) -> int:
    value = int(value)
    if value < 16 or value & (value - 1):
        raise ValueError(f"mla_sparse config: {name} must be a power of two >= 16, got {value}")
    return value


def _check_output(name: str, t, dtype: torch.dtype, shape: tuple, last_dim_contiguous: bool = False):
    if t is not None:
        check_tensor(name, t, dtypes=(dtype,), shape=shape, last_dim_contiguous=last_dim_contiguous)
    return t


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    max_logits: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
):
    """Sparse attention of each query token over the ``kv`` rows its index list selects
    (DeepSeek sparse attention, DSA; sgl-kernel-xpu / FlashMLA drop-in).

    For token ``t``, query head ``h`` and its KV head ``g = h // (h_q / h_kv)``, with
    ``S = {i : i < topk_length[t], 0 <= indices[t, g, i] < s_kv}`` (an index listed twice counts
    twice) and logits ``z_i = sm_scale * q[t, h] . kv[indices[t, g, i], g]`` over all ``d_qk``
    channels::

        max_logits[t, h] = max_{i in S} z_i
        lse[t, h]        = log(sum_{i in S} exp(z_i))
        out[t, h]        = sum_{i in S} exp(z_i - lse) * kv[indices[t, g, i], g, :d_v]
                           * exp(lse) / (exp(lse) + exp(attn_sink[h]))

    Parameters
    ----------
    q : torch.Tensor
        ``[s_q, h_q, d_qk]`` fp16/bf16/fp32 queries (DeepSeek: ``d_qk`` 576 = 512 latent + 64 rope,
        or 512). Any token / head strides; a last dim that is not contiguous is copied.
    kv : torch.Tensor
        ``[s_kv, h_kv, d_qk]`` keys, q's dtype; V is the first ``d_v`` channels of each row. Any
        row / head strides with ``stride(-1) == 1``. Rows no valid entry selects are never read
        (they may hold NaN or inf).
    indices : torch.Tensor
        ``[s_q, h_kv, topk]`` int32 (or int64), any strides: the rows of ``kv`` each token attends
        to, per KV head. An entry outside ``[0, s_kv)`` (-1 padding, any negative value, ``s_kv``
        or more) is skipped.
    sm_scale : float
        Softmax scale applied to the ``d_qk``-channel dot (finite).
    d_v : int
        Channels of V and of the output: a multiple of 8, at most ``d_qk`` (upstream: 512).
    attn_sink : torch.Tensor, optional
        ``[h_q]`` float (fp32 upstream) per-head sink logits, natural-log units of the scaled
        logits: they join the softmax denominator, scaling the output by
        ``exp(lse) / (exp(lse) + exp(attn_sink[h]))`` (``-inf``: no effect; ``+inf``: output 0), and
        change neither ``max_logits`` nor ``lse``.
    topk_length : torch.Tensor, optional
        ``[s_q]`` int32 (or int64): token ``t`` uses only its first ``topk_length[t]`` entries
        (values past ``topk`` mean all of them, values <= 0 none). Entries past it are never read,
        nor the rows they name.
    out : torch.Tensor, optional
        ``[s_q, h_q, d_v]`` in q's dtype (last dim contiguous) to write the output into (this
        package's extension; upstream allocates it).
    max_logits, lse : torch.Tensor, optional
        ``[s_q, h_q]`` fp32 tensors to write those results into (this package's extension).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor, torch.Tensor]
        ``(out [s_q, h_q, d_v]`` in q's dtype, ``max_logits [s_q, h_q]`` fp32, ``lse [s_q, h_q]``
        fp32), as upstream's reference (FlashMLA ``tests/ref.py``) defines them: natural log of the
        scaled logits (FlashMLA's README describes base-2 values: its older kernel's). A token with
        no valid entry gives ``out`` 0, ``max_logits`` ``-inf`` and ``lse`` ``+inf`` (FlashMLA's
        value; this package's other ops give ``-inf`` there).

    No value in ``indices`` or ``topk_length`` makes the kernel read or write outside the given
    tensors, and nothing here reads device values on the host (graph-capturable).
    """
    check_tensor("q", q, dtypes=FLOAT_DTYPES, ndim=3)
    dtype = q.dtype
    check_tensor("kv", kv, dtypes=(dtype,), ndim=3, last_dim_contiguous=True)
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv = kv.shape[0], kv.shape[1]
    if d_qk % 8 or not 8 <= d_qk <= MAX_HEAD_DIM:
        raise ValueError(f"q: head dim d_qk must be a multiple of 8 from 8 to {MAX_HEAD_DIM}, got {d_qk}")
    if kv.shape[2] != d_qk:
        raise ValueError(f"kv rows hold {kv.shape[2]} channels but q's head dim d_qk is {d_qk}")
    if h_kv < 1:
        raise ValueError(f"kv must have at least one KV head, got shape {list(kv.shape)}")
    if h_q % h_kv:
        raise ValueError(f"q's heads ({h_q}) must be a multiple of kv's heads ({h_kv})")
    check_tensor("indices", indices, dtypes=INDEX_DTYPES, ndim=3)
    if indices.shape[0] != s_q or indices.shape[1] != h_kv:
        raise ValueError(
            f"indices must have shape [s_q, h_kv, topk] = [{s_q}, {h_kv}, topk], got {list(indices.shape)}"
        )
    topk = indices.shape[2]
    sm_scale = check_real(sm_scale, "sm_scale")
    d_v = check_int(d_v, "d_v")
    if d_v % 8 or not 8 <= d_v <= d_qk:
        raise ValueError(f"d_v must be a multiple of 8 from 8 to d_qk = {d_qk}, got {d_v}")
    if attn_sink is not None:
        check_tensor("attn_sink", attn_sink, dtypes=FLOAT_DTYPES, shape=(h_q,))
    if topk_length is not None:
        check_tensor("topk_length", topk_length, dtypes=INDEX_DTYPES, shape=(s_q,))
    _check_output("out", out, dtype, (s_q, h_q, d_v), last_dim_contiguous=True)
    _check_output("max_logits", max_logits, torch.float32, (s_q, h_q))
    _check_output("lse", lse, torch.float32, (s_q, h_q))
    device = check_same_device(q=q, kv=kv, indices=indices, attn_sink=attn_sink, topk_length=topk_length, out=out,
                               max_logits=max_logits, lse=lse)

    group = h_q // h_kv
    config = tune.lookup(
        "mla_sparse", {"h": tune.pow2_bucket(group, 16, 128), "d": d_qk, "dtype": str(dtype).replace("torch.", "")},
        _heuristic_config(group, dtype), device=device)
    block_h = _pow2_at_least_16(config["BLOCK_H"], "BLOCK_H")
    block_n = _pow2_at_least_16(config["BLOCK_N"], "BLOCK_N")
    score_chunk = int(config.get("SCORE_CHUNK", 0) or 0)
    if score_chunk:
        score_chunk = _pow2_at_least_16(score_chunk, "SCORE_CHUNK")
    block_dv_all = max(16, next_power_of_2(d_v))
    block_dv = int(config.get("BLOCK_DV", 0) or 0)
    block_dv = min(_pow2_at_least_16(block_dv, "BLOCK_DV"), block_dv_all) if block_dv else block_dv_all
    num_dv = cdiv(d_v, block_dv)
    # the score dot's held pieces: the largest power of two <= d_qk (at least 16), then the rest
    block_main = max(16, 1 << (d_qk.bit_length() - 1))
    rest = d_qk - block_main
    block_tail = max(16, next_power_of_2(rest)) if rest > 0 else 0
    programs_per_token = h_kv * cdiv(group, block_h) * num_dv
    if programs_per_token > MAX_GRID_DIM_1:
        raise ValueError(
            f"q has too many heads for one launch: {h_q} heads in blocks of {block_h} x {num_dv} channel slices "
            f"need {programs_per_token} programs a token (at most {MAX_GRID_DIM_1})"
        )

    if out is None:
        out = torch.empty((s_q, h_q, d_v), dtype=dtype, device=device)
    if max_logits is None:
        max_logits = torch.empty((s_q, h_q), dtype=torch.float32, device=device)
    if lse is None:
        lse = torch.empty((s_q, h_q), dtype=torch.float32, device=device)
    if s_q == 0 or h_q == 0:
        return out, max_logits, lse
    if s_kv == 0 or topk == 0:  # no entry can be valid: every token is without keys
        out.zero_()
        max_logits.fill_(-math.inf)
        lse.fill_(math.inf)
        return out, max_logits, lse
    if q.stride(-1) != 1:
        q = q.contiguous()

    # the interpreter's bf16 arithmetic is wrong: bf16 runs in fp32 there (no copy when compiled)
    dest = out
    q, kv, out = interpreter_float32(q, kv, out)
    # absent optional inputs: any tensor in their place (never read)
    lengths = (topk_length, topk_length.stride(0)) if topk_length is not None else (indices, 0)
    sinks = (attn_sink, attn_sink.stride(0)) if attn_sink is not None else (max_logits, 0)
    with device_guard(device):
        _mla_sparse_kernel[(s_q, programs_per_token)](
            q, q.stride(0), q.stride(1),
            kv, kv.stride(0), kv.stride(1),
            indices, *indices.stride(),
            *lengths,
            *sinks,
            out, out.stride(0), out.stride(1),
            max_logits, *max_logits.stride(),
            lse, *lse.stride(),
            sm_scale * LOG2E, s_kv, topk, group,
            D_QK=d_qk, D_V=d_v, BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_MAIN=block_main, BLOCK_TAIL=block_tail,
            SCORE_CHUNK=score_chunk, BLOCK_DV=block_dv,
            HAS_TOPK_LENGTH=topk_length is not None, HAS_SINK=attn_sink is not None,
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            **tune.launch_options(config),
        )
    if out is not dest:
        dest.copy_(out)
    return dest, max_logits, lse
