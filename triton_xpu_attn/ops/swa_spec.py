"""SWA speculative page tables: the per-draft-token page table that sliding-window layers use for
EAGLE tree verification (topk > 1), with the full-pool -> SWA-pool slot translation fused in.

Why this op exists: sglang's ``prepare_swa_spec_page_table_triton`` (PR 24617) concatenated
full-pool slots into the table that the sliding-window layers use to index the *SWA* pool, which
is smaller: an illegal memory access. Here the translation happens inside the same kernel
(``full_to_swa=``), and ``validate=True`` checks every produced slot against the SWA pool.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._common import (
    INDEX_DTYPES,
    MAX_GRID_DIM_1,
    cdiv,
    check_bool,
    check_positive_int,
    check_same_device,
    check_tensor,
    device_guard,
    next_power_of_2,
    register_xpu_compile,
)
from .page_table import _check_mapping, _translate_full_to_swa


@triton.jit
def _swa_spec_page_table_kernel(
    dst_ptr,
    stride_dst_row,
    stride_dst_col,
    dst_width,
    a_ptr,
    stride_a_row,
    stride_a_col,
    a_width,
    b_ptr,
    stride_b_row,
    stride_b_col,
    b_width,
    seq_len_a_ptr,
    seq_len_b_ptr,
    seq_start_a_ptr,
    num_draft_tokens,
    full_to_swa_ptr,
    mapping_len,
    err_ptr,
    swa_pool_size,
    LEN_A_PER_ROW: tl.constexpr,
    HAS_START: tl.constexpr,
    START_PER_ROW: tl.constexpr,
    HAS_MAPPING: tl.constexpr,
    VALIDATE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One destination row per program row; program column ``c`` handles tiles c, c + ncols, ...
    dst[m, :la] = A[r, s : s + la]; dst[m, la : la + lb] = B[m, :lb]; nothing past la + lb."""
    m = tl.program_id(0).to(tl.int64)
    col_prog = tl.program_id(1)
    num_col_progs = tl.num_programs(1)
    r = m // num_draft_tokens
    if LEN_A_PER_ROW:
        la = tl.load(seq_len_a_ptr + m).to(tl.int64)
    else:
        la = tl.load(seq_len_a_ptr + r).to(tl.int64)
    lb = tl.load(seq_len_b_ptr + m).to(tl.int64)
    la = tl.maximum(la, 0)  # negative lengths/starts count as 0 (validate=True rejects them)
    lb = tl.maximum(lb, 0)
    if HAS_START:
        if START_PER_ROW:
            start = tl.load(seq_start_a_ptr + m).to(tl.int64)
        else:
            start = tl.load(seq_start_a_ptr + r).to(tl.int64)
        start = tl.maximum(start, 0)
    total = tl.minimum(la + lb, dst_width)  # columns past the destination's width are dropped
    dst_row = dst_ptr + m * stride_dst_row
    a_row = a_ptr + r * stride_a_row
    b_row = b_ptr + m * stride_b_row
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    step = num_col_progs.to(tl.int64) * BLOCK
    for col0 in range(col_prog.to(tl.int64) * BLOCK, total, step):
        cols = col0 + tl.arange(0, BLOCK).to(tl.int64)
        produced = cols < total
        in_a = cols < la
        if HAS_START:
            a_col = start + cols
        else:
            a_col = cols  # keeps the A load's alignment visible to the compiler
        b_col = cols - la
        a_ok = produced & in_a & (a_col < a_width)  # reads past a table's width read 0
        b_ok = produced & (cols >= la) & (b_col < b_width)
        a_val = tl.load(a_row + a_col * stride_a_col, mask=a_ok, other=0).to(tl.int64)
        b_val = tl.load(b_row + b_col * stride_b_col, mask=b_ok, other=0).to(tl.int64)
        slot = tl.where(in_a, a_val, b_val)
        if HAS_MAPPING:
            slot = tl.where(a_ok | b_ok, _translate_full_to_swa(slot, full_to_swa_ptr, mapping_len).to(tl.int64), 0)
        tl.store(dst_row + cols * stride_dst_col, slot.to(dst_ptr.dtype.element_ty), mask=produced)
        if VALIDATE:
            bad += (produced & ((slot < 0) | (slot >= swa_pool_size))).to(tl.int32)
    if VALIDATE:
        tl.store(err_ptr + m * num_col_progs + col_prog, tl.sum(bad, axis=0))


