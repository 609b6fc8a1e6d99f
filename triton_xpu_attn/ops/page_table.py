"""Page tables: token-granular ``req_to_token`` -> page-granular tables, and full-pool -> SWA-pool
slot translation, both on the device.

Why this op exists: passing a token-granular table where a page-granular one is expected (sglang
PR 23757) or full-pool slots where SWA slots are expected (sglang PR 24617) silently corrupts
attention. These kernels do the conversion once, in one launch, without host syncs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._common import (
    INDEX_DTYPES,
    MAX_GRID_DIM_1,
    cdiv,
    check_page_size,
    check_same_device,
    check_tensor,
    device_guard,
    register_xpu_compile,
)

_MAX_DIMS = 4  # translate_loc_from_full_to_swa handles inputs of up to this many dimensions


@triton.jit
def _translate_full_to_swa(slot, full_to_swa_ptr, mapping_len):
    """Full-pool slot -> SWA-pool slot. Index -1 wraps to the mapping's last entry (which is -1),
    like the torch indexing it replaces; a slot outside the mapping gives -1, never a wild read."""
    idx = slot.to(tl.int64)
    idx = tl.where(idx < 0, idx + mapping_len, idx)
    inside = (idx >= 0) & (idx < mapping_len)
    return tl.load(full_to_swa_ptr + tl.where(inside, idx, 0), mask=inside, other=-1)


@triton.jit
def _normalize_page_table_kernel(
    req_to_token_ptr,
    stride_rt_row,
    stride_rt_col,
    rt_rows,
    rt_width,
    req_pool_indices_ptr,
    full_to_swa_ptr,
    mapping_len,
    out_ptr,
    stride_out_row,
    max_pages,
    PAGE_SIZE: tl.constexpr,
    HAS_MAPPING: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``out[b, p] = req_to_token[req_pool_indices[b], p * P] // P`` (floor division, the slot
    translated first with a mapping) for every column inside ``req_to_token``; 0 past its width; a
    pool index outside ``req_to_token``'s rows is never followed: its row is -1 (a page id outside
    any pool, which the attention ops turn into NaN rows). Program column ``c`` handles column
    tiles c, c + ncols, ...: the grid's second axis stays within its limit however wide ``out``."""
    b = tl.program_id(0)
    row = tl.load(req_pool_indices_ptr + b).to(tl.int64)
    row_ok = (row >= 0) & (row < rt_rows)
    rt_row = req_to_token_ptr + tl.where(row_ok, row, 0) * stride_rt_row
    out_row = out_ptr + b.to(tl.int64) * stride_out_row
    step = tl.num_programs(1).to(tl.int64) * BLOCK
    for p0 in range(tl.program_id(1).to(tl.int64) * BLOCK, max_pages, step):
        pages = p0 + tl.arange(0, BLOCK).to(tl.int64)  # 64-bit: no wrap near a width of 2^31
        first_token = pages * PAGE_SIZE
        valid = first_token < rt_width
        slot = tl.load(rt_row + first_token * stride_rt_col, mask=valid, other=0)
        if HAS_MAPPING:
            slot = _translate_full_to_swa(slot, full_to_swa_ptr, mapping_len)
        # floor division, as torch's `//` (-1, an untranslatable slot, stays -1); written on positive
        # operands only, since compiled Triton truncates a negative quotient
        page = tl.where(slot < 0, -((PAGE_SIZE - 1 - slot) // PAGE_SIZE), slot // PAGE_SIZE)
        page = tl.where(valid, page, 0)
        page = tl.where(row_ok, page, -1)
        tl.store(out_row + pages, page.to(tl.int32), mask=pages < max_pages)


@triton.jit
def _translate_loc_kernel(
    locs_ptr,
    numel,
    size1,
    size2,
    size3,
    stride0,
    stride1,
    stride2,
    stride3,
    full_to_swa_ptr,
    mapping_len,
    out_ptr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < numel
    # unravel the flat (row-major) index so any strides of `locs` are honoured
    i3 = i % size3
    i2 = (i // size3) % size2
    i1 = (i // (size3 * size2)) % size1
    i0 = i // (size3 * size2 * size1)
    loc = tl.load(locs_ptr + i0 * stride0 + i1 * stride1 + i2 * stride2 + i3 * stride3, mask=mask, other=0)
    tl.store(out_ptr + i, _translate_full_to_swa(loc, full_to_swa_ptr, mapping_len).to(tl.int32), mask=mask)


register_xpu_compile(
    _normalize_page_table_kernel,
    "P16,mapping",
    dict(
        req_to_token_ptr="*i32", stride_rt_row="i64", stride_rt_col="i32", rt_rows="i32", rt_width="i32",
        req_pool_indices_ptr="*i64", full_to_swa_ptr="*i64", mapping_len="i64",
        out_ptr="*i32", stride_out_row="i32", max_pages="i32", PAGE_SIZE=16, HAS_MAPPING=True, BLOCK=128,
    ),
    num_warps=4,
)
register_xpu_compile(
    _translate_loc_kernel,
    "i64",
    dict(
        locs_ptr="*i64", numel="i64", size1="i64", size2="i64", size3="i64", stride0="i64", stride1="i64",
        stride2="i64", stride3="i64", full_to_swa_ptr="*i64", mapping_len="i64", out_ptr="*i32", BLOCK=1024,
    ),
    num_warps=4,
)


def _check_mapping(full_to_swa: torch.Tensor) -> None:
    check_tensor("full_to_swa", full_to_swa, dtypes=INDEX_DTYPES, ndim=1)
    if full_to_swa.numel() == 0:
        raise ValueError("full_to_swa must not be empty (its last entry is the -1 marker)")
    if full_to_swa.stride(0) != 1:
        raise ValueError("full_to_swa must be contiguous")


def normalize_page_table(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    max_pages: int | None = None,
    out: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
) -> torch.Tensor:
    """Build a page-granular page table from sglang's token-granular ``req_to_token``.

    The result equals the expression it replaces in sglang's XPU backend,
    ``req_to_token[req_pool_indices][:, ::P][:, :max_pages] // P``, on every column that
    expression defines (every ``p`` with ``p * P < req_to_token.shape[1]``), bitwise, whatever
    ``seq_lens`` says: columns past a request's pages keep ``req_to_token``'s values (divided),
    as engines that compare tables expect. Columns beyond ``req_to_token``'s width are 0 (the
    pool's dummy page). The allocator keeps each page's slots contiguous and page-aligned, so the
    first slot of a page names the page. ``//`` is floor division, as torch's (a slot of -1
    gives -1). With ``full_to_swa`` each slot is translated first:
    ``full_to_swa[req_to_token[req_pool_indices][:, ::P][:, :max_pages]] // P``, a slot outside
    the mapping giving -1.

    Parameters
    ----------
    req_to_token : torch.Tensor
        ``[pool_rows, max_context_len]`` int32/int64: slot of token ``pos`` of a request row
        (token-granular, any strides).
    req_pool_indices : torch.Tensor
        ``[B]`` int32/int64: which row of ``req_to_token`` each request uses. An index outside
        ``[0, pool_rows)`` is never followed: that request's row of the result is all -1 (a page
        id the attention ops never follow either: their rows for it are NaN).
    seq_lens : torch.Tensor
        ``[B]`` int32/int64: KV length of each request (tokens, including new ones); only sizes
        the default width. The values are not checked (no ``validate``): a length past
        ``req_to_token``'s width (impossible metadata: 2^31 - 1, a huge int64) is clamped to that
        width and a negative one to 0, so the default width never exceeds the
        ``cdiv(req_to_token.shape[1], page_size)`` pages the table can hold (the rows are what
        the table holds, as for any length) and no impossible length sizes a larger allocation
        or grid.
    page_size : int
        Tokens per page, a power of two from 1 to 2048.
    max_pages : int, optional
        Width of the result. Default ``cdiv(max(seq_lens), page_size)`` with the lengths clamped
        as above, i.e. at most ``cdiv(req_to_token.shape[1], page_size)`` (sglang's expression is
        never wider either; 0 for an empty batch), which reads ``seq_lens`` on the host; give
        ``max_pages`` (or ``out``) to keep the call free of host syncs. An explicit width is
        kept: columns past the table are 0.
    out : torch.Tensor, optional
        ``[B, max_pages]`` int32 destination (last dim contiguous); every element is written.
    full_to_swa : torch.Tensor, optional
        ``[size_full + page_size + 1]`` int64 full->SWA slot mapping whose last entry is -1 (sglang's
        ``full_to_swa_index_mapping``). When given, each slot is translated before the division,
        giving a page table of the SWA pool.

    Returns
    -------
    torch.Tensor
        ``[B, max_pages]`` int32 page table (``out`` when given).
    """
    check_page_size(page_size)
    check_tensor("req_to_token", req_to_token, dtypes=INDEX_DTYPES, ndim=2)
    check_tensor("req_pool_indices", req_pool_indices, dtypes=INDEX_DTYPES, ndim=1)
    batch = req_pool_indices.shape[0]
    check_tensor("seq_lens", seq_lens, dtypes=INDEX_DTYPES, shape=(batch,))
    if full_to_swa is not None:
        _check_mapping(full_to_swa)
    device = check_same_device(
        req_to_token=req_to_token, req_pool_indices=req_pool_indices, seq_lens=seq_lens, full_to_swa=full_to_swa, out=out
    )
    if out is not None:
        check_tensor("out", out, dtypes=(torch.int32,), ndim=2, last_dim_contiguous=True)
        if out.shape[0] != batch:
            raise ValueError(f"out must have {batch} rows (one per request), got shape {list(out.shape)}")
        if max_pages is not None and max_pages != out.shape[1]:
            raise ValueError(f"max_pages ({max_pages}) must equal out.shape[1] ({out.shape[1]})")
        max_pages = out.shape[1]
    elif max_pages is None:
        # sglang's width, read on the host (the documented sync), clamped to what req_to_token
        # holds before it sizes anything: an impossible length (2^31 - 1, -5) must not size the
        # allocation or the grid
        longest = int(seq_lens.max().item()) if batch else 0
        max_pages = min(max(cdiv(longest, page_size), 0), cdiv(req_to_token.shape[1], page_size))
    if isinstance(max_pages, bool) or not isinstance(max_pages, int) or max_pages < 0:
        raise ValueError(f"max_pages must be a non-negative int, got {max_pages!r}")
    if out is None:
        out = torch.empty((batch, max_pages), dtype=torch.int32, device=device)
    if batch == 0 or max_pages == 0:
        return out
    block = 128
    col_progs = min(cdiv(max_pages, block), MAX_GRID_DIM_1)  # wider tables loop inside the program
    mapping = full_to_swa if full_to_swa is not None else out  # placeholder pointer, never read
    with device_guard(device):
        _normalize_page_table_kernel[(batch, col_progs)](
            req_to_token,
            req_to_token.stride(0),
            req_to_token.stride(1),
            req_to_token.shape[0],
            req_to_token.shape[1],
            req_pool_indices,
            mapping,
            mapping.numel(),
            out,
            out.stride(0),
            max_pages,
            PAGE_SIZE=page_size,
            HAS_MAPPING=full_to_swa is not None,
            BLOCK=block,
            num_warps=4,
        )
    return out


def translate_loc_from_full_to_swa(full_to_swa: torch.Tensor, locs: torch.Tensor) -> torch.Tensor:
    """Translate full-pool slots to SWA-pool slots: ``full_to_swa[locs].to(int32)``.

    Parameters
    ----------
    full_to_swa : torch.Tensor
        ``[size_full + page_size + 1]`` int64 mapping; its last entry is -1, so ``locs == -1``
        (sglang's "no slot") translates to -1. Slots outside the mapping also give -1.
    locs : torch.Tensor
        int32/int64 full-pool slots, any shape (up to 4 dimensions) and any strides.

    Returns
    -------
    torch.Tensor
        int32 tensor of ``locs.shape`` (contiguous) holding the SWA-pool slots.
    """
    _check_mapping(full_to_swa)
    check_tensor("locs", locs, dtypes=INDEX_DTYPES)
    if locs.dim() > _MAX_DIMS:
        raise ValueError(f"locs must have at most {_MAX_DIMS} dimensions, got shape {list(locs.shape)}")
    device = check_same_device(full_to_swa=full_to_swa, locs=locs)
    out = torch.empty(locs.shape, dtype=torch.int32, device=device)
    numel = locs.numel()
    if numel == 0:
        return out
    pad = _MAX_DIMS - locs.dim()
    sizes = [1] * pad + list(locs.shape)
    strides = [0] * pad + list(locs.stride())
    block = 1024
    with device_guard(device):
        _translate_loc_kernel[(cdiv(numel, block),)](
            locs, numel, sizes[1], sizes[2], sizes[3], *strides, full_to_swa, full_to_swa.numel(), out,
            BLOCK=block, num_warps=4,
        )
    return out
