"""KV-cache gathers of vLLM's attention backends (vllm-xpu-kernels' ``_C_cache_ops``):
``gather_and_maybe_dequant_cache`` (MLA cache -> contiguous rows, fp8 dequantised) and
``gather_cache`` (entries of any dtype copied bit for bit, block-granular starts), one kernel. The
checks and kernel helpers they share with the stores are ``kv_cache.py``'s.

Block tables, ``cu_seq_lens`` and ``seq_starts`` are device data that the kernel never trusts: a
gathered row whose block-table column or block id lies outside its table / cache reads as 0. No op
reads a device value on the host, so every call is graph-safe.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._common import (
    FLOAT_DTYPES,
    cdiv,
    check_int,
    check_same_device,
    check_tensor,
    device_guard,
    interpreter_float32,
    register_xpu_compile,
)
from .kv_cache import _cache_view, _check_request_tables, _check_scale, _fp8_format, _request_rows, _token_tile


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


def _register_compile_variants() -> None:
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


_register_compile_variants()


# ---- launchers ----


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