_SWA_SPEC_I32 = dict(
    dst_ptr="*i32", stride_dst_row="i64", stride_dst_col="i32", dst_width="i32",
    a_ptr="*i32", stride_a_row="i64", stride_a_col="i32", a_width="i32",
    b_ptr="*i32", stride_b_row="i64", stride_b_col="i32", b_width="i32",
    seq_len_a_ptr="*i32", seq_len_b_ptr="*i32", seq_start_a_ptr="*i32", num_draft_tokens="i32",
    full_to_swa_ptr="*i64", mapping_len="i64", err_ptr="*i32", swa_pool_size="i64",
    LEN_A_PER_ROW=False, HAS_START=True, START_PER_ROW=True, HAS_MAPPING=True, VALIDATE=True, BLOCK=1024,
)
register_xpu_compile(_swa_spec_page_table_kernel, "i32,mapping,validate", _SWA_SPEC_I32, num_warps=4)
register_xpu_compile(
    _swa_spec_page_table_kernel,
    "i32,plain",
    {**_SWA_SPEC_I32, "full_to_swa_ptr": "*i32", "HAS_START": False, "START_PER_ROW": False, "HAS_MAPPING": False,
     "VALIDATE": False, "BLOCK": 128},
    num_warps=4,
)


def _block_for(width: int) -> int:
    return min(1024, max(128, next_power_of_2(width)))


