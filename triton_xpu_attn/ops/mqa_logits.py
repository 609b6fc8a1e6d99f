"""DeepSeek sparse attention (DSA) indexer logits: ``fp8_mqa_logits`` (ragged keys, prefill) and
``fp8_paged_mqa_logits`` (paged indexer cache, decode), drop-ins for DeepGEMM's functions of those
names as sgl-kernel-xpu (``sgl_kernel.nsa``, ``sgl_kernel.fp8_paged_mqa_logits``) and
vllm-xpu-kernels (``_xpu_C``) expose them.

For a query row ``i`` and a key ``j`` both compute::

    logits[i, j] = k_scale[j] * sum_h relu(q[i, h] . k[j]) * weights[i, h]

with fp8 e4m3 ``q`` and ``k`` and fp32 accumulation. Upstream's torch path materialises the
``[Nq * H, Nk]`` products; here the heads reduce inside the kernel:

* ``_mqa_logits_kernel``: one program per (key block, query block); the key tile is loaded once
  and the program loops over the heads, each a ``[BLOCK_Q, D] x [D, BLOCK_K]`` dot on the matrix
  units, then relu, the head's weight column and an fp32 accumulation. A block in which no row
  sees a key (causal prefill's upper triangle) skips the dots and only writes the fill value.
* ``_paged_mqa_logits_kernel``: one program per (request, group of its ``next_n`` query rows,
  chunk of ``TILES`` key tiles); the group's queries (``ROWS x H`` rows) stay in registers for
  the chunk, one dot per key tile covers all of them, and the heads reduce with a sum.

The dot operands: fp8 on NVIDIA GPUs with fp8 tensor cores (sm_89+), bf16 elsewhere (Intel GPUs
have no fp8 DPAS; fp8 e4m3 converts to bf16 exactly), fp32 under the interpreter (its bf16
arithmetic is wrong). Positions a row does not see get the fill value through ``tl.where``: 0,
or ``-inf`` with ``clean_logits`` (DeepGEMM's cleaned logits); a NaN in a key, scale or query a
row does not see never reaches that row. Configs come from ``tune.lookup("mqa_logits" /
"paged_mqa_logits", ...)``; the built-in tiles are untimed first choices that compile without
spilling (Intel: native code through ocloc).
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
    check_bool,
    check_int,
    check_same_device,
    check_tensor,
    config_pow2,
    device_guard,
    next_power_of_2,
    register_xpu_compile,
)

#: dtypes fp8 e4m3 tensors may come in (upstream passes uint8 views too)
FP8_INPUT_DTYPES = (torch.uint8, torch.float8_e4m3fn)
#: head dims (``D``) accepted: multiples of 16 up to this
MAX_HEAD_DIM = 512
#: query heads accepted by the paged op (one program holds a row group's heads)
MAX_PAGED_HEADS = 256
#: byte layouts of a paged indexer cache page (see ``fp8_paged_mqa_logits``)
KV_LAYOUTS = ("page", "token")


@triton.jit
def _dot_operand(x, DOT: tl.constexpr):
    """An fp8 e4m3 tile as a dot operand: fp8 as it is, or converted (exactly) to bf16 / fp32."""
    if DOT == "fp8":
        return x
    elif DOT == "bf16":
        return x.to(tl.bfloat16)
    else:
        return x.to(tl.float32)


@triton.jit
def _mqa_logits_kernel(
    q_ptr,  # [n_q, H, D] fp8 e4m3 (channels contiguous)
    stride_q_n,
    stride_q_h,
    k_ptr,  # [n_k, D] fp8 e4m3 (channels contiguous)
    stride_k,
    k_scale_ptr,  # [n_k] fp32
    stride_kscale,
    w_ptr,  # [n_q, H] float
    stride_w_n,
    stride_w_h,
    ks_ptr,  # [n_q] int32 / int64: first key a row sees
    stride_ks,
    ke_ptr,  # [n_q] int32 / int64: one past the last key a row sees
    stride_ke,
    out_ptr,  # [n_q, n_k] fp32 (columns contiguous)
    stride_o,
    n_q,
    n_k,
    num_heads,
    FILL: tl.constexpr,  # value of a position a row does not see (0.0 or -inf)
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT: tl.constexpr,  # "fp8", "bf16" or "fp32": the dot operands
):
    c0 = tl.program_id(0) * BLOCK_K
    r0 = tl.program_id(1) * BLOCK_Q
    r_local = tl.arange(0, BLOCK_Q)
    c_local = tl.arange(0, BLOCK_K)
    rows = r0 + r_local
    cols = c0 + c_local
    row_ok = rows < n_q
    col_ok = cols < n_k
    rows64 = rows.to(tl.int64)
    # each row's range cut to [0, n_k] (int32 from here on: n_k < 2^31)
    ks = tl.load(ks_ptr + rows64 * stride_ks, mask=row_ok, other=0).to(tl.int64)
    ke = tl.load(ke_ptr + rows64 * stride_ke, mask=row_ok, other=0).to(tl.int64)
    ks = tl.minimum(tl.maximum(ks, 0), n_k).to(tl.int32)
    ke = tl.minimum(tl.maximum(ke, 0), n_k).to(tl.int32)
    ke = tl.where(row_ok, tl.maximum(ke, ks), ks)  # an empty range: [ks, ks)
    # the keys some row of the block sees: [lo, hi) over the rows whose range is not empty
    nonempty = ke > ks
    lo = tl.min(tl.where(nonempty, ks, n_k), axis=0)
    hi = tl.max(tl.where(nonempty, ke, 0), axis=0)
    acc = tl.zeros([BLOCK_Q, BLOCK_K], dtype=tl.float32)
    if (lo < c0 + BLOCK_K) & (hi > c0):
        d = tl.arange(0, BLOCK_D)
        if BLOCK_D == D:
            k_mask = col_ok[:, None]
            q_mask = row_ok[:, None]
        else:
            k_mask = col_ok[:, None] & (d < D)[None, :]
            q_mask = row_ok[:, None] & (d < D)[None, :]
        k = tl.load(k_ptr + c0.to(tl.int64) * stride_k + (c_local * stride_k)[:, None] + d[None, :], mask=k_mask,
                    other=0.0)
        k_t = tl.trans(_dot_operand(k, DOT))
        # 32-bit offsets inside the block from 64-bit block bases (q rows: H * D elements < 2^31 / BLOCK_Q)
        q_offs = (r_local * stride_q_n)[:, None] + d[None, :]
        q_base = q_ptr + r0.to(tl.int64) * stride_q_n
        w_base = w_ptr + r0.to(tl.int64) * stride_w_n
        for h in range(num_heads):
            q = tl.load(q_base + h * stride_q_h + q_offs, mask=q_mask, other=0.0)
            s = tl.dot(_dot_operand(q, DOT), k_t, out_dtype=tl.float32, input_precision="ieee")
            w = tl.load(w_base + h * stride_w_h + r_local * stride_w_n, mask=row_ok, other=0.0).to(tl.float32)
            acc += tl.maximum(s, 0.0) * w[:, None]
        scale = tl.load(k_scale_ptr + cols.to(tl.int64) * stride_kscale, mask=col_ok, other=0.0)
        acc = acc * scale[None, :]
    seen = (cols[None, :] >= ks[:, None]) & (cols[None, :] < ke[:, None])
    out = tl.where(seen, acc, FILL)
    out_base = out_ptr + r0.to(tl.int64) * stride_o + c0
    tl.store(out_base + (r_local * stride_o)[:, None] + c_local[None, :], out, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _paged_mqa_logits_kernel(
    q_ptr,  # [B, next_n, H, D] fp8 e4m3 (channels contiguous)
    stride_q_b,
    stride_q_n,
    stride_q_h,
    kv_ptr,  # the cache's bytes as fp8 e4m3 (page p starts at p * stride_page)
    scale_ptr,  # the same bytes as fp32 (page p starts at p * stride_page_f32)
    stride_page,
    stride_page_f32,
    key_stride,  # elements from one key of a page to the next (D: "page" layout, D + 4: "token")
    scale_base,  # fp32 elements from a page's start to its first scale
    scale_stride,  # fp32 elements from one scale of a page to the next
    num_pages,
    w_ptr,  # [B * next_n, H] float
    stride_w_n,
    stride_w_h,
    lens_ptr,  # [B] or [B, next_n] int32 / int64
    stride_len_b,
    stride_len_n,
    bt_ptr,  # [B, table_width] int32 / int64 page ids
    stride_bt_b,
    stride_bt_w,
    table_width,
    out_ptr,  # [B * next_n, out_cols] fp32 (columns contiguous)
    stride_o,
    out_cols,
    next_n,
    num_heads,
    tiles,  # key tiles a program covers
    FILL: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    LENS_PER_ROW: tl.constexpr,  # lens [B, next_n]: row r sees keys < lens[b, r]; else < lens[b] - next_n + r + 1
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    ROWS: tl.constexpr,  # query rows of a request a program handles
    BLOCK_K: tl.constexpr,
    DOT: tl.constexpr,
):
    groups = tl.cdiv(next_n, ROWS)
    pid = tl.program_id(0)
    b = (pid // groups).to(tl.int64)
    r_first = (pid % groups) * ROWS
    # query rows as [ROWS * BLOCK_H] (row r_first + m // BLOCK_H, head m % BLOCK_H)
    m = tl.arange(0, ROWS * BLOCK_H)
    m_row = r_first + m // BLOCK_H
    m_head = m % BLOCK_H
    m_ok = (m_row < next_n) & (m_head < num_heads)
    d = tl.arange(0, BLOCK_D)
    if BLOCK_D == D:
        q_mask = m_ok[:, None]
    else:
        q_mask = m_ok[:, None] & (d < D)[None, :]
    q = tl.load(q_ptr + b * stride_q_b + m_row.to(tl.int64)[:, None] * stride_q_n + m_head[:, None] * stride_q_h
                + d[None, :], mask=q_mask, other=0.0)
    q = _dot_operand(q, DOT)
    w = tl.load(w_ptr + (b * next_n + m_row) * stride_w_n + m_head * stride_w_h, mask=m_ok, other=0.0).to(tl.float32)
    # the keys each row sees: [0, limit), bounded by what the page table covers
    r = r_first + tl.arange(0, ROWS)
    r_ok = r < next_n
    if LENS_PER_ROW:
        limit = tl.load(lens_ptr + b * stride_len_b + r * stride_len_n, mask=r_ok, other=0).to(tl.int64)
    else:
        limit = tl.load(lens_ptr + b * stride_len_b).to(tl.int64) - next_n + r + 1
    # (int64 from a tensor: a launch specialises a table_width of 1 into a Python int)
    cap = tl.full([], PAGE_SIZE, tl.int64) * table_width
    limit = tl.where(r_ok, tl.minimum(limit, cap), 0)
    reach = tl.max(limit, axis=0)
    out_rows = out_ptr + (b * next_n + r) * stride_o
    bt_row = bt_ptr + b * stride_bt_b
    for t in range(tiles):
        cols = (tl.program_id(1) * tiles + t) * BLOCK_K + tl.arange(0, BLOCK_K)
        cols64 = cols.to(tl.int64)
        wanted = cols64 < reach
        page = tl.load(bt_row + (cols // PAGE_SIZE) * stride_bt_w, mask=wanted, other=-1).to(tl.int64)
        live = wanted & (page >= 0) & (page < num_pages)
        slot = cols % PAGE_SIZE
        if BLOCK_D == D:
            k_mask = live[:, None]
        else:
            k_mask = live[:, None] & (d < D)[None, :]
        k = tl.load(kv_ptr + page[:, None] * stride_page + (slot * key_stride)[:, None] + d[None, :], mask=k_mask,
                    other=0.0)
        s = tl.dot(q, tl.trans(_dot_operand(k, DOT)), out_dtype=tl.float32, input_precision="ieee")
        s = tl.maximum(s, 0.0) * w[:, None]
        logit = tl.sum(tl.reshape(s, [ROWS, BLOCK_H, BLOCK_K]), axis=1)
        scale = tl.load(scale_ptr + page * stride_page_f32 + scale_base + slot * scale_stride, mask=live, other=0.0)
        seen = live[None, :] & (cols64[None, :] < limit[:, None])
        out = tl.where(seen, logit * scale[None, :], FILL)
        tl.store(out_rows[:, None] + cols64[None, :], out, mask=r_ok[:, None] & (cols64 < out_cols)[None, :])


# ---------------------------------------------------------------------------------------------
# XPU compile variants (triton-xpu 3.3 -> SPIR-V -> native through ocloc: .ci/xpu_compile_check.py)
# ---------------------------------------------------------------------------------------------

#: the Intel tiles as kernel constexprs and launch options (0 B spilled on pvc and bmg at 256 GRF).
#: The ragged kernel spills (1-15 KB a thread) once a sub-group's share of the score tile passes 128
#: elements (64 x 64 on 8 or 16 warps, 32 x 64 on 8, 128 x 64 or 64 x 128 on 32): 64 x 64 on 32
#: warps is the largest that does not
_XPU_RAGGED = dict(BLOCK_Q=64, BLOCK_K=64, num_warps=32, num_stages=2)
_XPU_PAGED = dict(BLOCK_K=64, num_warps=8, num_stages=1)


def _register_compile_variants():
    ragged = dict(
        q_ptr="*fp8e4nv", stride_q_n="i64", stride_q_h="i32", k_ptr="*fp8e4nv", stride_k="i32",
        k_scale_ptr="*fp32", stride_kscale="i32", w_ptr="*fp32", stride_w_n="i32", stride_w_h="i32",
        ks_ptr="*i32", stride_ks="i32", ke_ptr="*i32", stride_ke="i32", out_ptr="*fp32", stride_o="i64",
        n_q="i32", n_k="i32", num_heads="i32", FILL=0.0, D=128, BLOCK_D=128, DOT="bf16",
        BLOCK_Q=_XPU_RAGGED["BLOCK_Q"], BLOCK_K=_XPU_RAGGED["BLOCK_K"],
    )
    opts = dict(dots=1, op="mqa_logits", num_warps=_XPU_RAGGED["num_warps"], num_stages=_XPU_RAGGED["num_stages"],
                grf_mode=_device.xpu_large_grf_mode())
    register_xpu_compile(_mqa_logits_kernel, "D128,bf16dot,BQ64xBK64,w32", ragged, **opts)
    register_xpu_compile(_mqa_logits_kernel, "D128,bf16dot,BQ64xBK64,w32,clean", {**ragged, "FILL": float("-inf")}, **opts)
    paged = dict(
        q_ptr="*fp8e4nv", stride_q_b="i32", stride_q_n="i32", stride_q_h="i32", kv_ptr="*fp8e4nv", scale_ptr="*fp32",
        stride_page="i64", stride_page_f32="i64", key_stride="i32", scale_base="i32", scale_stride="i32",
        num_pages="i32", w_ptr="*fp32", stride_w_n="i32", stride_w_h="i32", lens_ptr="*i32", stride_len_b="i32",
        stride_len_n="i32", bt_ptr="*i32", stride_bt_b="i32", stride_bt_w="i32", table_width="i32",
        out_ptr="*fp32", stride_o="i64", out_cols="i32", next_n="i32", num_heads="i32", tiles="i32",
        FILL=float("-inf"), PAGE_SIZE=64, LENS_PER_ROW=False, D=128, BLOCK_D=128, BLOCK_H=64, ROWS=1,
        BLOCK_K=_XPU_PAGED["BLOCK_K"], DOT="bf16",
    )
    opts = dict(dots=1, op="paged_mqa_logits", num_warps=_XPU_PAGED["num_warps"], num_stages=_XPU_PAGED["num_stages"],
                grf_mode=_device.xpu_large_grf_mode())
    register_xpu_compile(_paged_mqa_logits_kernel, "H64,D128,P64,next_n1,bf16dot,BK64", paged, **opts)
    register_xpu_compile(_paged_mqa_logits_kernel, "H64,D128,P64,next_n2,bf16dot,BK64",
                         {**paged, "ROWS": 2, "LENS_PER_ROW": True}, **opts)


_register_compile_variants()


# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------


def _dot_kind(device: torch.device) -> str:
    """The dot operands' dtype: fp8 where the tensor cores take it (NVIDIA sm_89+), bf16 on other
    GPUs, fp32 under the interpreter."""
    backend = _device.backend()
    if backend == "interpreter":
        return "fp32"
    if _device.cuda_fp8(device):
        return "fp8"
    return "bf16"


def _ragged_heuristic() -> dict:
    backend = _device.backend()
    if backend == "interpreter":
        return dict(BLOCK_Q=16, BLOCK_K=16, num_warps=4, num_stages=1)
    if backend == "xpu":
        return dict(_XPU_RAGGED, grf_mode="256")
    # NVIDIA (untimed first choice; ptxas sm_90a at D = 128, fp8 dots): 64 x 128 on 4 warps, 255
    # registers, 0 spill; 128 x 128 on 8 warps spills 1.2 KB a thread, 64 x 256 on 8 warps fits (253)
    return dict(BLOCK_Q=64, BLOCK_K=128, num_warps=4, num_stages=3)


def _paged_heuristic() -> dict:
    backend = _device.backend()
    if backend == "interpreter":
        return dict(BLOCK_K=16, num_warps=4, num_stages=1, programs_per_unit=1)
    if backend == "xpu":
        return dict(_XPU_PAGED, grf_mode="256", programs_per_unit=8)
    # NVIDIA (untimed first choice; ptxas sm_90a, 64 heads of 128, fp8 dots, 0 spill): 64 keys a tile,
    # 4 warps for one query row (246 registers), 8 for two (160); num_warps 0 = by rows
    return dict(BLOCK_K=64, num_warps=0, num_stages=2, programs_per_unit=8)


def _fp8(name: str, t, ndim: int) -> torch.Tensor:
    """An fp8 e4m3 input (a uint8 view is taken as its bytes) as float8_e4m3fn, last dim contiguous."""
    check_tensor(name, t, dtypes=FP8_INPUT_DTYPES, ndim=ndim)
    if t.dtype == torch.uint8:
        t = t.view(torch.float8_e4m3fn)
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _check_head_dim(name: str, d: int) -> None:
    if d % 16 or not 16 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: head dim D must be a multiple of 16 from 16 to {MAX_HEAD_DIM}, got {d}")


def fp8_mqa_logits(
    q_fp8: torch.Tensor,
    kv_fp8: tuple,
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    clean_logits: bool = False,
) -> torch.Tensor:
    """Indexer logits of every query row against a ragged range of contiguous fp8 keys
    (DeepSeek-V3.2's lightning indexer, prefill; DeepGEMM / sgl-kernel-xpu ``fp8_mqa_logits``).

    ``logits[i, j] = k_scale[j] * sum_h relu(q[i, h] . k[j]) * weights[i, h]`` for
    ``ks[i] <= j < ke[i]`` (fp32 accumulation of the fp8 products); every other position holds
    0, or ``-inf`` with ``clean_logits``.

    Parameters
    ----------
    q_fp8 : torch.Tensor
        ``[Nq, H, D]`` fp8 e4m3 queries, ``torch.float8_e4m3fn`` or their ``uint8`` bytes. ``D`` a
        multiple of 16 up to 512 (DeepSeek: ``H`` 64, ``D`` 128). Any row / head strides.
    kv_fp8 : tuple[torch.Tensor, torch.Tensor]
        ``(k_fp8, k_scale)``: ``[Nk, D]`` fp8 e4m3 keys (or ``uint8`` bytes; any row stride) and
        ``[Nk]`` fp32 per-key dequantisation scales (``[Nk, 1]`` accepted).
    weights : torch.Tensor
        ``[Nq, H]`` float (fp32 upstream) per-row head weights. Any strides.
    ks, ke : torch.Tensor
        ``[Nq]`` int32 (or int64): row ``i`` sees keys ``[ks[i], ke[i])``. Any values: ranges are
        cut to ``[0, Nk)``, and ``ks[i] >= ke[i]`` sees nothing (a whole row of fill values).
    clean_logits : bool
        ``False``: unseen positions hold 0 (sgl-kernel-xpu's result); ``True``: ``-inf``
        (DeepGEMM's and vllm-xpu-kernels' cleaned logits, ready for a top-k).

    Returns
    -------
    torch.Tensor
        ``[Nq, Nk]`` fp32 logits, contiguous. A key or scale no row sees may hold NaN or inf: it
        never reaches the output. Relu of a NaN product in a seen position is backend-defined.

    Nothing is read outside the given tensors whatever the values of ``ks`` / ``ke``, and nothing
    here reads device values on the host (graph-capturable).
    """
    if not isinstance(kv_fp8, (tuple, list)) or len(kv_fp8) != 2:
        raise TypeError(f"kv_fp8 must be a (k_fp8, k_scale) pair, got {type(kv_fp8).__name__}")
    k_fp8, k_scale = kv_fp8
    q = _fp8("q_fp8", q_fp8, 3)
    k = _fp8("k_fp8", k_fp8, 2)
    n_q, num_heads, d = q.shape
    n_k = k.shape[0]
    _check_head_dim("q_fp8", d)
    if k.shape[1] != d:
        raise ValueError(f"k_fp8 rows hold {k.shape[1]} channels but q_fp8's head dim D is {d}")
    check_tensor("k_scale", k_scale, dtypes=(torch.float32,), ndim=(1, 2))
    if k_scale.shape[0] != n_k or (k_scale.dim() == 2 and k_scale.shape[1] != 1):
        raise ValueError(f"k_scale must have shape [Nk] = [{n_k}] (or [Nk, 1]), got {list(k_scale.shape)}")
    check_tensor("weights", weights, dtypes=FLOAT_DTYPES, shape=(n_q, num_heads))
    check_tensor("ks", ks, dtypes=INDEX_DTYPES, shape=(n_q,))
    check_tensor("ke", ke, dtypes=INDEX_DTYPES, shape=(n_q,))
    clean_logits = check_bool(clean_logits, "clean_logits")
    device = check_same_device(q_fp8=q, k_fp8=k, k_scale=k_scale, weights=weights, ks=ks, ke=ke)

    config = tune.lookup("mqa_logits", {"h": tune.pow2_bucket(max(num_heads, 1), 16, 256), "d": d},
                         _ragged_heuristic(), device=device)
    block_q = config_pow2("mqa_logits", "BLOCK_Q", config["BLOCK_Q"])
    block_k = config_pow2("mqa_logits", "BLOCK_K", config["BLOCK_K"])
    fill = -math.inf if clean_logits else 0.0
    out = torch.empty((n_q, n_k), dtype=torch.float32, device=device)
    if n_q == 0 or n_k == 0:
        return out
    q_blocks = cdiv(n_q, block_q)
    if q_blocks > MAX_GRID_DIM_1:
        raise ValueError(f"q_fp8 has too many rows for one launch: {n_q} rows in blocks of {block_q} "
                         f"need {q_blocks} programs (at most {MAX_GRID_DIM_1})")
    # the kernel's in-block offsets are 32-bit (block bases 64-bit)
    if max(block_q * max(q.stride(0), weights.stride(0), n_k), block_k * k.stride(0)) >= 2**31:
        raise ValueError(f"fp8_mqa_logits: rows too wide for 32-bit in-block offsets (Nk = {n_k}, q row stride "
                         f"{q.stride(0)}, k row stride {k.stride(0)}; at most (2^31 - 1) / {block_q} elements a row)")
    dot = _dot_kind(device)
    with device_guard(device):
        _mqa_logits_kernel[(cdiv(n_k, block_k), q_blocks)](
            q, q.stride(0), q.stride(1),
            k, k.stride(0),
            k_scale, k_scale.stride(0),
            weights, weights.stride(0), weights.stride(1),
            ks, ks.stride(0),
            ke, ke.stride(0),
            out, out.stride(0),
            n_q, n_k, num_heads,
            FILL=fill, D=d, BLOCK_D=max(32, next_power_of_2(d)), BLOCK_Q=block_q, BLOCK_K=block_k, DOT=dot,
            **tune.launch_options(config),
        )
    return out


def _paged_cache_views(kv_cache: torch.Tensor, d: int, layout: str):
    """``kv_cache`` ``[pages, page_size, 1, D + 4]`` as (fp8 bytes, fp32 words, page stride in
    bytes and in words, key stride, scale base, scale stride)."""
    check_tensor("kv_cache", kv_cache, dtypes=FP8_INPUT_DTYPES, ndim=4)
    pages, page_size, one, width = kv_cache.shape
    if one != 1 or width != d + 4:
        raise ValueError(f"kv_cache must have shape [pages, page_size, 1, D + 4] = [*, *, 1, {d + 4}], "
                         f"got {list(kv_cache.shape)}")
    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"kv_cache: page_size (dim 1) must be a power of two, got {page_size}")
    raw = kv_cache.view(torch.uint8)
    page_bytes = page_size * (d + 4)
    # a page's bytes must be contiguous (the layouts address them as one run); pages may be apart
    if pages > 0 and (raw.stride(3) != 1 or (page_size > 1 and raw.stride(1) != d + 4)):
        raise ValueError(f"kv_cache: each page's bytes must be contiguous (strides [*, {d + 4}, *, 1]), "
                         f"got strides {list(raw.stride())}")
    stride_page = raw.stride(0) if pages > 1 else page_bytes
    if stride_page % 4 or raw.storage_offset() % 4:
        raise ValueError("kv_cache: pages must start 4-byte aligned (their fp32 scales are read as words): "
                         f"page stride {stride_page} bytes, storage offset {raw.storage_offset()}")
    flat = torch.as_strided(raw, (pages, page_bytes), (stride_page, 1))
    words = flat.view(torch.float32)
    if layout == "page":  # page_size keys of D bytes, then page_size fp32 scales (DeepGEMM)
        key_stride, scale_base, scale_stride = d, page_size * d // 4, 1
    else:  # per token: its D key bytes, then its fp32 scale
        key_stride, scale_base, scale_stride = d + 4, d // 4, (d + 4) // 4
    return flat.view(torch.float8_e4m3fn), words, page_size, stride_page, stride_page // 4, key_stride, scale_base, \
        scale_stride


def fp8_paged_mqa_logits(
    q_fp8: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata=None,
    max_seq_len: int = 0,
    clean_logits: bool = False,
    *,
    kv_layout: str = "page",
) -> torch.Tensor:
    """Indexer logits of each request's ``next_n`` newest query rows against its keys in a paged
    fp8 indexer cache (DeepSeek-V3.2's lightning indexer, decode / MTP verify; DeepGEMM
    ``fp8_paged_mqa_logits``).

    Row ``b * next_n + r`` (request ``b``, query row ``r``) sees the keys at positions ``j`` below
    ``lim = seq_lens[b] - next_n + r + 1`` (``seq_lens [B]``; the causal rule of DeepGEMM and
    vllm-xpu-kernels) or ``lim = seq_lens[b, r]`` (``seq_lens [B, next_n]``)::

        logits[b * next_n + r, j] = k_scale[j] * sum_h relu(q[b, r, h] . k[j]) * weights[b * next_n + r, h]

    where key ``j`` of request ``b`` lies on page ``block_tables[b, j // page_size]``, slot
    ``j % page_size``. Every other position holds 0, or ``-inf`` with ``clean_logits``; among them
    the positions past what the table covers (``j >= block_tables.shape[1] * page_size``) and
    those on a page id outside ``[0, pages)`` (never followed).

    Parameters
    ----------
    q_fp8 : torch.Tensor
        ``[B, next_n, H, D]`` (or ``[B, H, D]``: ``next_n = 1``) fp8 e4m3 queries, as
        ``torch.float8_e4m3fn`` or ``uint8`` bytes; ``H`` up to 256, ``D`` a multiple of 16 up to
        512 (DeepSeek: 64 heads of 128).
    kv_cache : torch.Tensor
        ``[pages, page_size, 1, D + 4]`` ``uint8`` (or an fp8 view of the same bytes), a power-of-two
        ``page_size``; each page's ``page_size * (D + 4)`` bytes contiguous and 4-byte aligned
        (pages may lie apart). ``kv_layout="page"`` (DeepGEMM, vllm-xpu-kernels, sglang's indexer
        pool): the page's ``page_size`` keys of ``D`` fp8 bytes, then its ``page_size`` fp32
        scales (the ``[.., 1, D + 4]`` shape only sizes the page). ``kv_layout="token"``
        (sgl-kernel-xpu's SYCL op): each token's ``D`` key bytes followed by its fp32 scale. The
        two agree at ``page_size`` 1.
    weights : torch.Tensor
        ``[B * next_n, H]`` float (fp32 upstream) head weights per query row.
    seq_lens : torch.Tensor
        ``[B]`` (``[B, 1]`` taken as ``[B]``) or ``[B, next_n]`` int32 (or int64) lengths, any
        values: a length past the table counts only the positions it covers; 0 or less sees
        nothing.
    block_tables : torch.Tensor
        ``[B, max_pages]`` int32 (or int64) page ids, any values (an id outside the pool is never
        followed: its positions get the fill value).
    schedule_metadata : torch.Tensor, optional
        DeepGEMM's scheduling hint (``get_paged_mqa_logits_metadata``): accepted and ignored (the
        kernel splits the work by itself).
    max_seq_len : int
        Columns of the output (positions ``0 .. max_seq_len - 1``), >= 0.
    clean_logits : bool
        ``False``: unseen positions hold 0; ``True``: ``-inf`` (DeepGEMM's cleaned logits,
        vllm-xpu-kernels' result).
    kv_layout : str
        ``"page"`` (default) or ``"token"``, see ``kv_cache``.

    Returns
    -------
    torch.Tensor
        ``[B * next_n, max_seq_len]`` fp32, contiguous. A key, scale or query a row does not see may
        hold NaN or inf: it never reaches that row.

    Nothing is read outside the given tensors whatever the values of ``seq_lens`` and
    ``block_tables``, and nothing here reads device values on the host (graph-capturable).
    """
    del schedule_metadata  # a scheduling hint for DeepGEMM's persistent kernel; not needed here
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    check_tensor("q_fp8", q_fp8, dtypes=FP8_INPUT_DTYPES, ndim=(3, 4))
    q = _fp8("q_fp8", q_fp8 if q_fp8.dim() == 4 else q_fp8.unsqueeze(1), 4)
    batch, next_n, num_heads, d = q.shape
    _check_head_dim("q_fp8", d)
    if num_heads > MAX_PAGED_HEADS:
        raise ValueError(f"q_fp8: at most {MAX_PAGED_HEADS} heads, got {num_heads}")
    kv, words, page_size, stride_page, stride_page_f32, key_stride, scale_base, scale_stride = \
        _paged_cache_views(kv_cache, d, kv_layout)
    num_pages = kv.shape[0]
    check_tensor("weights", weights, dtypes=FLOAT_DTYPES, shape=(batch * next_n, num_heads))
    check_tensor("seq_lens", seq_lens, dtypes=INDEX_DTYPES, ndim=(1, 2))
    if seq_lens.shape[0] != batch or (seq_lens.dim() == 2 and seq_lens.shape[1] not in (1, next_n)):
        raise ValueError(f"seq_lens must have shape [B] = [{batch}] or [B, next_n] = [{batch}, {next_n}], "
                         f"got {list(seq_lens.shape)}")
    per_row = seq_lens.dim() == 2 and seq_lens.shape[1] == next_n and next_n > 1
    check_tensor("block_tables", block_tables, dtypes=INDEX_DTYPES, ndim=2)
    if block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must have {batch} rows (one per request), got {list(block_tables.shape)}")
    max_seq_len = check_int(max_seq_len, "max_seq_len", minimum=0)
    clean_logits = check_bool(clean_logits, "clean_logits")
    device = check_same_device(q_fp8=q, kv_cache=kv_cache, weights=weights, seq_lens=seq_lens,
                               block_tables=block_tables)

    fill = -math.inf if clean_logits else 0.0
    out = torch.empty((batch * next_n, max_seq_len), dtype=torch.float32, device=device)
    if out.numel() == 0:
        return out
    if num_pages == 0 or block_tables.shape[1] == 0:  # no key can be read: every position unseen
        return out.fill_(fill)
    config = tune.lookup("paged_mqa_logits", {"h": tune.pow2_bucket(num_heads, 16, 256), "d": d,
                                              "next_n": tune.pow2_bucket(next_n, 1, 8)},
                         _paged_heuristic(), device=device)
    block_k = config_pow2("mqa_logits", "BLOCK_K", config["BLOCK_K"])
    block_h = max(16, next_power_of_2(num_heads))
    rows = max(1, min(next_power_of_2(next_n), 128 // block_h))
    row_programs = batch * cdiv(next_n, rows)
    n_tiles = cdiv(max_seq_len, block_k)
    # enough programs to fill the device a few times over, each covering whole key tiles
    target = max(1, int(config.get("programs_per_unit", 8)) * _device.compute_units(device))
    tiles = max(1, min(n_tiles, (n_tiles * row_programs) // target))
    chunks = cdiv(n_tiles, tiles)
    if chunks > MAX_GRID_DIM_1:
        tiles = cdiv(n_tiles, MAX_GRID_DIM_1)
        chunks = cdiv(n_tiles, tiles)
    lens_stride_n = seq_lens.stride(1) if per_row else 0
    launch = {k: v for k, v in config.items() if k != "programs_per_unit"}
    if not launch.get("num_warps"):
        launch["num_warps"] = 4 if rows * block_h <= 64 else 8
    with device_guard(device):
        _paged_mqa_logits_kernel[(row_programs, chunks)](
            q, q.stride(0), q.stride(1), q.stride(2),
            kv, words, stride_page, stride_page_f32, key_stride, scale_base, scale_stride, num_pages,
            weights, weights.stride(0), weights.stride(1),
            seq_lens, seq_lens.stride(0), lens_stride_n,
            block_tables, block_tables.stride(0), block_tables.stride(1), block_tables.shape[1],
            out, out.stride(0), max_seq_len, next_n, num_heads, tiles,
            FILL=fill, PAGE_SIZE=page_size, LENS_PER_ROW=per_row, D=d, BLOCK_D=max(32, next_power_of_2(d)),
            BLOCK_H=block_h, ROWS=rows, BLOCK_K=block_k, DOT=_dot_kind(device),
            **tune.launch_options(launch),
        )
    return out


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    """DeepGEMM's ``get_paged_mqa_logits_metadata``: the scheduling hint its paged kernel takes.

    Parameters
    ----------
    context_lens : torch.Tensor
        ``[B]`` or ``[B, next_n]`` int32 (or int64) lengths, as passed to ``fp8_paged_mqa_logits``.
    block_kv : int
        Keys per cache page (DeepGEMM: 64), >= 1.
    num_sms : int
        Compute units to schedule for, >= 1.

    Returns
    -------
    torch.Tensor
        ``[num_sms + 1, 2]`` int32 zeros on ``context_lens``' device: DeepGEMM's shape, so callers
        that allocate, pass or capture it keep working. ``fp8_paged_mqa_logits`` ignores it (its
        grid is fixed by the shapes alone), so no value is computed and nothing syncs.
    """
    check_tensor("context_lens", context_lens, dtypes=INDEX_DTYPES, ndim=(1, 2))
    check_int(block_kv, "block_kv", minimum=1)
    num_sms = check_int(num_sms, "num_sms", minimum=1)
    device = check_same_device(context_lens=context_lens)
    return torch.zeros((num_sms + 1, 2), dtype=torch.int32, device=device)
