"""DeepSeek sparse attention (DSA) top-k selection: ``fast_topk_v2``, ``fast_topk_transform_fused``,
``fast_topk_transform_ragged_fused``, ``topk_transform_512`` and ``topk_transform_512_v2``, drop-ins
for sgl-kernel-xpu's ``sgl_kernel`` functions of those names (``python/sgl_kernel/top_k.py``).

Each row ``b`` of ``score [B, W]`` (the indexer's logits) selects the ``topk`` largest scores of its
section ``score[b, s : s + n]`` (``s = row_starts[b]``, ``n = lengths[b]``, both clipped to the
row: ``s`` to ``[0, W]``, ``n`` to ``[0, W - s]``). Positions are relative to ``s``; the ops then
return them as they are, mapped through a page-size-1 page table, shifted by a ragged offset, or
mapped through a paged table (the 512 variants). The selection contract (``reference.topk_select``):

* ``n <= topk``: positions ``0 .. n-1``, then ``-1`` (no score is read, NaN or not);
* ``n > topk``: exactly ``topk`` positions, in ascending order: every position whose score is above
  the ``topk``-th largest, then the lowest positions among those equal to it. ``+0`` and ``-0`` are
  equal; NaN ranks below every number (``-inf`` included): it is selected only where fewer than
  ``topk`` positions hold numbers.

The kernels, their launcher ``_select`` and the sizes they use live in ``topk_select.py``.

The transform of a selected position ``j`` (and of ``0 .. n-1`` in short rows) happens where the
position is written: no page-table entry is read for a position that is not selected, none outside
the table (a position past its columns gives ``-1``), and page-table values are copied, never
followed. Nothing reads a device value on the host: every launch is graph-capturable.
"""
from __future__ import annotations

import torch

from .._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_int,
    check_page_size,
    check_same_device,
    check_tensor,
)
from .topk_select import MODE_PAGE_TABLE, MODE_PAGED, MODE_RAGGED, _select

#: the largest ``topk`` the ops take (upstream: 2048 for the ``fast_topk`` family, up to 2048 for
#: the 512 variants)
MAX_TOPK = 2048


def _check_topk(topk, name: str = "topk") -> int:
    topk = check_int(topk, name, minimum=1)
    if topk > MAX_TOPK:
        raise ValueError(f"{name} must be at most {MAX_TOPK}, got {topk}")
    return topk


def _check_rows(score_name: str, score, lengths_name: str, lengths, row_starts=None) -> tuple:
    check_tensor(score_name, score, dtypes=FLOAT_DTYPES, ndim=2)
    rows, width = score.shape
    if width >= 2**31:
        raise ValueError(f"{score_name} rows must hold fewer than 2^31 columns, got {width}")
    if lengths_name == "seq_lens" and isinstance(lengths, torch.Tensor) and lengths.dim() == 2:
        check_tensor(lengths_name, lengths, dtypes=INDEX_DTYPES, shape=(rows, 1))
        lengths = lengths[:, 0]
    check_tensor(lengths_name, lengths, dtypes=INDEX_DTYPES, shape=(rows,))
    if row_starts is not None:
        check_tensor("row_starts", row_starts, dtypes=INDEX_DTYPES, shape=(rows,))
    return rows, width, lengths


def _output(out, rows: int, topk: int, **inputs) -> torch.Tensor:
    """``out`` checked (``[rows, topk]`` int32, last dim contiguous) or allocated, on the inputs'
    device (checked)."""
    if out is not None:
        check_tensor("out", out, dtypes=(torch.int32,), shape=(rows, topk), last_dim_contiguous=True)
    device = check_same_device(**inputs, out=out)
    return out if out is not None else torch.empty((rows, topk), dtype=torch.int32, device=device)


