"""In-call KV append of ``flash_attn_with_kvcache`` (FlashAttention-3's AppendKV): rotary
embedding of the new keys and of the queries, the new keys / values written into the cache, and
the cache layout the attention kernel then reads (page table and lengths).

Two kernels, both graph-safe (no host sync, every device index untrusted):

* ``_append_kv_kernel``: new token ``i`` of request ``b`` goes to position
  ``cache_seqlens[b] + i`` of cache row ``cache_batch_idx[b]`` (``b`` without it): through the
  page table of a paged cache, or row-major in a contiguous ``[B_cache, S, H_kv, D]`` cache. The
  key is rotated first (position ``rotary_seqlens[b] + i``) and, into an fp8 cache, stored as
  ``x / descale`` saturated to the fp8 range. A token whose position is negative or past the
  row's capacity (page-table width x page size, or ``S``), whose cache row lies outside the
  cache / table, or whose page id lies outside the pool writes nothing.
* ``_rotary_kernel``: rotated copy of ``q`` (query ``i`` of request ``b`` at position
  ``rotary_seqlens[b] + i`` when causal or local, ``rotary_seqlens[b]`` otherwise).

Rotary: the first ``rotary_dim = 2 * rotary_cos.shape[1]`` channels rotate, pairs ``(2j, 2j+1)``
(interleaved, GPT-J) or ``(j, j + rotary_dim / 2)`` (GPT-NeoX), in fp32:
``x' = x * cos - x_pair * sin`` for the first of a pair, ``x * cos + x_pair * sin`` for the
second. A position outside ``[0, seqlen_ro)`` is not rotated (cos 1, sin 0) rather than read out
of bounds.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import device as _device
from .._common import (FLOAT_DTYPES, FP8_DTYPES, cdiv, check_bool, check_int, check_page_size, check_same_device,
                       check_tensor, check_window, device_guard, dtype_names, fp8_cast, kernel_quantises,
                       next_power_of_2, register_xpu_compile)
from .kv_cache import _store_rows, request_of
from .paged_kernel import _PER_REQUEST, _SEARCH, _UNIFORM
from .paged_launch import _as_scale, _check_heads, _launch, _validate

# elements of one [BLOCK_T, BLOCK_D] tile: the rotation holds four fp32 tiles (x, its pair, cos,
# sin) and gathers through 64-bit addresses; 8 x 128 spilled 384-576 B a thread on PVC / BMG (the
# q rotation 1280 B on BMG at 128 GRF), 4 x 128 none
_TILE_ELEMENTS = 512
_MAX_BLOCK_D = 128  # widest column chunk (rows loop over chunks)


@triton.jit
def _rows_of_requests(t, cu_ptr, batch, search_steps, seq_len, UNIFORM: tl.constexpr, BLOCK_T: tl.constexpr):
    """(request, index in it, whether the row belongs to one) of rows ``t``: ``seq_len`` rows a
    request (``UNIFORM``) or the requests' offsets ``cu [batch + 1]``."""
    if UNIFORM:
        b = t // seq_len
        i = t - b * seq_len
        ok = b < batch
    else:
        b, start, end = request_of(t, cu_ptr, batch, search_steps, BLOCK_T)
        i = t - start
        ok = (b < batch) & (start <= t) & (t < end)
    return b, i, ok


@triton.jit
def _rotated(src, d, rows_ok, width, pos, pos_ok, cos_ptr, sin_ptr, stride_cs, rotary_half,
             INTERLEAVED: tl.constexpr):
    """fp32 ``[BLOCK_T, BLOCK_D]`` channels ``d`` of the rows at ``src`` (pointers to channel 0)
    with the first ``2 * rotary_half`` rotated at positions ``pos`` (``pos_ok`` false: unrotated)."""
    in_width = rows_ok[:, None] & (d[None, :] < width)
    x = tl.load(src[:, None] + d[None, :], mask=in_width, other=0.0).to(tl.float32)
    if INTERLEAVED:
        pair = d ^ 1
        j = d // 2
        first = d % 2 == 0
    else:
        first = d < rotary_half
        pair = tl.where(first, d + rotary_half, d - rotary_half)
        j = tl.where(first, d, d - rotary_half)
    rot = (d < 2 * rotary_half)[None, :] & in_width & pos_ok[:, None]
    angle = pos[:, None] * stride_cs + j[None, :]
    cos = tl.load(cos_ptr + angle, mask=rot, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + angle, mask=rot, other=0.0).to(tl.float32)
    x_pair = tl.load(src[:, None] + pair[None, :], mask=rot, other=0.0).to(tl.float32)
    return x * cos + tl.where(first[None, :], -x_pair, x_pair) * sin


