"""What the KV-cache ops of vLLM's attention backends (vllm-xpu-kernels' ``_C_cache_ops``) share:
the ``kv_cache_dtype`` formats, the checks of caches, slot mappings and per-request tables, the
token tiles, and the kernel helpers that find a token's slot (``_token_slots``), store rows
(``_store_rows``) and find a row's request (``request_of``, ``_request_rows``). The stores
(``reshape_and_cache_flash``, ``reshape_and_cache``, ``concat_and_cache_mla``) live in
``kv_cache_store.py``, the gathers (``gather_and_maybe_dequant_cache``, ``gather_cache``) in
``kv_cache_gather.py``; ``indexer_cache.py`` and ``append_kv.py`` use these helpers too.

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

from .._common import FLOAT_DTYPES, INDEX_DTYPES, check_tensor, fp8_cast, next_power_of_2

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
                BLOCK_D: tl.constexpr, QUANT: tl.constexpr, FP8_MAX: tl.constexpr, INTEL_GPU: tl.constexpr):
    """``dst[dst_row[i] + d] = src[t[i] * stride_src_t + d]`` for ``d < width`` on rows ``ok``
    (quantised as ``clamp(x / scale, -FP8_MAX, FP8_MAX)`` when ``QUANT``, converted by
    ``fp8_cast``: e4m3 in integer arithmetic with ``INTEL_GPU``); other rows untouched."""
    for d0 in range(0, width, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (d[None, :] < width)
        x = tl.load(src_ptr + t[:, None] * stride_src_t + d[None, :], mask=mask, other=0.0)
        if QUANT:
            x = tl.minimum(tl.maximum(x.to(tl.float32) / scale, -FP8_MAX), FP8_MAX)
        tl.store(dst_ptr + dst_row[:, None] + d[None, :], fp8_cast(x, dst_ptr, INTEL_GPU), mask=mask)


@triton.jit
def _token_slots(slot_ptr, num_tokens, num_slots, block_size, BLOCK_T: tl.constexpr):
    """Tokens of this program, whether each has a slot inside the cache, its block and offset."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.load(slot_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    ok = (slot >= 0) & (slot < num_slots)
    slot = tl.where(ok, slot, 0)
    return t, ok, slot // block_size, slot % block_size


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


# ---- host-side checks and tiles ----


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