def fast_topk_v2(
    score: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    row_starts: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Positions of the ``topk`` largest scores of each row's section (DeepSeek sparse attention's
    indexer top-k; sgl-kernel-xpu drop-in).

    Row ``b``'s section is ``score[b, s : s + n]`` with ``s = row_starts[b]`` (0 without
    ``row_starts``) and ``n = lengths[b]``, clipped to the row (``s`` to ``[0, W]``, ``n`` to
    ``[0, W - s]``: a length past the row, a negative length or start, never reads outside it).

    Parameters
    ----------
    score : torch.Tensor
        ``[B, W]`` fp32 (fp16 / bf16 taken as fp32) logits between each query row and the keys,
        paged (one row per query, keys from column 0) or ragged (``row_starts``). Any strides.
    lengths : torch.Tensor
        ``[B]`` int32 (or int64): positions in each row's section.
    topk : int
        Positions to select per row, 1 to 2048 (upstream: 2048 only).
    row_starts : torch.Tensor, optional
        ``[B]`` int32 (or int64): first column of each row's section (ragged keys).
    out : torch.Tensor, optional
        ``[B, topk]`` int32 with a contiguous last dim to write the result into (this package's
        extension; upstream allocates it). Every element is written.

    Returns
    -------
    torch.Tensor
        ``[B, topk]`` int32 positions relative to the row's start. A row with ``n <= topk`` gives
        ``0 .. n-1`` then ``-1`` (its scores are not read); a longer row gives exactly ``topk``
        positions in ascending order: those whose score is above the ``topk``-th largest, then the
        lowest positions among those equal to it (``+0 == -0``; NaN ranks below ``-inf``, selected
        only where fewer than ``topk`` positions hold numbers).
    """
    rows, _, lengths = _check_rows("score", score, "lengths", lengths, row_starts)
    topk = _check_topk(topk)
    out = _output(out, rows, topk, score=score, lengths=lengths, row_starts=row_starts)
    _select(score, lengths, row_starts, topk, out)
    return out


def fast_topk_transform_fused(
    score: torch.Tensor,
    lengths: torch.Tensor,
    page_table_size_1: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    topk: int,
    row_starts: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`fast_topk_v2`'s selection mapped through a page-size-1 page table: entry ``i`` of row
    ``b`` is ``page_table_size_1[r, j]`` for its selected position ``j`` (sgl-kernel-xpu drop-in).

    Parameters
    ----------
    score, lengths, topk, row_starts
        As :func:`fast_topk_v2` (``row_starts`` moves the section in ``score`` only: the page
        table is read at the relative position ``j``).
    page_table_size_1 : torch.Tensor
        ``[R, C]`` int32 cache slot of each request's token positions (any strides). Its values are
        copied, never followed; a position ``j >= C`` gives ``-1``.
    cu_seqlens_q : torch.Tensor
        ``[R + 1]`` int32 (or int64) query offsets: row ``b`` belongs to request ``r`` with
        ``cu_seqlens_q[r] <= b < cu_seqlens_q[r + 1]`` (``R <= B``). As upstream, without
        ``row_starts`` and with ``R == B`` (decode) row ``b`` reads request ``b`` directly; a row
        inside no request reads request 0. Offsets out of order pick some request in ``[0, R)``.
    out : torch.Tensor, optional
        As :func:`fast_topk_v2`.

    Returns
    -------
    torch.Tensor
        ``[B, topk]`` int32 cache slots, ``-1`` for padding (rows with ``n < topk``).
    """
    rows, _, lengths = _check_rows("score", score, "lengths", lengths, row_starts)
    topk = _check_topk(topk)
    check_tensor("page_table_size_1", page_table_size_1, dtypes=(torch.int32,), ndim=2)
    check_tensor("cu_seqlens_q", cu_seqlens_q, dtypes=INDEX_DTYPES, ndim=1)
    n_req = cu_seqlens_q.shape[0] - 1
    if n_req < 0 or n_req > rows:
        raise ValueError(f"cu_seqlens_q must hold R + 1 offsets for R <= {rows} requests (score's rows), "
                         f"got {cu_seqlens_q.shape[0]} entries")
    if page_table_size_1.shape[0] != n_req:
        raise ValueError(f"page_table_size_1 must have one row per request ({n_req}, from cu_seqlens_q), "
                         f"got shape {list(page_table_size_1.shape)}")
    out = _output(out, rows, topk, score=score, lengths=lengths, page_table_size_1=page_table_size_1,
                  cu_seqlens_q=cu_seqlens_q, row_starts=row_starts)
    _select(score, lengths, row_starts, topk, out, mode=MODE_PAGE_TABLE, page_table=page_table_size_1,
            cu=cu_seqlens_q, direct_request=row_starts is None and n_req == rows)
    return out


