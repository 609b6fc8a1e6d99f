"""KV-cache writes and reads of vLLM's attention backends (vllm-xpu-kernels' ``_C_cache_ops``):
``reshape_and_cache_flash`` (paged K/V store), ``concat_and_cache_mla`` (MLA latent store) and
``gather_and_maybe_dequant_cache`` (MLA cache -> contiguous rows, fp8 dequantised).

Memory contract: slot mappings, block tables, ``cu_seq_lens`` and ``seq_starts`` are device data
that the kernels never trust. A slot outside ``[0, num_blocks * block_size)`` (the padding slot
-1, a slot past the cache, int64 extremes) writes nothing; a gathered row whose block-table column
or block id lies outside its table / cache reads as 0. No op reads a device value on the host, so
every call is graph-safe.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device
from .._common import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    INDEX_DTYPES,
    cdiv,
    check_int,
    check_same_device,
    check_tensor,
    device_guard,
    interpreter_float32,
    next_power_of_2,
    register_xpu_compile,
)

#: kv_cache_dtype strings vLLM passes -> the fp8 format they name ("auto": none)
_FP8_FORMATS = {
    "fp8": getattr(torch, "float8_e4m3fn", None),
    "fp8_e4m3": getattr(torch, "float8_e4m3fn", None),
    "fp8_e5m2": getattr(torch, "float8_e5m2", None),
}
KV_CACHE_DTYPES = ("auto",) + tuple(_FP8_FORMATS)

_TILE_ELEMENTS = 2048  # elements of one [BLOCK_T, BLOCK_D] tile (registers per program)
_MAX_BLOCK_D = 256  # widest column chunk; wider rows loop over chunks


@triton.jit
def _store_rows(src_ptr, stride_src_t, t, dst_ptr, dst_row, ok, width, scale,
                BLOCK_D: tl.constexpr, QUANT: tl.constexpr, FP8_MAX: tl.constexpr):
    """``dst[dst_row[i] + d] = src[t[i] * stride_src_t + d]`` for ``d < width`` on rows ``ok``
    (quantised as ``clamp(x / scale, -FP8_MAX, FP8_MAX)`` when ``QUANT``); other rows untouched."""
    for d0 in range(0, width, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (d[None, :] < width)
        x = tl.load(src_ptr + t[:, None] * stride_src_t + d[None, :], mask=mask, other=0.0)
        if QUANT:
            x = tl.minimum(tl.maximum(x.to(tl.float32) / scale, -FP8_MAX), FP8_MAX)
        tl.store(dst_ptr + dst_row[:, None] + d[None, :], x.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _token_slots(slot_ptr, num_tokens, num_slots, block_size, BLOCK_T: tl.constexpr):
    """Tokens of this program, whether each has a slot inside the cache, its block and offset."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.load(slot_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    ok = (slot >= 0) & (slot < num_slots)
    slot = tl.where(ok, slot, 0)
    return t, ok, slot // block_size, slot % block_size


@triton.jit
def _reshape_and_cache_flash_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    num_tokens, num_slots, block_size,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_kc_b, stride_kc_s, stride_kc_h, stride_vc_b, stride_vc_s, stride_vc_h,
    head_dim, v_head_dim,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr, FP8_MAX: tl.constexpr,
):
    """Program (token tile, kv head): key/value rows of BLOCK_T tokens into their cache slots."""
    h = tl.program_id(1).to(tl.int64)
    t, ok, blk, off = _token_slots(slot_ptr, num_tokens, num_slots, block_size, BLOCK_T)
    k_row = blk * stride_kc_b + off * stride_kc_s
    v_row = blk * stride_vc_b + off * stride_vc_s
    k_scale = 1.0
    v_scale = 1.0
    if QUANT:
        k_scale = tl.load(k_scale_ptr).to(tl.float32)
        v_scale = tl.load(v_scale_ptr).to(tl.float32)
    _store_rows(key_ptr + h * stride_k_h, stride_k_t, t, key_cache_ptr, k_row + h * stride_kc_h, ok, head_dim,
                k_scale, BLOCK_D, QUANT, FP8_MAX)
    _store_rows(value_ptr + h * stride_v_h, stride_v_t, t, value_cache_ptr, v_row + h * stride_vc_h, ok, v_head_dim,
                v_scale, BLOCK_D, QUANT, FP8_MAX)


@triton.jit
def _concat_and_cache_mla_kernel(
    kv_c_ptr, k_pe_ptr, cache_ptr, slot_ptr, scale_ptr,
    num_tokens, num_slots, block_size, stride_c_t, stride_pe_t, stride_cache_b, stride_cache_s,
    rank, pe_dim,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr, FP8_MAX: tl.constexpr,
):
    """Program (token tile): ``[kv_c | k_pe]`` rows of BLOCK_T tokens into their cache slots."""
    t, ok, blk, off = _token_slots(slot_ptr, num_tokens, num_slots, block_size, BLOCK_T)
    row = blk * stride_cache_b + off * stride_cache_s
    scale = 1.0
    if QUANT:
        scale = tl.load(scale_ptr).to(tl.float32)
    _store_rows(kv_c_ptr, stride_c_t, t, cache_ptr, row, ok, rank, scale, BLOCK_D, QUANT, FP8_MAX)
    _store_rows(k_pe_ptr, stride_pe_t, t, cache_ptr, row + rank, ok, pe_dim, scale, BLOCK_D, QUANT, FP8_MAX)