@triton.jit
def _rotary_kernel(
    src_ptr, stride_src_t, stride_src_h, dst_ptr, stride_dst_t, stride_dst_h,
    cos_ptr, sin_ptr, stride_cs, seqlen_ro, rotary_half, base_ptr,
    cu_ptr, num_rows, batch, search_steps, seq_len, head_dim,
    POSITIONAL: tl.constexpr, UNIFORM: tl.constexpr, INTERLEAVED: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program (row tile, head): ``dst`` rows = ``src`` rows rotated at their request's position
    (every row below ``num_rows`` is written; a row of no request is copied unrotated)."""
    h = tl.program_id(1).to(tl.int64)
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    rows_ok = t < num_rows
    b, i, in_request = _rows_of_requests(t, cu_ptr, batch, search_steps, seq_len, UNIFORM, BLOCK_T)
    pos = tl.load(base_ptr + b, mask=in_request, other=0).to(tl.int64)
    if POSITIONAL:
        pos += i
    pos_ok = in_request & (pos >= 0) & (pos < seqlen_ro)
    pos = tl.where(pos_ok, pos, 0)
    src = src_ptr + t * stride_src_t + h * stride_src_h
    dst = dst_ptr + t * stride_dst_t + h * stride_dst_h
    for d0 in range(0, head_dim, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        y = _rotated(src, d, rows_ok, head_dim, pos, pos_ok, cos_ptr, sin_ptr, stride_cs, rotary_half, INTERLEAVED)
        tl.store(dst[:, None] + d[None, :], y.to(dst_ptr.dtype.element_ty), mask=rows_ok[:, None] & (d[None, :] < head_dim))


@triton.jit
def _append_kv_kernel(
    k_ptr, stride_k_t, stride_k_h, v_ptr, stride_v_t, stride_v_h,
    k_cache_ptr, stride_kc_page, stride_kc_tok, stride_kc_h,
    v_cache_ptr, stride_vc_page, stride_vc_tok, stride_vc_h,
    table_ptr, stride_pt_b, table_width, table_rows, page_size, num_pages,
    seqlens_ptr, batch_idx_ptr, cu_ptr, num_rows, batch, search_steps, seq_len,
    cos_ptr, sin_ptr, stride_cs, seqlen_ro, rotary_half, base_ptr,
    k_scale_ptr, stride_ks_b, stride_ks_h, v_scale_ptr, stride_vs_b, stride_vs_h,
    head_dim, head_dim_v,
    PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, UNIFORM: tl.constexpr, ROTARY: tl.constexpr,
    INTERLEAVED: tl.constexpr, QUANT: tl.constexpr, FP8_MAX: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, INTEL_GPU: tl.constexpr = False,
):
    """Program (new-token tile, KV head): the tile's keys (rotated) and values into the cache.
    ``INTEL_GPU``: e4m3 encoded in integer arithmetic (``fp8_cast``; the launcher sets it on XPU)."""
    h = tl.program_id(1).to(tl.int64)
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    b, i, ok = _rows_of_requests(t, cu_ptr, batch, search_steps, seq_len, UNIFORM, BLOCK_T)
    ok = ok & (t < num_rows)
    pos = tl.load(seqlens_ptr + b, mask=ok, other=0).to(tl.int64) + i
    row = b
    if HAS_BATCH_IDX:
        row = tl.load(batch_idx_ptr + b, mask=ok, other=0).to(tl.int64)
    ok = ok & (row >= 0) & (row < table_rows) & (pos >= 0)
    if PAGED:
        col = pos // page_size
        ok = ok & (col < table_width)
        page = tl.load(table_ptr + tl.where(ok, row * stride_pt_b + col, 0), mask=ok, other=0).to(tl.int64)
    else:  # contiguous cache: one "page" of page_size = S tokens a row
        ok = ok & (pos < page_size)
        page = row
    ok = ok & (page >= 0) & (page < num_pages)
    page = tl.where(ok, page, 0)
    pos = tl.where(ok, pos, 0)
    k_row = page * stride_kc_page + (pos % page_size) * stride_kc_tok + h * stride_kc_h
    v_row = page * stride_vc_page + (pos % page_size) * stride_vc_tok + h * stride_vc_h
    k_scale = tl.full([BLOCK_T, 1], 1.0, tl.float32)
    v_scale = tl.full([BLOCK_T, 1], 1.0, tl.float32)
    if QUANT:
        k_scale = tl.load(k_scale_ptr + b * stride_ks_b + h * stride_ks_h, mask=ok, other=1.0).to(tl.float32)[:, None]
        v_scale = tl.load(v_scale_ptr + b * stride_vs_b + h * stride_vs_h, mask=ok, other=1.0).to(tl.float32)[:, None]
    if ROTARY:
        r_pos = tl.load(base_ptr + b, mask=ok, other=0).to(tl.int64) + i
        r_ok = ok & (r_pos >= 0) & (r_pos < seqlen_ro)
        r_pos = tl.where(r_ok, r_pos, 0)
        src = k_ptr + t * stride_k_t + h * stride_k_h
        for d0 in range(0, head_dim, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            x = _rotated(src, d, ok, head_dim, r_pos, r_ok, cos_ptr, sin_ptr, stride_cs, rotary_half, INTERLEAVED)
            if QUANT:
                x = tl.minimum(tl.maximum(x / k_scale, -FP8_MAX), FP8_MAX)
            tl.store(k_cache_ptr + k_row[:, None] + d[None, :], fp8_cast(x, k_cache_ptr, INTEL_GPU),
                     mask=ok[:, None] & (d[None, :] < head_dim))
    else:
        _store_rows(k_ptr + h * stride_k_h, stride_k_t, t, k_cache_ptr, k_row, ok, head_dim, k_scale,
                    BLOCK_D, QUANT, FP8_MAX, INTEL_GPU)
    _store_rows(v_ptr + h * stride_v_h, stride_v_t, t, v_cache_ptr, v_row, ok, head_dim_v, v_scale,
                BLOCK_D, QUANT, FP8_MAX, INTEL_GPU)


def _register_compile_variants() -> None:
    common = dict(
        stride_k_t="i64", stride_k_h="i32", stride_v_t="i64", stride_v_h="i32",
        stride_kc_page="i64", stride_kc_tok="i64", stride_kc_h="i32",
        stride_vc_page="i64", stride_vc_tok="i64", stride_vc_h="i32",
        table_ptr="*i32", stride_pt_b="i64", table_width="i32", table_rows="i32", page_size="i32", num_pages="i64",
        seqlens_ptr="*i32", batch_idx_ptr="*i32", cu_ptr="*i32", num_rows="i32", batch="i32", search_steps="i32",
        seq_len="i32", cos_ptr="*bf16", sin_ptr="*bf16", stride_cs="i32", seqlen_ro="i32", rotary_half="i32",
        base_ptr="*i32", k_scale_ptr="*fp32", stride_ks_b="i32", stride_ks_h="i32", v_scale_ptr="*fp32",
        stride_vs_b="i32", stride_vs_h="i32", head_dim="i32", head_dim_v="i32",
        PAGED=True, HAS_BATCH_IDX=False, UNIFORM=False, INTERLEAVED=False, BLOCK_T=4, BLOCK_D=128,
        INTEL_GPU=True,  # as the launcher sets it on XPU
    )
    register_xpu_compile(_append_kv_kernel, "append_kv bf16,D128,rotary", dict(
        common, k_ptr="*bf16", v_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16", ROTARY=True,
        QUANT=False, FP8_MAX=0.0), num_warps=4)
    register_xpu_compile(_append_kv_kernel, "append_kv bf16->fp8e4m3,D128,rotary", dict(
        common, k_ptr="*bf16", v_ptr="*bf16", k_cache_ptr="*fp8e4nv", v_cache_ptr="*fp8e4nv", ROTARY=True,
        QUANT=True, FP8_MAX=448.0), num_warps=4)
    # fp8 keys / values in the cache's dtype, copied (through fp8_cast's pass-through)
    register_xpu_compile(_append_kv_kernel, "append_kv fp8e4m3 copy,D128", dict(
        common, k_ptr="*fp8e4nv", v_ptr="*fp8e4nv", k_cache_ptr="*fp8e4nv", v_cache_ptr="*fp8e4nv", ROTARY=False,
        QUANT=False, FP8_MAX=0.0), num_warps=4)
    register_xpu_compile(_rotary_kernel, "append_kv rotary q bf16,D128", dict(
        src_ptr="*bf16", stride_src_t="i64", stride_src_h="i32", dst_ptr="*bf16", stride_dst_t="i64",
        stride_dst_h="i32", cos_ptr="*bf16", sin_ptr="*bf16", stride_cs="i32", seqlen_ro="i32", rotary_half="i32",
        base_ptr="*i32", cu_ptr="*i32", num_rows="i32", batch="i32", search_steps="i32", seq_len="i32",
        head_dim="i32", POSITIONAL=True, UNIFORM=False, INTERLEAVED=False, BLOCK_T=4, BLOCK_D=128), num_warps=4)


_register_compile_variants()


# ---- launchers ----


def _tile(width: int) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_D) of a row tile: a column chunk of up to 128, as many rows as fit."""
    block_d = min(next_power_of_2(max(width, 16)), _MAX_BLOCK_D)
    return max(1, min(16, _TILE_ELEMENTS // block_d)), block_d


class Rows:
    """Rows of a ragged tensor grouped by request: ``seq_len`` rows each (``cu`` None), or the
    offsets ``cu [batch + 1]`` int32."""

    def __init__(self, batch: int, num_rows: int, seq_len: int = 0, cu: torch.Tensor | None = None):
        self.batch, self.num_rows, self.seq_len, self.cu = batch, num_rows, seq_len, cu

    def args(self, placeholder: torch.Tensor) -> tuple:
        cu = self.cu if self.cu is not None else placeholder
        return cu, self.num_rows, self.batch, self.batch.bit_length(), max(self.seq_len, 1)

    def lengths(self, device) -> torch.Tensor:
        """``[batch]`` int32 rows of each request (a device op, no sync)."""
        if self.cu is None:
            return torch.full((self.batch,), self.seq_len, dtype=torch.int32, device=device)
        return (self.cu[1:] - self.cu[:-1]).to(torch.int32)


def rotate_rows(x: torch.Tensor, rows: Rows, cos: torch.Tensor, sin: torch.Tensor, base: torch.Tensor, *,
                positional: bool, interleaved: bool, out_dtype: torch.dtype) -> torch.Tensor:
    """A rotated copy ``[T, H, D]`` (``out_dtype``) of ``x [T, H, D]``: row ``i`` of request ``b`` at
    position ``base[b] + i`` (``positional``) or ``base[b]``."""
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if x.numel() == 0:
        return out
    block_t, block_d = _tile(x.shape[2])
    with device_guard(x.device):
        _rotary_kernel[(cdiv(x.shape[0], block_t), x.shape[1])](
            x, x.stride(0), x.stride(1), out, out.stride(0), out.stride(1),
            cos, sin, cos.stride(0), cos.shape[0], cos.shape[1], base, *rows.args(base), x.shape[2],
            POSITIONAL=positional, UNIFORM=rows.cu is None, INTERLEAVED=interleaved,
            BLOCK_T=block_t, BLOCK_D=block_d, num_warps=4,
        )
    return out


def _interpreter_quantised(x: torch.Tensor, scale, rows: Rows, fmt) -> torch.Tensor:
    """Interpreter only (its fp32 -> fp8 cast is wrong, see kv_cache_store._store_mode): ``x`` quantised
    by torch with the kernel's formula, ``clamp(x / scale[b, h])`` in fp32, then the cast."""
    req = torch.repeat_interleave(torch.arange(rows.batch, device=x.device), rows.lengths(x.device).long().clamp(min=0))
    req = torch.cat([req, req.new_zeros(max(0, x.shape[0] - req.shape[0]))])[: x.shape[0]]
    s = scale.to(torch.float32)[req.clamp(max=max(rows.batch - 1, 0))][:, :, None] if rows.batch else 1.0
    fp8_max = torch.finfo(fmt).max
    return (x.float() / s).clamp(-fp8_max, fp8_max).to(fmt)


def append_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *, rows: Rows,
              page_table: torch.Tensor | None, cache_seqlens: torch.Tensor, cache_batch_idx: torch.Tensor | None,
              rotary: tuple | None, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> None:
    """Write the new ``k [T, H_kv, D]`` / ``v [T, H_kv, Dv]`` into the cache in place (arguments
    checked by the caller). ``rotary``: ``(cos, sin, base [B] int32, interleaved)`` or None.
    ``k_scale`` / ``v_scale``: fp32 ``[B, H_kv]`` (any strides) descales of an fp8 cache, or None.
    Into an fp8 cache, a ``k`` already in the cache's dtype is copied as is."""
    num_rows, heads = k.shape[0], k.shape[1]
    if num_rows == 0 or heads == 0 or rows.batch == 0 or k_cache.numel() == 0:
        return
    paged = page_table is not None
    fmt = k_cache.dtype if k_cache.dtype in FP8_DTYPES else None
    quant = fmt is not None and k.dtype != fmt
    intel = _device.intel_gpu()
    if quant and not kernel_quantises(fmt):  # torch quantises, the kernel copies fp8 bytes
        if rotary is not None:
            cos, sin, base, interleaved = rotary
            k = rotate_rows(k, rows, cos, sin, base, positional=True, interleaved=interleaved, out_dtype=torch.float32)
            rotary = None
        k, v = _interpreter_quantised(k, k_scale, rows, fmt), _interpreter_quantised(v, v_scale, rows, fmt)
        quant = False
    cos, sin, base, interleaved = rotary if rotary is not None else (cache_seqlens, cache_seqlens, cache_seqlens, False)
    if paged:
        table, table_args = page_table, (page_table.stride(0), page_table.shape[1], page_table.shape[0],
                                         k_cache.shape[1], k_cache.shape[0])
    else:
        table, table_args = cache_seqlens, (0, 1, k_cache.shape[0], k_cache.shape[1], k_cache.shape[0])
    ks = k_scale if quant else cache_seqlens
    vs = v_scale if quant else cache_seqlens
    block_t, block_d = _tile(max(k.shape[2], v.shape[2]))
    with device_guard(k.device):
        _append_kv_kernel[(cdiv(num_rows, block_t), heads)](
            k, k.stride(0), k.stride(1), v, v.stride(0), v.stride(1),
            k_cache, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache, v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            table, *table_args,
            cache_seqlens, cache_batch_idx if cache_batch_idx is not None else cache_seqlens, *rows.args(cache_seqlens),
            cos, sin, cos.stride(0), cos.shape[0] if rotary is not None else 0,
            cos.shape[1] if rotary is not None and cos.dim() == 2 else 0, base,
            ks, *(ks.stride() if quant else (0, 0)), vs, *(vs.stride() if quant else (0, 0)),
            k.shape[2], v.shape[2],
            PAGED=paged, HAS_BATCH_IDX=cache_batch_idx is not None, UNIFORM=rows.cu is None, ROTARY=rotary is not None,
            INTERLEAVED=bool(interleaved), QUANT=quant, FP8_MAX=float(torch.finfo(fmt).max) if quant else 0.0,
            BLOCK_T=block_t, BLOCK_D=block_d, INTEL_GPU=intel, num_warps=4,
        )


# ---- the cache as the attention kernel reads it ----


def _largest_page(*sizes: int) -> int:
    """The largest power of two up to 2048 that divides every size."""
    g = 0
    for s in sizes:
        g = math.gcd(g, s)
    return min(g & -g, 2048) if g else 2048


def _token_rows(name: str, cache: torch.Tensor, rows_per_entry: int) -> int:
    """Token stride of dim 0 in tokens (dim 0's stride / dim 1's), ValueError if not whole."""
    s0, s1 = cache.stride(0), cache.stride(1)
    if cache.shape[0] <= 1:
        return rows_per_entry
    if s1 <= 0 or s0 % s1:
        raise ValueError(f"{name}: dim 0's stride ({s0}) must be a whole multiple of dim 1's ({s1}) to append into "
                         f"it with cache_leftpad or a contiguous cache")
    return s0 // s1


def _pool(cache: torch.Tensor, page: int, rows_per_entry: int) -> torch.Tensor:
    """``cache`` ``[E, S, H, D]`` (entries ``rows_per_entry`` token rows apart) as a paged pool
    ``[N, page, H, D]`` over the same memory: page ``e * rows_per_entry / page + j`` holds tokens
    ``j * page ..`` of entry ``e``."""
    entries, length = cache.shape[:2]
    tokens = (entries - 1) * rows_per_entry + length if entries else 0
    s1 = cache.stride(1)
    return cache.as_strided((tokens // page, page, *cache.shape[2:]), (page * s1, s1, *cache.stride()[2:]))


def attention_layout(k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor | None, batch: int,
                     kv_total: torch.Tensor, cache_batch_idx: torch.Tensor | None, cache_leftpad: torch.Tensor | None):
    """``(k_pool, v_pool, table, kv_lens)``: the paged view, page-granular table ``[B, W]`` int32
    and ``[B]`` int32 lengths over which the attention kernel sees request ``b``'s keys
    ``cache_leftpad[b] .. kv_total[b] - 1`` of its cache row (device ops only, no host sync).

    A ``cache_batch_idx`` entry outside the cache / table gives its request no keys; a leftpad is
    clamped into ``[0, kv_total]``."""
    device = kv_total.device
    paged = page_table is not None
    entries = page_table.shape[0] if paged else k_cache.shape[0]
    row = torch.arange(batch, device=device) if cache_batch_idx is None else cache_batch_idx.long()
    if cache_batch_idx is not None:
        valid = (row >= 0) & (row < entries)
        kv_total = torch.where(valid, kv_total, torch.zeros_like(kv_total))
        row = row.clamp(0, max(entries - 1, 0))
    leftpad = None
    if cache_leftpad is not None:
        leftpad = torch.minimum(cache_leftpad.clamp(min=0), kv_total.clamp(min=0))
        kv_total = kv_total - leftpad
    kv_lens = kv_total.to(torch.int32)
    if paged:
        if leftpad is None:
            table = page_table if cache_batch_idx is None else page_table.index_select(0, row)
            return k_cache, v_cache, table, kv_lens
        # token-granular table: key j of request b is token leftpad[b] + j of its page-table row
        num_pages, page = k_cache.shape[:2]
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if num_pages > 1 and cache.stride(0) != page * cache.stride(1):
                raise ValueError(f"{name}: cache_leftpad with a paged cache needs pages of consecutive tokens "
                                 f"(stride(0) == page_size * stride(1))")
        if num_pages * page >= 2**31:
            raise ValueError("cache_leftpad with a paged cache of 2^31 tokens or more is not supported")
        width = page_table.shape[1] * page
        tok = (leftpad.long()[:, None] + torch.arange(width, device=device)[None, :]).clamp(max=max(width - 1, 0))
        pages = page_table.index_select(0, row).long().gather(1, tok // page)
        table = (pages.clamp(0, max(num_pages - 1, 0)) * page + tok % page).to(torch.int32)
        return _pool(k_cache, 1, page), _pool(v_cache, 1, page), table, kv_lens
    # contiguous cache [B_cache, S, H, D]: a pool of pages over the same memory
    length = k_cache.shape[1]
    rows_k = _token_rows("k_cache", k_cache, length)
    rows_v = _token_rows("v_cache", v_cache, length)
    if rows_k != rows_v:
        raise ValueError(f"k_cache and v_cache must have the same row stride in tokens, got {rows_k} and {rows_v}")
    if (entries - 1) * rows_k + length >= 2**31:
        raise ValueError("a contiguous cache of 2^31 token rows or more is not supported")
    page = 1 if leftpad is not None else _largest_page(length, rows_k)
    width = max(1, length // page)
    j = torch.arange(width, device=device)[None, :]
    if leftpad is not None:
        j = (j + leftpad.long()[:, None]).clamp(max=max(length - 1, 0))
    table = (row[:, None] * (rows_k // page) + j).to(torch.int32)
    return _pool(k_cache, page, rows_k), _pool(v_cache, page, rows_k), table, kv_lens


# ---- flash_attn_with_kvcache with AppendKV ----


def append_and_attend(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, *, cache_seqlens, page_table,
                       cache_batch_idx, cache_leftpad, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, rotary_seqlens,
                       k_descale, v_descale, softmax_scale, sinks, causal, window_size, softcap, rotary_interleaved,
                       num_splits, return_softmax_lse, out, validate, alibi_slopes=None):
    """``flash_attn_with_kvcache`` with FlashAttention-3's AppendKV (``k``/``v``, rotary),
    ``cache_batch_idx``, ``cache_leftpad`` or a contiguous cache (``page_table`` None): the new
    tokens are written (ops/append_kv.py), then the attention runs over ``cache_seqlens + new``
    keys of each cache row through a page table built on the device."""
    if (k is None) != (v is None):
        missing = "v" if v is None else "k"
        raise ValueError(f"{missing}: the new keys k and values v to append must be given together")
    for name, value in (("cu_seqlens_k_new", cu_seqlens_k_new), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if value is not None and k is None:
            raise ValueError(f"{name}: only used with new keys k and values v to append (FlashAttention-3's contract); "
                             f"without them the cache holds every key already")
    check_tensor("q", q, dtypes=FLOAT_DTYPES, ndim=(3, 4), last_dim_contiguous=True)
    check_tensor("k_cache", k_cache, ndim=4, last_dim_contiguous=True)
    fp8_cache = k_cache.dtype in FP8_DTYPES
    if k_cache.dtype != q.dtype and not fp8_cache:
        raise TypeError(f"k_cache's dtype ({dtype_names([k_cache.dtype])}) must be q's ({dtype_names([q.dtype])}) or fp8")
    check_tensor("v_cache", v_cache, dtypes=(k_cache.dtype,), ndim=4, last_dim_contiguous=True)
    entries, length, num_kv_heads, head_dim = k_cache.shape
    if tuple(v_cache.shape[:3]) != (entries, length, num_kv_heads):
        raise ValueError(f"v_cache must have shape [{entries}, {length}, {num_kv_heads}, Dv] like k_cache, got "
                         f"{list(v_cache.shape)}")
    head_dim_v = v_cache.shape[3]
    _check_heads(q, "k_cache", num_kv_heads, head_dim, head_dim_v)
    if page_table is not None:
        check_page_size(length, "page_size (k_cache.shape[1])")
        check_tensor("page_table", page_table, dtypes=(torch.int32,), ndim=2, last_dim_contiguous=True)
    if q.dim() == 4:
        if cu_seqlens_q is not None:
            raise ValueError("cu_seqlens_q must not be given with a 4-D q [B, S, Hq, D]")
        batch, uniform_q_len = q.shape[:2]
        q_rows = Rows(batch, batch * uniform_q_len, seq_len=uniform_q_len)
        q = q.reshape(batch * uniform_q_len, q.shape[2], head_dim)
        mapping, max_q = _UNIFORM, uniform_q_len
    else:
        if cu_seqlens_q is None:
            raise ValueError("cu_seqlens_q ([B + 1] int32) is required with a 3-D q [total_q, Hq, D]")
        check_tensor("cu_seqlens_q", cu_seqlens_q, dtypes=(torch.int32,), ndim=1)
        if cu_seqlens_q.shape[0] < 1:
            raise ValueError("cu_seqlens_q must have B + 1 >= 1 entries")
        cu_seqlens_q = cu_seqlens_q.contiguous()
        batch, uniform_q_len = cu_seqlens_q.shape[0] - 1, 0
        q_rows = Rows(batch, q.shape[0], cu=cu_seqlens_q)
        max_q = check_int(max_seqlen_q, "max_seqlen_q", minimum=0, allow_none=True) or None
        mapping = _PER_REQUEST if max_q is not None else _SEARCH
    rows_name, rows = ("page_table", page_table.shape[0]) if page_table is not None else ("k_cache", entries)
    if cache_batch_idx is None and rows != batch:
        raise ValueError(f"{rows_name} has {rows} rows but there are {batch} requests: without cache_batch_idx "
                         f"both need one per request")
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    check_tensor("cache_seqlens", cache_seqlens, dtypes=(torch.int32,), shape=(batch,))
    cache_seqlens = cache_seqlens.contiguous()
    if cache_batch_idx is not None:
        check_tensor("cache_batch_idx", cache_batch_idx, dtypes=(torch.int32,), shape=(batch,))
        cache_batch_idx = cache_batch_idx.contiguous()
    if cache_leftpad is not None:
        check_tensor("cache_leftpad", cache_leftpad, dtypes=(torch.int32,), shape=(batch,))
    device = check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table,
                               cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
                               cache_leftpad=cache_leftpad, cu_seqlens_q=cu_seqlens_q, k=k, v=v,
                               cu_seqlens_k_new=cu_seqlens_k_new, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                               rotary_seqlens=rotary_seqlens, sinks=sinks, out=out)
    kv_total = cache_seqlens
    if k is not None:
        check_tensor("k", k, dtypes=(q.dtype, k_cache.dtype) if fp8_cache else (q.dtype,), ndim=(3, 4),
                     last_dim_contiguous=True)
        check_tensor("v", v, dtypes=(k.dtype,), ndim=k.dim(), last_dim_contiguous=True)
        if k.dim() == 4:
            if cu_seqlens_k_new is not None:
                raise ValueError("cu_seqlens_k_new: must not be given with a 4-D k [B, S_new, H_kv, D]")
            check_tensor("k", k, shape=(batch, None, num_kv_heads, head_dim))
            check_tensor("v", v, shape=(batch, k.shape[1], num_kv_heads, head_dim_v))
            new_rows = Rows(batch, batch * k.shape[1], seq_len=k.shape[1])
            k, v = k.reshape(-1, num_kv_heads, head_dim), v.reshape(-1, num_kv_heads, head_dim_v)
        else:
            if cu_seqlens_k_new is None:
                raise ValueError("cu_seqlens_k_new: [B + 1] int32 offsets are required with a 3-D k [total_new, H_kv, D]")
            check_tensor("cu_seqlens_k_new", cu_seqlens_k_new, dtypes=(torch.int32,), shape=(batch + 1,))
            check_tensor("k", k, shape=(None, num_kv_heads, head_dim))
            check_tensor("v", v, shape=(k.shape[0], num_kv_heads, head_dim_v))
            new_rows = Rows(batch, k.shape[0], cu=cu_seqlens_k_new.contiguous())
        kv_total = cache_seqlens + new_rows.lengths(device)
    rotary = None
    if rotary_cos is not None or rotary_sin is not None:
        if rotary_cos is None or rotary_sin is None:
            raise ValueError(f"{'rotary_sin' if rotary_sin is None else 'rotary_cos'}: rotary_cos and rotary_sin "
                             f"must be given together")
        check_tensor("rotary_cos", rotary_cos, dtypes=FLOAT_DTYPES, ndim=2, last_dim_contiguous=True)
        check_tensor("rotary_sin", rotary_sin, dtypes=FLOAT_DTYPES, shape=tuple(rotary_cos.shape), last_dim_contiguous=True)
        if not 0 < 2 * rotary_cos.shape[1] <= head_dim:
            raise ValueError(f"rotary_cos: rotary_dim = 2 * rotary_cos.shape[1] must be in [2, head dim {head_dim}], "
                             f"got {2 * rotary_cos.shape[1]}")
        if k.dtype != q.dtype:
            raise ValueError("rotary_cos: keys k given in the cache's fp8 dtype cannot be rotated: pass k in q's dtype")
        if rotary_sin.stride(0) != rotary_cos.stride(0):
            rotary_cos, rotary_sin = rotary_cos.contiguous(), rotary_sin.contiguous()
        base = cache_seqlens
        if rotary_seqlens is not None:
            check_tensor("rotary_seqlens", rotary_seqlens, dtypes=(torch.int32,), shape=(batch,))
            base = rotary_seqlens.contiguous()
        rotary = (rotary_cos, rotary_sin, base, check_bool(rotary_interleaved, "rotary_interleaved"))
    k_scale = _as_scale("k_descale", k_descale, batch, num_kv_heads, device)
    v_scale = _as_scale("v_descale", v_descale, batch, num_kv_heads, device)
    if k is not None:
        one = torch.ones((1, 1), dtype=torch.float32, device=device).expand(batch, num_kv_heads)
        append_kv(k, v, k_cache, v_cache, rows=new_rows, page_table=page_table, cache_seqlens=cache_seqlens,
                          cache_batch_idx=cache_batch_idx, rotary=rotary, k_scale=one if k_scale is None else k_scale,
                          v_scale=one if v_scale is None else v_scale)
    if rotary is not None:
        # FlashAttention-3: queries rotate at consecutive positions when causal or local, all at
        # the first otherwise (windows reaching past every key / query count as none)
        left, right = check_window(window_size)
        width_k = page_table.shape[1] * length if page_table is not None else length
        left = -1 if left >= width_k - 1 else left
        right = 0 if check_bool(causal, "causal") else (-1 if right >= (max_q or q.shape[0]) - 1 else right)
        q = rotate_rows(q, q_rows, *rotary[:3], positional=left >= 0 or right >= 0, interleaved=rotary[3],
                                out_dtype=q.dtype)
    k_pool, v_pool, table, kv_lens = attention_layout(k_cache, v_cache, page_table, batch, kv_total,
                                                              cache_batch_idx, cache_leftpad)
    if check_bool(validate, "validate"):
        _validate(kv_lens, table, k_pool.shape[1], k_pool.shape[0], cu_seqlens_q, uniform_q_len, q.shape[0], max_q)
    return _launch(
        q, k_pool, v_pool, device=device, batch=batch, page_table=table, kv_lens=kv_lens, cu_seqlens_k=None,
        max_kv_len=table.shape[1] * k_pool.shape[1], mapping=mapping, cu_seqlens_q=cu_seqlens_q,
        uniform_q_len=uniform_q_len, max_q=max_q, softmax_scale=softmax_scale, sinks=sinks, causal=causal,
        window_size=window_size, softcap=softcap, k_descale=k_scale, v_descale=v_scale, num_splits=num_splits,
        return_softmax_lse=return_softmax_lse, out=out, alibi_slopes=alibi_slopes,
    )