def fast_topk_transform_ragged_fused(
    score: torch.Tensor,
    lengths: torch.Tensor,
    topk_indices_offset: torch.Tensor,
    topk: int,
    row_starts: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`fast_topk_v2`'s selection shifted into ragged KV: entry ``i`` of row ``b`` is
    ``j + topk_indices_offset[b]`` for its selected position ``j`` (sgl-kernel-xpu drop-in).

    Parameters
    ----------
    score, lengths, topk, row_starts
        As :func:`fast_topk_v2`.
    topk_indices_offset : torch.Tensor
        ``[B]`` int32: where each row's keys start in the ragged KV (int32 sums wrap, as upstream's).
    out : torch.Tensor, optional
        As :func:`fast_topk_v2`.

    Returns
    -------
    torch.Tensor
        ``[B, topk]`` int32 ragged KV rows, ``-1`` for padding.
    """
    rows, _, lengths = _check_rows("score", score, "lengths", lengths, row_starts)
    topk = _check_topk(topk)
    check_tensor("topk_indices_offset", topk_indices_offset, dtypes=(torch.int32,), shape=(rows,))
    out = _output(out, rows, topk, score=score, lengths=lengths, topk_indices_offset=topk_indices_offset,
                  row_starts=row_starts)
    _select(score, lengths, row_starts, topk, out, mode=MODE_RAGGED, offsets=topk_indices_offset)
    return out


def topk_transform_512(
    scores: torch.Tensor,
    seq_lens: torch.Tensor,
    page_tables: torch.Tensor,
    out_page_indices: torch.Tensor,
    page_size: int,
    out_raw_indices: torch.Tensor | None = None,
) -> None:
    """Top-k of each row's first ``seq_lens[b]`` scores mapped through a paged table, written in
    place (DeepSeek-V4's indexer; sgl-kernel-xpu's ``topk_transform_512``, ``topk`` up to 2048).

    Entry ``i`` of row ``b`` is ``(page_tables[b, j // page_size] << log2(page_size)) |
    (j % page_size)`` (int32, as upstream) for its selected position ``j``, chosen as in
    :func:`fast_topk_v2` (section ``scores[b, :seq_lens[b]]``, clipped to the row).

    Parameters
    ----------
    scores : torch.Tensor
        ``[B, W]`` fp32 (fp16 / bf16 taken as fp32) logits. Any strides.
    seq_lens : torch.Tensor
        ``[B]`` or ``[B, 1]`` int32 (or int64): positions per row.
    page_tables : torch.Tensor
        ``[B, P]`` int32 physical page of each logical page (any strides). Values are copied into
        the result, never followed; a position whose page lies past column ``P`` gives ``-1``.
    out_page_indices : torch.Tensor
        ``[B, topk]`` int32, last dim contiguous: written with the cache slots, ``-1`` padding.
        ``topk = out_page_indices.shape[1]``, 1 to 2048.
    page_size : int
        Tokens per page: a power of two from 1 to 2048.
    out_raw_indices : torch.Tensor, optional
        ``[B, topk]`` int32, last dim contiguous: written with the selected positions ``j``
        (``-1`` padding).
    """
    rows, _, seq_lens = _check_rows("scores", scores, "seq_lens", seq_lens)
    check_tensor("page_tables", page_tables, dtypes=(torch.int32,), ndim=2)
    if page_tables.shape[0] != rows:
        raise ValueError(f"page_tables must have one row per score row ({rows}), got shape {list(page_tables.shape)}")
    check_tensor("out_page_indices", out_page_indices, dtypes=(torch.int32,), ndim=2, last_dim_contiguous=True)
    if out_page_indices.shape[0] != rows:
        raise ValueError(f"out_page_indices must have {rows} rows (scores' rows), got shape "
                         f"{list(out_page_indices.shape)}")
    topk = _check_topk(out_page_indices.shape[1], "out_page_indices.shape[1] (topk)")
    page_size = check_page_size(page_size)
    if out_raw_indices is not None:
        check_tensor("out_raw_indices", out_raw_indices, dtypes=(torch.int32,), shape=(rows, topk),
                     last_dim_contiguous=True)
    check_same_device(scores=scores, seq_lens=seq_lens, page_tables=page_tables, out_page_indices=out_page_indices,
                      out_raw_indices=out_raw_indices)
    _select(scores, seq_lens, None, topk, out_page_indices, raw=out_raw_indices, mode=MODE_PAGED,
            page_table=page_tables, page_bits=page_size.bit_length() - 1)


def topk_transform_512_v2(
    scores: torch.Tensor,
    seq_lens: torch.Tensor,
    page_tables: torch.Tensor,
    out_page_indices: torch.Tensor,
    page_size: int,
    metadata: torch.Tensor,
    out_raw_indices: torch.Tensor | None = None,
) -> None:
    """:func:`topk_transform_512` with sgl-kernel-xpu's ``_v2`` signature: ``metadata`` (upstream:
    ``[B + 1, 2]`` int32 scheduling metadata) is taken and not used, as upstream's XPU kernel does."""
    check_tensor("metadata", metadata)
    topk_transform_512(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