@triton.jit
def request_of(t, cu_ptr, batch, search_steps, BLOCK_T: tl.constexpr):
    """Kernel helper: request of each row ``t`` (int64 ``[BLOCK_T]``) by a binary search of the
    cumulative offsets ``cu [batch + 1]`` (the largest ``b`` with ``cu[b] <= t``, ``search_steps =
    batch.bit_length()`` probes): ``(b, start, end)`` with ``[start, end)`` the request's rows;
    ``b == batch`` (``end = 0``) for a row at or past ``cu[batch]``. Every probe stays inside ``cu``."""
    lo = tl.zeros([BLOCK_T], dtype=tl.int64)
    hi = lo + batch + 1  # the answer lies in [lo, hi); every probe is an index of cu[0 .. batch]
    for _ in range(search_steps):
        active = hi - lo > 1
        mid = (lo + hi) // 2
        below = tl.load(cu_ptr + mid, mask=active, other=0).to(tl.int64) <= t
        lo = tl.where(active & below, mid, lo)
        hi = tl.where(active & ~below, mid, hi)
    start = tl.load(cu_ptr + lo).to(tl.int64)
    end = tl.load(cu_ptr + lo + 1, mask=lo < batch, other=0).to(tl.int64)
    return lo, start, end


@triton.jit
def _request_rows(cu_ptr, dst_rows, batch, search_steps, BLOCK_T: tl.constexpr):
    """Rows ``t`` of this program, each's request ``b`` (the largest with ``cu[b] <= t``, by a
    binary search of ``cu_seq_lens``), the row's position in its request, and whether the row
    belongs to a request (``cu[b] <= t < cu[b + 1]``, ``b < batch``, ``t < dst_rows``)."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    b, start, end = request_of(t, cu_ptr, batch, search_steps, BLOCK_T)
    row_ok = (t < dst_rows) & (b < batch) & (start <= t) & (t < end)
    return t, b, t - start, row_ok


@triton.jit
def _gather_cache_kernel(
    src_ptr, dst_ptr, block_table_ptr, cu_ptr, starts_ptr, scale_ptr,
    dst_rows, batch, search_steps, num_blocks, max_blocks, block_size,
    stride_src_b, stride_src_s, stride_dst_t, stride_bt_b, width,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, HAS_STARTS: tl.constexpr, DEQUANT: tl.constexpr,
    PAGE_STARTS: tl.constexpr,
):
    """Program (dst row tile): each row finds its request (``_request_rows``), then copies
    (dequantises) its cache entry; a row of no request is left untouched, a row of a request whose
    page lies outside the table / cache is 0. ``PAGE_STARTS``: ``seq_starts`` counts whole blocks
    (``seq_starts[b] // block_size`` columns skipped, vLLM's ``gather_cache``), else tokens."""
    t, b, pos, row_ok = _request_rows(cu_ptr, dst_rows, batch, search_steps, BLOCK_T)
    if HAS_STARTS:
        s = tl.load(starts_ptr + b, mask=row_ok, other=0).to(tl.int64)
        if PAGE_STARTS:  # whole blocks; a negative start makes the position negative (a 0 row)
            s = tl.where(s >= 0, (s // block_size) * block_size, -1 - pos)
        pos += s
    pos_safe = tl.maximum(pos, 0)
    col = pos_safe // block_size
    page_ok = row_ok & (pos >= 0) & (col < max_blocks)
    blk = tl.load(block_table_ptr + b * stride_bt_b + col, mask=page_ok, other=-1).to(tl.int64)
    page_ok = page_ok & (blk >= 0) & (blk < num_blocks)
    # no select on the row offsets: every access below is masked by page_ok (a 1-D select feeding
    # two 2-D layouts fails Triton 3.6's sm_90 layout passes for some specialisations)
    src_row = blk * stride_src_b + (pos_safe - col * block_size) * stride_src_s
    scale = 1.0
    if DEQUANT:
        scale = tl.load(scale_ptr).to(tl.float32)
    for d0 in range(0, width, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        in_width = d[None, :] < width
        x = tl.load(src_ptr + src_row[:, None] + d[None, :], mask=page_ok[:, None] & in_width, other=0.0)
        if DEQUANT:
            x = x.to(tl.float32) * scale
        tl.store(dst_ptr + t[:, None] * stride_dst_t + d[None, :], x.to(dst_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & in_width)


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    num_tokens, num_slots, block_size,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_kc_b, stride_kc_h, stride_kc_x, stride_kc_s, stride_vc_b, stride_vc_h, stride_vc_d, stride_vc_s,
    head_dim,
    X: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr, FP8_MAX: tl.constexpr,
):
    """Program (token tile, kv head): vLLM's paged-attention layout, element ``d`` of token ``t``'s
    key at ``key_cache[blk, h, d // X, off, d % X]`` and of its value at
    ``value_cache[blk, h, d, off]``."""
    h = tl.program_id(1).to(tl.int64)
    t, ok, blk, off = _token_slots(slot_ptr, num_tokens, num_slots, block_size, BLOCK_T)
    k_row = blk * stride_kc_b + h * stride_kc_h + off * stride_kc_s
    v_row = blk * stride_vc_b + h * stride_vc_h + off * stride_vc_s
    k_scale = 1.0
    v_scale = 1.0
    if QUANT:
        k_scale = tl.load(k_scale_ptr).to(tl.float32)
        v_scale = tl.load(v_scale_ptr).to(tl.float32)
    # keys, then values: one tile live at a time (both at once spill 0.9 KB in fp8 on PVC)
    for d0 in range(0, head_dim, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (d[None, :] < head_dim)
        k = tl.load(key_ptr + t[:, None] * stride_k_t + h * stride_k_h + d[None, :], mask=mask, other=0.0)
        if QUANT:
            k = tl.minimum(tl.maximum(k.to(tl.float32) / k_scale, -FP8_MAX), FP8_MAX)
        k_col = (d // X) * stride_kc_x + d % X
        tl.store(key_cache_ptr + k_row[:, None] + k_col[None, :], k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    for d0 in range(0, head_dim, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (d[None, :] < head_dim)
        v = tl.load(value_ptr + t[:, None] * stride_v_t + h * stride_v_h + d[None, :], mask=mask, other=0.0)
        if QUANT:
            v = tl.minimum(tl.maximum(v.to(tl.float32) / v_scale, -FP8_MAX), FP8_MAX)
        tl.store(value_cache_ptr + v_row[:, None] + d[None, :] * stride_vc_d, v.to(value_cache_ptr.dtype.element_ty),
                 mask=mask)


def _register_compile_variants() -> None:
    flash = dict(
        num_tokens="i32", num_slots="i64", block_size="i32", stride_k_t="i64", stride_k_h="i32", stride_v_t="i64",
        stride_v_h="i32", stride_kc_b="i64", stride_kc_s="i64", stride_kc_h="i32", stride_vc_b="i64",
        stride_vc_s="i64", stride_vc_h="i32", head_dim="i32", v_head_dim="i32",
        slot_ptr="*i64", k_scale_ptr="*fp32", v_scale_ptr="*fp32",
    )
    register_xpu_compile(_reshape_and_cache_flash_kernel, "bf16,D128", dict(
        flash, key_ptr="*bf16", value_ptr="*bf16", key_cache_ptr="*bf16", value_cache_ptr="*bf16",
        BLOCK_T=8, BLOCK_D=128, QUANT=False, FP8_MAX=0.0), num_warps=4)
    register_xpu_compile(_reshape_and_cache_flash_kernel, "bf16->fp8e4m3,D128", dict(
        flash, key_ptr="*bf16", value_ptr="*bf16", key_cache_ptr="*fp8e4nv", value_cache_ptr="*fp8e4nv",
        BLOCK_T=8, BLOCK_D=128, QUANT=True, FP8_MAX=448.0), num_warps=4)
    mla = dict(
        slot_ptr="*i64", scale_ptr="*fp32", num_tokens="i32", num_slots="i64", block_size="i32", stride_c_t="i64",
        stride_pe_t="i64", stride_cache_b="i64", stride_cache_s="i64", rank="i32", pe_dim="i32",
    )
    register_xpu_compile(_concat_and_cache_mla_kernel, "bf16,R512,Dr64", dict(
        mla, kv_c_ptr="*bf16", k_pe_ptr="*bf16", cache_ptr="*bf16", BLOCK_T=8, BLOCK_D=256, QUANT=False,
        FP8_MAX=0.0), num_warps=4)
    register_xpu_compile(_concat_and_cache_mla_kernel, "bf16->fp8e4m3,R512,Dr64", dict(
        mla, kv_c_ptr="*bf16", k_pe_ptr="*bf16", cache_ptr="*fp8e4nv", BLOCK_T=8, BLOCK_D=256, QUANT=True,
        FP8_MAX=448.0), num_warps=4)
    gather = dict(
        block_table_ptr="*i32", cu_ptr="*i32", starts_ptr="*i32", scale_ptr="*fp32", dst_rows="i32", batch="i32",
        search_steps="i32", num_blocks="i64", max_blocks="i32", block_size="i32", stride_src_b="i64",
        stride_src_s="i64", stride_dst_t="i64", stride_bt_b="i64", width="i32",
    )
    register_xpu_compile(_gather_cache_kernel, "bf16,D576,starts", dict(
        gather, src_ptr="*bf16", dst_ptr="*bf16", BLOCK_T=8, BLOCK_D=256, HAS_STARTS=True, DEQUANT=False,
        PAGE_STARTS=False), num_warps=4)
    register_xpu_compile(_gather_cache_kernel, "fp8e4m3->bf16,D576", dict(
        gather, src_ptr="*fp8e4nv", dst_ptr="*bf16", BLOCK_T=8, BLOCK_D=256, HAS_STARTS=False, DEQUANT=True,
        PAGE_STARTS=False), num_warps=4)
    # gather_cache: bit copies (bf16 MLA rows as i16, fp8 rows as u8), block-granular starts
    register_xpu_compile(_gather_cache_kernel, "copy i16,D576,page starts", dict(
        gather, src_ptr="*i16", dst_ptr="*i16", BLOCK_T=8, BLOCK_D=256, HAS_STARTS=True, DEQUANT=False,
        PAGE_STARTS=True), num_warps=4)
    register_xpu_compile(_gather_cache_kernel, "copy u8,D656", dict(
        gather, src_ptr="*u8", dst_ptr="*u8", BLOCK_T=8, BLOCK_D=256, HAS_STARTS=False, DEQUANT=False,
        PAGE_STARTS=False), num_warps=4)
    paged = dict(
        slot_ptr="*i64", k_scale_ptr="*fp32", v_scale_ptr="*fp32", num_tokens="i32", num_slots="i64",
        block_size="i32", stride_k_t="i64", stride_k_h="i32", stride_v_t="i64", stride_v_h="i32",
        stride_kc_b="i64", stride_kc_h="i64", stride_kc_x="i32", stride_kc_s="i32", stride_vc_b="i64",
        stride_vc_h="i64", stride_vc_d="i32", stride_vc_s="i32", head_dim="i32",
    )
    register_xpu_compile(_reshape_and_cache_kernel, "bf16,D128,x8", dict(
        paged, key_ptr="*bf16", value_ptr="*bf16", key_cache_ptr="*bf16", value_cache_ptr="*bf16", X=8,
        BLOCK_T=8, BLOCK_D=128, QUANT=False, FP8_MAX=0.0), num_warps=4)
    register_xpu_compile(_reshape_and_cache_kernel, "bf16->fp8e4m3,D128,x16", dict(
        paged, key_ptr="*bf16", value_ptr="*bf16", key_cache_ptr="*fp8e4nv", value_cache_ptr="*fp8e4nv", X=16,
        BLOCK_T=8, BLOCK_D=128, QUANT=True, FP8_MAX=448.0), num_warps=4)


_register_compile_variants()


# ---- launchers ----


def _fp8_format(kv_cache_dtype) -> torch.dtype | None:
    """The fp8 dtype ``kv_cache_dtype`` names, None for "auto"; ValueError for anything else."""
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"kv_cache_dtype must be a str, got {type(kv_cache_dtype).__name__}")
    if kv_cache_dtype == "auto":
        return None
    fmt = _FP8_FORMATS.get(kv_cache_dtype)
    if fmt is None:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(map(repr, KV_CACHE_DTYPES))}, got {kv_cache_dtype!r}"
                         + ("" if kv_cache_dtype not in _FP8_FORMATS else " (this torch has no fp8 dtypes)"))
    return fmt


def _cache_view(name: str, cache: torch.Tensor, fmt: torch.dtype | None, like: torch.dtype | None) -> torch.Tensor:
    """The cache as the kernels see it: fp8 caches may be given as uint8 (vLLM's allocation) or in
    the format ``kv_cache_dtype`` names; "auto" caches have the dtype ``like`` (or any float dtype
    when ``like`` is None)."""
    if fmt is None:
        dtypes = FLOAT_DTYPES if like is None else (like,)
        check_tensor(name, cache, dtypes=dtypes)
        return cache
    check_tensor(name, cache, dtypes=(torch.uint8, fmt))
    return cache.view(fmt) if cache.dtype == torch.uint8 else cache


def _check_scale(name: str, scale, required: bool) -> torch.Tensor | None:
    if scale is None:
        if required:
            raise ValueError(f"{name} is required with an fp8 kv_cache_dtype (a one-element fp32 tensor)")
        return None
    check_tensor(name, scale, dtypes=(torch.float32,))
    if scale.numel() != 1:
        raise ValueError(f"{name} must hold one value, got shape {list(scale.shape)}")
    return scale


def _check_slot_mapping(slot_mapping, rows: int, rows_name: str) -> int:
    check_tensor("slot_mapping", slot_mapping, dtypes=INDEX_DTYPES, ndim=1)
    if slot_mapping.numel() > 1 and slot_mapping.stride(0) != 1:
        raise ValueError(f"slot_mapping must be contiguous, got stride {slot_mapping.stride()}")
    num_tokens = slot_mapping.shape[0]
    if rows < num_tokens:
        raise ValueError(f"{rows_name} has {rows} tokens but slot_mapping has {num_tokens}: {rows_name} must have at "
                         f"least as many (vLLM pads the inputs, not the slot mapping)")
    return num_tokens


def _kv_store_checks(key, value, key_cache, value_cache, slot_mapping, fmt, k_scale, v_scale):
    """``(num_tokens, k_scale, v_scale, device)`` of a K/V cache store whose tensors are checked."""
    num_tokens = _check_slot_mapping(slot_mapping, key.shape[0], "key")
    k_scale = _check_scale("k_scale", k_scale, fmt is not None)
    v_scale = _check_scale("v_scale", v_scale, fmt is not None)
    device = check_same_device(key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                               slot_mapping=slot_mapping, k_scale=k_scale, v_scale=v_scale)
    return num_tokens, k_scale, v_scale, device


def _store_mode(fmt, inputs, scales, num_tokens: int):
    """``(inputs, QUANT, FP8_MAX)`` of a cache store. Under the interpreter an fp8 store is not the
    kernel's: the interpreter's fp32 -> fp8 cast drops a mantissa carry into the exponent (31.94 ->
    16 in e4m3), so there torch quantises the inputs (the kernel's formula: ``clamp(x / scale)`` in
    fp32, then the cast) and the kernel copies fp8 bytes, its slot handling, masking and strides
    unchanged. Compiled backends quantise in the kernel."""
    if fmt is None:
        return inputs, False, 0.0
    fp8_max = torch.finfo(fmt).max
    if not _device.is_interpreter():
        return inputs, True, float(fp8_max)
    return tuple((x[:num_tokens].float() / s.reshape(()).float()).clamp(-fp8_max, fp8_max).to(fmt)
                 for x, s in zip(inputs, scales)), False, 0.0


def _check_request_tables(block_table, cu_seq_lens, seq_starts, batch: int) -> None:
    """The per-request tables of the gathers: ``block_table [>= batch, max_blocks]``,
    ``cu_seq_lens [>= batch + 1]`` and ``seq_starts [>= batch]`` (optional), int32 / int64."""
    check_tensor("block_table", block_table, dtypes=INDEX_DTYPES, ndim=2, last_dim_contiguous=True)
    if block_table.shape[0] < batch:
        raise ValueError(f"block_table must have at least batch_size ({batch}) rows, got shape "
                         f"{list(block_table.shape)}")
    check_tensor("cu_seq_lens", cu_seq_lens, dtypes=INDEX_DTYPES, ndim=1)
    if cu_seq_lens.shape[0] < batch + 1 or (cu_seq_lens.numel() > 1 and cu_seq_lens.stride(0) != 1):
        raise ValueError(f"cu_seq_lens must be contiguous with at least batch_size + 1 ({batch + 1}) entries, got "
                         f"shape {list(cu_seq_lens.shape)} stride {cu_seq_lens.stride()}")
    if seq_starts is not None:
        check_tensor("seq_starts", seq_starts, dtypes=INDEX_DTYPES, ndim=1)
        if seq_starts.shape[0] < batch or (seq_starts.numel() > 1 and seq_starts.stride(0) != 1):
            raise ValueError(f"seq_starts must be contiguous with at least batch_size ({batch}) entries, got shape "
                             f"{list(seq_starts.shape)} stride {seq_starts.stride()}")


def _token_tile(width: int, elements: int = _TILE_ELEMENTS) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_D): a column chunk of up to 256 and as many tokens as ``elements`` allows."""
    block_d = min(next_power_of_2(max(width, 1)), _MAX_BLOCK_D)
    return max(1, min(16, elements // block_d)), block_d


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """vLLM's ``reshape_and_cache_flash`` (``torch.ops._C_cache_ops``): store each token's key and
    value into the paged cache at its slot, in place.

    Token ``t`` with ``s = slot_mapping[t]`` in ``[0, num_blocks * block_size)`` writes
    ``key_cache[s // block_size, s % block_size] = key[t]`` (and the value likewise). Any other
    slot (vLLM's padding slot -1, a slot past the cache, int64 extremes) writes nothing. With an
    fp8 ``kv_cache_dtype`` each element is stored as ``x / scale`` computed in fp32, saturated to
    the fp8 range, rounded to nearest even. Graph-safe: no host sync.

    Parameters
    ----------
    key : torch.Tensor
        ``[T_in, H_kv, D]`` fp16 / bf16 / fp32 keys, ``T_in >= T`` (rows past ``T`` are padding,
        not read); any strides with the last dim contiguous.
    value : torch.Tensor
        ``[T_in, H_kv, Dv]`` values, ``key``'s dtype (``Dv`` may differ from ``D``).
    key_cache : torch.Tensor
        ``[num_blocks, block_size, H_kv, D]`` destination: ``key``'s dtype with "auto", else fp8 in
        the format ``kv_cache_dtype`` names or uint8 holding it (vLLM's fp8 allocation). Any
        strides with the last dim contiguous (e.g. the K half of one ``[..., H_kv, 2D]`` buffer).
    value_cache : torch.Tensor
        ``[num_blocks, block_size, H_kv, Dv]``, ``key_cache``'s dtype, last dim contiguous.
    slot_mapping : torch.Tensor
        ``[T]`` int64 / int32 (contiguous): slot of each token, ``block * block_size + offset``.
    kv_cache_dtype : str
        ``"auto"`` (the cache stores ``key``'s dtype) or ``"fp8"`` / ``"fp8_e4m3"`` (e4m3fn),
        ``"fp8_e5m2"``.
    k_scale, v_scale : torch.Tensor, optional
        One-element fp32 quantisation scales, required with fp8 (not read with "auto").
    """
    fmt = _fp8_format(kv_cache_dtype)
    check_tensor("key", key, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    rows, heads, head_dim = key.shape
    check_tensor("value", value, dtypes=(key.dtype,), shape=(rows, heads, None), last_dim_contiguous=True)
    v_head_dim = value.shape[2]
    key_cache = _cache_view("key_cache", key_cache, fmt, key.dtype)
    check_tensor("key_cache", key_cache, ndim=4, shape=(None, None, heads, head_dim), last_dim_contiguous=True)
    num_blocks, block_size = key_cache.shape[:2]
    value_cache = _cache_view("value_cache", value_cache, fmt, key.dtype)
    check_tensor("value_cache", value_cache, shape=(num_blocks, block_size, heads, v_head_dim),
                 last_dim_contiguous=True)
    num_tokens, k_scale, v_scale, device = _kv_store_checks(key, value, key_cache, value_cache, slot_mapping, fmt,
                                                            k_scale, v_scale)
    if num_tokens == 0 or heads == 0 or num_blocks * block_size == 0:
        return
    (key, value), quant, fp8_max = _store_mode(fmt, (key, value), (k_scale, v_scale), num_tokens)
    # half the tile of the MLA ops: 16 x 128 fp8 stores spill 1.7 KB on BMG at 128 GRF, 8 x 128 none
    block_t, block_d = _token_tile(max(head_dim, v_head_dim), _TILE_ELEMENTS // 2)
    with device_guard(device):  # the scales are not read unless QUANT (slot_mapping stands in)
        _reshape_and_cache_flash_kernel[(cdiv(num_tokens, block_t), heads)](
            key, value, key_cache, value_cache, slot_mapping,
            k_scale if quant else slot_mapping, v_scale if quant else slot_mapping, num_tokens, num_blocks * block_size, block_size,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
            head_dim, v_head_dim, BLOCK_T=block_t, BLOCK_D=block_d, QUANT=quant, FP8_MAX=fp8_max, num_warps=4,
        )


def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    scale: torch.Tensor | None = None,
) -> None:
    """vLLM's ``concat_and_cache_mla`` (``torch.ops._C_cache_ops``): store each token's MLA latent
    ``[kv_c | k_pe]`` into the paged cache at its slot, in place.

    Token ``t`` with ``s = slot_mapping[t]`` in ``[0, num_blocks * block_size)`` writes
    ``kv_cache[s // block_size, s % block_size] = cat(kv_c[t], k_pe[t])``; any other slot (-1
    padding, past the cache, int64 extremes) writes nothing. With fp8, each element is stored as
    ``x / scale`` in fp32, saturated, rounded to nearest even. Graph-safe.

    Parameters
    ----------
    kv_c : torch.Tensor
        ``[T_in, R]`` fp16 / bf16 / fp32 compressed latents (``T_in >= T``; last dim contiguous).
    k_pe : torch.Tensor
        ``[T_in, Dr]`` rope keys, ``kv_c``'s dtype, last dim contiguous.
    kv_cache : torch.Tensor
        ``[num_blocks, block_size, R + Dr]``: ``kv_c``'s dtype with "auto", else fp8 (or uint8
        holding it); any strides with the last dim contiguous.
    slot_mapping : torch.Tensor
        ``[T]`` int64 / int32 (contiguous) slots.
    kv_cache_dtype : str
        ``"auto"``, ``"fp8"`` / ``"fp8_e4m3"``, ``"fp8_e5m2"``.
    scale : torch.Tensor, optional
        One-element fp32 quantisation scale, required with fp8.
    """
    fmt = _fp8_format(kv_cache_dtype)
    check_tensor("kv_c", kv_c, dtypes=FLOAT_DTYPES, ndim=2, last_dim_contiguous=True)
    rows, rank = kv_c.shape
    check_tensor("k_pe", k_pe, dtypes=(kv_c.dtype,), shape=(rows, None), last_dim_contiguous=True)
    pe_dim = k_pe.shape[1]
    kv_cache = _cache_view("kv_cache", kv_cache, fmt, kv_c.dtype)
    check_tensor("kv_cache", kv_cache, ndim=3, shape=(None, None, rank + pe_dim), last_dim_contiguous=True)
    num_blocks, block_size = kv_cache.shape[:2]
    num_tokens = _check_slot_mapping(slot_mapping, rows, "kv_c")
    scale = _check_scale("scale", scale, fmt is not None)
    device = check_same_device(kv_c=kv_c, k_pe=k_pe, kv_cache=kv_cache, slot_mapping=slot_mapping, scale=scale)
    if num_tokens == 0 or num_blocks * block_size == 0 or rank + pe_dim == 0:
        return
    (kv_c, k_pe), quant, fp8_max = _store_mode(fmt, (kv_c, k_pe), (scale, scale), num_tokens)
    block_t, block_d = _token_tile(max(rank, pe_dim))
    with device_guard(device):
        _concat_and_cache_mla_kernel[(cdiv(num_tokens, block_t),)](
            kv_c, k_pe, kv_cache, slot_mapping, scale if quant else slot_mapping,
            num_tokens, num_blocks * block_size, block_size, kv_c.stride(0), k_pe.stride(0),
            kv_cache.stride(0), kv_cache.stride(1), rank, pe_dim,
            BLOCK_T=block_t, BLOCK_D=block_d, QUANT=quant, FP8_MAX=fp8_max, num_warps=4,
        )


def gather_and_maybe_dequant_cache(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    batch_size: int,
    kv_cache_dtype: str = "auto",
    scale: torch.Tensor | None = None,
    seq_starts: torch.Tensor | None = None,
) -> None:
    """vLLM's ``gather_and_maybe_dequant_cache``: copy each request's cached MLA entries into
    contiguous rows of ``dst`` (the chunked-prefill context workspace), dequantising fp8, in place.

    For request ``b < batch_size`` and ``i < cu_seq_lens[b + 1] - cu_seq_lens[b]``, with
    ``pos = seq_starts[b] + i`` (``i`` without ``seq_starts``; a token offset into the request's
    blocks, as vllm-xpu-kernels and vLLM's CUDA kernel take it):
    ``dst[cu_seq_lens[b] + i] = src_cache[block_table[b, pos // block_size], pos % block_size]``
    (times ``scale`` in fp32 with fp8, cast to ``dst``'s dtype). A row whose ``pos`` is negative,
    whose column ``pos // block_size`` lies past ``block_table``'s width, or whose block id lies
    outside ``[0, num_blocks)`` is written as 0. Rows of ``dst`` outside
    ``[cu_seq_lens[0], cu_seq_lens[batch_size])`` are left untouched. ``cu_seq_lens`` must be
    non-decreasing for this to hold (each row finds its request by a binary search); other values
    never make the kernel read or write outside its tensors. Graph-safe: no host sync.

    Parameters
    ----------
    src_cache : torch.Tensor
        ``[num_blocks, block_size, D]`` paged MLA cache: fp16 / bf16 / fp32 with "auto", else fp8
        in the format ``kv_cache_dtype`` names or uint8 holding it. Any strides, last dim
        contiguous.
    dst : torch.Tensor
        ``[N, D]`` fp16 / bf16 / fp32 destination (last dim contiguous); rows past ``N`` are not
        written whatever ``cu_seq_lens`` says.
    block_table : torch.Tensor
        ``[>= batch_size, max_blocks]`` int32 / int64 (last dim contiguous) block ids per request.
    cu_seq_lens : torch.Tensor
        ``[>= batch_size + 1]`` int32 / int64 (contiguous) cumulative gathered lengths: request
        ``b``'s rows of ``dst`` are ``[cu_seq_lens[b], cu_seq_lens[b + 1])``.
    batch_size : int
        Requests gathered (a Python int, so no host sync).
    kv_cache_dtype : str
        ``"auto"`` (entries cast to ``dst``'s dtype), ``"fp8"`` / ``"fp8_e4m3"``, ``"fp8_e5m2"``.
    scale : torch.Tensor, optional
        One-element fp32 dequantisation scale, required with fp8.
    seq_starts : torch.Tensor, optional
        ``[>= batch_size]`` int32 / int64 (contiguous): token offset of each request's first
        gathered entry within its blocks (context chunking); None: 0.
    """
    fmt = _fp8_format(kv_cache_dtype)
    batch = check_int(batch_size, "batch_size", minimum=0)
    src_cache = _cache_view("src_cache", src_cache, fmt, None)
    check_tensor("src_cache", src_cache, ndim=3, last_dim_contiguous=True)
    num_blocks, block_size, width = src_cache.shape
    check_tensor("dst", dst, dtypes=FLOAT_DTYPES, shape=(None, width), last_dim_contiguous=True)
    _check_request_tables(block_table, cu_seq_lens, seq_starts, batch)
    scale = _check_scale("scale", scale, fmt is not None)
    device = check_same_device(src_cache=src_cache, dst=dst, block_table=block_table, cu_seq_lens=cu_seq_lens,
                               scale=scale, seq_starts=seq_starts)
    if batch == 0 or dst.shape[0] == 0 or width == 0:
        return
    block_t, block_d = _token_tile(width)
    # the interpreter's fp32 -> bf16 cast truncates: there a bf16 dst goes through an fp32 stand-in,
    # whose written elements torch casts back (untouched ones keep their bits, NaN payloads
    # included); compiled backends store bf16 directly
    dest = dst
    (dst,) = interpreter_float32(dst)
    before = dst.clone() if dst is not dest else None
    with device_guard(device):
        _gather_cache_kernel[(cdiv(dst.shape[0], block_t),)](
            src_cache, dst, block_table, cu_seq_lens,
            seq_starts if seq_starts is not None else cu_seq_lens, scale if fmt is not None else cu_seq_lens,
            dst.shape[0], batch, batch.bit_length(), num_blocks, block_table.shape[1], block_size,
            src_cache.stride(0), src_cache.stride(1), dst.stride(0), block_table.stride(0), width,
            BLOCK_T=block_t, BLOCK_D=block_d, HAS_STARTS=seq_starts is not None, DEQUANT=fmt is not None,
            PAGE_STARTS=False, num_warps=4,
        )
    if before is not None:  # interpreter only (a host-side comparison)
        written = dst.view(torch.int32) != before.view(torch.int32)
        dest[written] = dst[written].to(dest.dtype)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """vLLM's ``reshape_and_cache`` (``torch.ops._C_cache_ops``): store each token's key and value
    into vLLM's paged-attention cache layout (keys split in ``x``-element chunks, values
    transposed), in place.

    Token ``t`` with ``s = slot_mapping[t]`` in ``[0, num_blocks * block_size)`` writes, for ``d <
    D``, ``key_cache[s // block_size, h, d // x, s % block_size, d % x] = key[t, h, d]`` and
    ``value_cache[s // block_size, h, d, s % block_size] = value[t, h, d]``. Any other slot (-1
    padding, past the cache, int64 extremes) writes nothing. With an fp8 ``kv_cache_dtype`` each
    element is stored as ``x / scale`` in fp32, saturated, rounded to nearest even (vLLM's CUDA
    kernel's rule, the same as ``reshape_and_cache_flash``). Graph-safe: no host sync.

    Parameters
    ----------
    key : torch.Tensor
        ``[T_in, H_kv, D]`` fp16 / bf16 / fp32 keys, ``T_in >= T``; any strides with the last dim
        contiguous.
    value : torch.Tensor
        ``[T_in, H_kv, D]`` values, ``key``'s dtype, last dim contiguous.
    key_cache : torch.Tensor
        ``[num_blocks, H_kv, D // x, block_size, x]`` (vLLM: ``x = 16 // element_size``, any ``x``
        dividing ``D`` here): ``key``'s dtype with "auto", else fp8 in the format
        ``kv_cache_dtype`` names or uint8 holding it. Any strides with the last dim contiguous.
    value_cache : torch.Tensor
        ``[num_blocks, H_kv, D, block_size]``, ``key_cache``'s dtype, any strides.
    slot_mapping : torch.Tensor
        ``[T]`` int64 / int32 (contiguous): slot of each token, ``block * block_size + offset``.
    kv_cache_dtype : str
        ``"auto"``, ``"fp8"`` / ``"fp8_e4m3"`` (e4m3fn), ``"fp8_e5m2"``.
    k_scale, v_scale : torch.Tensor, optional
        One-element fp32 quantisation scales, required with fp8 (not read with "auto").
    """
    fmt = _fp8_format(kv_cache_dtype)
    check_tensor("key", key, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    rows, heads, head_dim = key.shape
    check_tensor("value", value, dtypes=(key.dtype,), shape=(rows, heads, head_dim), last_dim_contiguous=True)
    key_cache = _cache_view("key_cache", key_cache, fmt, key.dtype)
    check_tensor("key_cache", key_cache, ndim=5, last_dim_contiguous=True)
    num_blocks, _, _, block_size, x = key_cache.shape
    if x < 1 or head_dim % x or key_cache.shape[1:3] != (heads, head_dim // x):
        raise ValueError(f"key_cache must have shape [num_blocks, H_kv, D // x, block_size, x] with x dividing D = "
                         f"{head_dim} and H_kv = {heads}, got {list(key_cache.shape)}")
    value_cache = _cache_view("value_cache", value_cache, fmt, key.dtype)
    check_tensor("value_cache", value_cache, shape=(num_blocks, heads, head_dim, block_size))
    num_tokens, k_scale, v_scale, device = _kv_store_checks(key, value, key_cache, value_cache, slot_mapping, fmt,
                                                            k_scale, v_scale)
    if num_tokens == 0 or heads == 0 or head_dim == 0 or num_blocks * block_size == 0:
        return
    (key, value), quant, fp8_max = _store_mode(fmt, (key, value), (k_scale, v_scale), num_tokens)
    block_t, block_d = _token_tile(head_dim, _TILE_ELEMENTS // 2)
    with device_guard(device):  # the scales are not read unless QUANT (slot_mapping stands in)
        _reshape_and_cache_kernel[(cdiv(num_tokens, block_t), heads)](
            key, value, key_cache, value_cache, slot_mapping,
            k_scale if quant else slot_mapping, v_scale if quant else slot_mapping,
            num_tokens, num_blocks * block_size, block_size,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), key_cache.stride(3),
            value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), value_cache.stride(3),
            head_dim, X=x, BLOCK_T=block_t, BLOCK_D=block_d, QUANT=quant, FP8_MAX=fp8_max, num_warps=4,
        )


#: element size -> the integer dtype a bit copy moves
_BIT_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def gather_cache(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    batch_size: int,
    seq_starts: torch.Tensor | None = None,
) -> None:
    """vLLM's ``gather_cache`` / ``cp_gather_cache`` (``torch.ops._C_cache_ops``; vllm-xpu-kernels
    registers the first name, vLLM's MLA fp8-prefill path calls the second): copy each request's
    cached entries, bit for bit, into contiguous rows of ``dst``, in place.

    For request ``b < batch_size`` and ``i < cu_seq_lens[b + 1] - cu_seq_lens[b]``:
    ``dst[cu_seq_lens[b] + i] = src_cache[block_table[b, seq_starts[b] // block_size + i //
    block_size], i % block_size]`` (``seq_starts`` counts whole blocks, as in vLLM's kernel; None:
    0). A row whose block-table column lies past the table, whose block id lies outside ``[0,
    num_blocks)``, or whose ``seq_starts[b]`` is negative is written as 0; rows of ``dst`` outside
    every request (or past ``dst``) are left untouched. ``cu_seq_lens`` must be non-decreasing for
    this to hold; other values never make the kernel read or write outside its tensors.
    Graph-safe: no host sync.

    Parameters
    ----------
    src_cache : torch.Tensor
        ``[num_blocks, block_size, *entry]`` paged cache of any dtype (fp8 / uint8 caches
        included: a bit copy); the entry dims contiguous, the first two any strides.
    dst : torch.Tensor
        ``[N, *entry]`` destination, ``src_cache``'s dtype (or one of the same element size),
        entry dims contiguous.
    block_table : torch.Tensor
        ``[>= batch_size, max_blocks]`` int32 / int64 (last dim contiguous) block ids per request.
    cu_seq_lens : torch.Tensor
        ``[>= batch_size + 1]`` int32 / int64 (contiguous) cumulative lengths: request ``b``'s rows
        of ``dst`` are ``[cu_seq_lens[b], cu_seq_lens[b + 1])``.
    batch_size : int
        Requests gathered (a Python int, so no host sync).
    seq_starts : torch.Tensor, optional
        ``[>= batch_size]`` int32 / int64 (contiguous): each request's first gathered token; its
        block ``seq_starts[b] // block_size`` is the first one read (context chunks start on block
        boundaries in vLLM).
    """
    batch = check_int(batch_size, "batch_size", minimum=0)
    check_tensor("src_cache", src_cache, ndim=(3, 4, 5, 6))
    check_tensor("dst", dst, ndim=src_cache.dim() - 1)
    if tuple(dst.shape[1:]) != tuple(src_cache.shape[2:]):
        raise ValueError(f"dst must have shape [N, {', '.join(map(str, src_cache.shape[2:]))}] (src_cache's entry), "
                         f"got {list(dst.shape)}")
    if dst.element_size() != src_cache.element_size():
        raise TypeError(f"dst must have src_cache's dtype ({src_cache.dtype}), got {dst.dtype}")
    num_blocks, block_size = src_cache.shape[:2]
    width = int(torch.Size(src_cache.shape[2:]).numel())
    try:  # entries as flat rows of integers (views: dst is written in place, bit for bit)
        src_rows = src_cache.view(_BIT_DTYPES[src_cache.element_size()]).view(num_blocks, block_size, width)
        dst_rows = dst.view(_BIT_DTYPES[dst.element_size()]).view(dst.shape[0], width)
        if width > 1 and (src_rows.stride(2) != 1 or dst_rows.stride(1) != 1):
            raise RuntimeError
    except (RuntimeError, KeyError) as err:
        raise ValueError(f"src_cache / dst entries must be contiguous, got strides {src_cache.stride()} / "
                         f"{dst.stride()}") from err
    _check_request_tables(block_table, cu_seq_lens, seq_starts, batch)
    device = check_same_device(src_cache=src_cache, dst=dst, block_table=block_table, cu_seq_lens=cu_seq_lens,
                               seq_starts=seq_starts)
    if batch == 0 or dst.shape[0] == 0 or width == 0:
        return
    block_t, block_d = _token_tile(width)
    with device_guard(device):
        _gather_cache_kernel[(cdiv(dst.shape[0], block_t),)](
            src_rows, dst_rows, block_table, cu_seq_lens, seq_starts if seq_starts is not None else cu_seq_lens,
            cu_seq_lens, dst.shape[0], batch, batch.bit_length(), num_blocks, block_table.shape[1], block_size,
            src_rows.stride(0), src_rows.stride(1), dst_rows.stride(0), block_table.stride(0), width,
            BLOCK_T=block_t, BLOCK_D=block_d, HAS_STARTS=seq_starts is not None, DEQUANT=False, PAGE_STARTS=True,
            num_warps=4,
        )