def prepare_swa_spec_page_table(
    page_table_dst: torch.Tensor,
    page_table_a: torch.Tensor,
    page_table_b: torch.Tensor,
    seq_len_a: torch.Tensor,
    seq_len_b: torch.Tensor,
    num_draft_tokens: int,
    *,
    seq_start_a: torch.Tensor | None = None,
    full_to_swa: torch.Tensor | None = None,
    validate: bool = False,
    swa_pool_size: int | None = None,
) -> torch.Tensor:
    """Build the sliding-window page table of EAGLE tree verification (topk > 1), in place.

    Each draft token becomes its own one-query request whose KV sequence is "prefix + its ancestor
    draft tokens (itself included)". With ``ndt = num_draft_tokens``, ``M = seq_len_b.numel()``
    destination rows and parent request ``r = m // ndt`` of row ``m``::

        dst[m, 0 : la]       = page_table_a[r, s : s + la]    la = seq_len_a[r]  (or seq_len_a[m])
        dst[m, la : la + lb] = page_table_b[m, 0 : lb]        lb = seq_len_b[m]
        dst[m, la + lb :]    untouched                         s = seq_start_a[m] (or [r]; default 0)

    Reads past a source table's width give slot 0 (the pools' dummy slot, not translated).
    Negative lengths and starts count as 0. Columns at or past ``page_table_dst.shape[1]`` are
    dropped: whether ``la + lb`` fits cannot be decided from shapes (the lengths live on the
    device and may be 0), so the launch never reads them on the host; ``validate=True`` does and
    raises ``ValueError`` for a destination too narrow.

    With ``full_to_swa`` every copied slot ``x`` (from ``A`` or ``B``) is written as
    ``full_to_swa[x]`` by the same kernel (index -1 reads the mapping's last entry, -1; a slot
    outside the mapping gives -1), so the table indexes the SWA pool.

    Tables are **token-granular** (one slot per token), as sglang's ``req_to_token`` is. To attend
    over a paged pool ``k_cache [num_pages, page_size, H_kv, D]`` with such a table, pass the
    page-size-1 view ``k_cache.view(-1, 1, H_kv, D)`` (slot ``x`` = page ``x // page_size``,
    offset ``x % page_size``; needs the page and token dims to be contiguous with each other)
    together with ``cache_seqlens = la + lb`` and one query per row, e.g.
    ``flash_attn_with_kvcache(q, k_cache.view(-1, 1, H_kv, D), v_cache.view(-1, 1, H_kv, Dv),
    cache_seqlens=la + lb, page_table=dst, cu_seqlens_q=arange(M + 1), max_seqlen_q=1,
    causal=True, window_size=(W, 0))``.

    No host synchronisation unless ``validate=True``.

    Parameters
    ----------
    page_table_dst : torch.Tensor
        ``[M, max_len]`` int32/int64 destination, ``M = B * num_draft_tokens``, any strides;
        written in place (columns ``< min(la + lb, max_len)`` of each row only). Must not overlap
        the sources.
    page_table_a : torch.Tensor
        ``[B, len_a]`` int32/int64, any strides: the prefix (target-verify) table of each request,
        full-pool slots (token-granular).
    page_table_b : torch.Tensor
        ``[M, len_b]`` int32/int64, any strides: the expand table, the draft-token slots each
        draft token may see (visible ones first).
    seq_len_a : torch.Tensor
        ``[B]`` (per request) or ``[M]`` (per destination row) int32/int64: prefix lengths.
    seq_len_b : torch.Tensor
        ``[M]`` int32/int64: number of visible draft tokens of each row (the tree mask's row sum).
    num_draft_tokens : int
        Draft tokens per request (``ndt``); ``M`` must be a multiple of it.
    seq_start_a : torch.Tensor, optional
        ``[M]`` (per row) or ``[B]`` (per request) int32/int64: first column of ``page_table_a``
        to copy. Default 0.
    full_to_swa : torch.Tensor, optional
        ``[size_full + page_size + 1]`` int64 (or int32) full->SWA slot mapping whose last entry
        is -1 (sglang's ``full_to_swa_index_mapping``, as used by
        :func:`translate_loc_from_full_to_swa`). When given, the table holds SWA-pool slots.
    validate : bool
        Check the inputs' values, which **synchronises with the host**: lengths and starts must be
        non-negative, ``la + lb <= max_len``, and with ``swa_pool_size`` every produced slot must
        lie in ``[0, swa_pool_size)``. Raises ``ValueError`` otherwise (the slot check runs after
        the kernel, so ``page_table_dst`` has been written when it fails).
    swa_pool_size : int, optional
        Number of slots of the SWA pool (dim 0 of its token-granular K/V buffer, i.e.
        ``num_pages * page_size`` of a paged one). Only with ``validate=True``.

    Returns
    -------
    torch.Tensor
        ``page_table_dst``.
    """
    tables = dict(page_table_dst=page_table_dst, page_table_a=page_table_a, page_table_b=page_table_b)
    for name, t in tables.items():
        check_tensor(name, t, dtypes=INDEX_DTYPES, ndim=2)
    num_draft_tokens = check_positive_int(num_draft_tokens, "num_draft_tokens")
    check_tensor("seq_len_b", seq_len_b, dtypes=INDEX_DTYPES, ndim=1)
    rows = seq_len_b.shape[0]
    if rows % num_draft_tokens:
        raise ValueError(
            f"seq_len_b has {rows} entries, not a multiple of num_draft_tokens ({num_draft_tokens})"
        )
    batch = rows // num_draft_tokens
    check_tensor("seq_len_a", seq_len_a, dtypes=INDEX_DTYPES, ndim=1)
    if seq_len_a.shape[0] not in (batch, rows):
        raise ValueError(
            f"seq_len_a must have {batch} (per request) or {rows} (per destination row) entries, "
            f"got shape {list(seq_len_a.shape)}"
        )
    if seq_start_a is not None:
        check_tensor("seq_start_a", seq_start_a, dtypes=INDEX_DTYPES, ndim=1)
        if seq_start_a.shape[0] not in (batch, rows):
            raise ValueError(
                f"seq_start_a must have {rows} (per destination row) or {batch} (per request) entries, "
                f"got shape {list(seq_start_a.shape)}"
            )
    if page_table_a.shape[0] != batch:
        raise ValueError(f"page_table_a must have {batch} rows (one per request), got shape {list(page_table_a.shape)}")
    if page_table_b.shape[0] != rows:
        raise ValueError(f"page_table_b must have {rows} rows (one per draft token), got shape {list(page_table_b.shape)}")
    if page_table_dst.shape[0] != rows:
        raise ValueError(
            f"page_table_dst must have {rows} rows (one per draft token), got shape {list(page_table_dst.shape)}"
        )
    if full_to_swa is not None:
        _check_mapping(full_to_swa)
    validate = check_bool(validate, "validate")
    if swa_pool_size is not None:
        swa_pool_size = check_positive_int(swa_pool_size, "swa_pool_size")
        if not validate:
            raise ValueError("swa_pool_size is only used with validate=True")
    device = check_same_device(
        **tables, seq_len_a=seq_len_a, seq_len_b=seq_len_b, seq_start_a=seq_start_a, full_to_swa=full_to_swa
    )

    width = page_table_dst.shape[1]
    if validate:
        _validate_lengths(seq_len_a, seq_len_b, seq_start_a, num_draft_tokens, rows, width)
    if rows == 0 or width == 0:
        return page_table_dst

    block = _block_for(width)
    col_progs = min(cdiv(width, block), MAX_GRID_DIM_1)  # wider tables loop inside the program
    check_slots = validate and swa_pool_size is not None
    # placeholders (never dereferenced) for the pointers a variant does not use: no extra launches
    err = torch.zeros(rows * col_progs, dtype=torch.int32, device=device) if check_slots else seq_len_b
    mapping = full_to_swa if full_to_swa is not None else seq_len_b
    start = seq_start_a if seq_start_a is not None else seq_len_b
    with device_guard(device):
        _swa_spec_page_table_kernel[(rows, col_progs)](
            page_table_dst, page_table_dst.stride(0), page_table_dst.stride(1), width,
            page_table_a, page_table_a.stride(0), page_table_a.stride(1), page_table_a.shape[1],
            page_table_b, page_table_b.stride(0), page_table_b.stride(1), page_table_b.shape[1],
            seq_len_a, seq_len_b, start, num_draft_tokens,
            mapping, mapping.numel(), err, swa_pool_size if check_slots else 0,
            LEN_A_PER_ROW=seq_len_a.shape[0] == rows,
            HAS_START=seq_start_a is not None,
            START_PER_ROW=seq_start_a is not None and seq_start_a.shape[0] == rows,
            HAS_MAPPING=full_to_swa is not None,
            VALIDATE=check_slots,
            BLOCK=block,
            num_warps=4,
        )
    if check_slots:
        bad_rows = err.view(rows, col_progs).sum(1).nonzero().flatten()
        if bad_rows.numel():
            m = int(bad_rows[0])
            la = int(seq_len_a[m if seq_len_a.shape[0] == rows else m // num_draft_tokens])
            n = min(la + int(seq_len_b[m]), width)
            row = page_table_dst[m, :n].cpu().long()
            col = int(((row < 0) | (row >= swa_pool_size)).nonzero()[0])
            hint = "" if full_to_swa is not None else " (full-pool slots? pass full_to_swa=)"
            raise ValueError(
                f"{bad_rows.numel()} destination row(s) hold slots outside the SWA pool [0, {swa_pool_size}){hint}: "
                f"first page_table_dst[{m}, {col}] = {int(row[col])}"
            )
    return page_table_dst


def _validate_lengths(seq_len_a, seq_len_b, seq_start_a, num_draft_tokens, rows, width) -> None:
    """Host-side (synchronising) value checks of ``validate=True``."""
    for name, t in (("seq_len_a", seq_len_a), ("seq_len_b", seq_len_b), ("seq_start_a", seq_start_a)):
        if t is not None and t.numel() and bool((t < 0).any()):
            raise ValueError(f"{name} must be non-negative, got {t.min().item()}")
    if rows == 0:
        return
    la = seq_len_a.long()
    if la.shape[0] != rows:
        la = la.repeat_interleave(num_draft_tokens)
    total = la + seq_len_b.long()
    if bool((total > width).any()):
        m = int(total.argmax())
        raise ValueError(
            f"page_table_dst is too narrow: row {m} needs seq_len_a + seq_len_b = {int(total[m])} columns, "
            f"page_table_dst has {width}"
        )
