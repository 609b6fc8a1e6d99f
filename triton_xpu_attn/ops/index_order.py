"""Index lists reordered for cache locality: ``order_by_bucket`` groups each list of a sparse
attention's indices by the region of the cache its entries name (``index >> shift``), ascending,
keeping the list's order inside a group; the sparse prefill (``mla_sparse_prefill.py``) attends
through the reordered lists when its cache is larger than the GPU's L2 cache.

Why: the sparse kernel walks each token's list in order, and the programs that run together read
whatever rows their lists name next. With lists in the indexer's order (any order) those rows lie
anywhere in the cache, so a cache several times the L2 size is read from DRAM nearly every time;
grouped lists make every program sweep the cache from low to high rows at about the same pace, so
programs running together read rows of the same region, one L2-sized share of the cache at a time.
The attention result does not depend on the order of the entries (a sum over them), only its
rounding does.

On an H100 (2026-11-28, ``bench/experiments/index_order.py``): s_q 1024, 16 heads, topk 2048 over
131072 rows of 576 bf16 channels: 720 us with random-order lists, 579 us sorted, 582 us in 8 or 16
buckets (597 us in 4); rows of 8192 (all in L2) gained nothing.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device
from .._common import cdiv, device_guard, next_power_of_2, register_xpu_compile

#: lists longer than this keep their order (a bucket's count must fit in 15 bits)
MAX_TOPK = 16384
#: the kernel groups into at most this many buckets (16-bit counts, four to an int64, four int64s) ...
MAX_BUCKETS = 16
#: ... and the prefill asks for at most this many: each four buckets more cost another count word
#: (an H100, 1024 lists of 2048: 4 / 8 / 16 buckets 21 / 25 / 34 us) and 8 buckets over a 144 MiB
#: cache read as fast as 16 (581 / 580 us)
CHOSEN_MAX_BUCKETS = 8
#: buckets are made this many times smaller than the L2 cache ...
L2_SHARE = 4
#: ... whose size, where torch does not report it (XPU), is taken to be this
DEFAULT_L2_BYTES = 32 << 20


@triton.jit
def _chunk_buckets(row, stride_i_k, start, n, num_rows, shift, CHUNK: tl.constexpr):
    """Entries ``[start, start + CHUNK)`` of a list: ``(k, listed, valid, idx, bucket)``, an entry
    that counts but names no row in bucket 0 (the attention kernel skips it wherever it lies)."""
    k = start + tl.arange(0, CHUNK)
    listed = k < n
    idx = tl.load(row + k.to(tl.int64) * stride_i_k, mask=listed, other=-1).to(tl.int64)
    valid = listed & (idx >= 0) & (idx < num_rows)
    return k, listed, valid, idx, tl.where(valid, idx >> shift, 0).to(tl.int32)


@triton.jit
def _word_prefix(counts, base):
    """16-bit field ``j`` of the result: ``base`` plus the fields of ``counts`` below ``j`` (no
    field carries: every sum is at most topk < 2^15)."""
    return (counts << 16) + (counts << 32) + (counts << 48) + base * 0x0001000100010001


@triton.jit
def _word_total(counts):
    """The sum of the four 16-bit fields of ``counts``."""
    return (counts + (counts >> 16) + (counts >> 32) + (counts >> 48)) & 0xFFFF


@triton.jit
def _bucket_bit(bucket, CHUNK: tl.constexpr):
    """Each entry's 1 in its bucket's 16-bit field of the bucket's word (``bucket & 3``)."""
    return tl.full([CHUNK], 1, dtype=tl.int64) << ((bucket & 3) * 16).to(tl.int64)


@triton.jit
def _place_word(next_w, one, bucket, listed, dest, W: tl.constexpr):
    """Destinations of a chunk's entries in buckets ``4W .. 4W + 3`` (their next free slots
    ``next_w``, 16-bit fields), and ``next_w`` moved past them."""
    mine = listed & ((bucket >> 2) == W)
    packed = tl.where(mine, one, 0)
    before = tl.cumsum(packed, axis=0) - packed  # earlier entries of the chunk in the same bucket
    dest = tl.where(mine, ((next_w + before) >> ((bucket & 3) * 16).to(tl.int64)) & 0xFFFF, dest)
    return dest, next_w + tl.sum(packed, axis=0)


@triton.jit
def _bucket_order_kernel(
    idx_ptr,  # [tokens, heads, topk] int32 / int64 (any strides)
    stride_i_t,
    stride_i_h,
    stride_i_k,
    length_ptr,  # [tokens] entries of each list that count (read when HAS_LENGTH)
    stride_len,
    out_ptr,  # [tokens, heads, topk] int32, contiguous
    topk,
    num_rows,  # an index outside [0, num_rows) is written as -1
    shift,  # an entry's bucket: index >> shift (< NUM_BUCKETS)
    NUM_BUCKETS: tl.constexpr,  # 1 .. 16
    CHUNK: tl.constexpr,  # entries a step
    HAS_LENGTH: tl.constexpr,
):
    # a counting sort by bucket in two passes over the list: the buckets' sizes, then each entry's
    # slot (its bucket's start + the entries of its bucket before it), four buckets' counts to an
    # int64 in 16-bit fields (counts <= topk <= MAX_TOPK); entries past the list's length keep
    # their places (they follow the n counted ones) and are written as -1
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    n = topk
    if HAS_LENGTH:
        n = tl.minimum(tl.maximum(tl.load(length_ptr + t * stride_len), 0), topk)
    row = idx_ptr + t * stride_i_t + h * stride_i_h
    out_row = out_ptr + (t * tl.num_programs(1) + h) * topk
    zero = tl.sum(tl.zeros([CHUNK], dtype=tl.int64), axis=0)
    c0 = zero
    c1 = zero
    c2 = zero
    c3 = zero
    for start in range(0, n, CHUNK):
        k, listed, valid, idx, bucket = _chunk_buckets(row, stride_i_k, start, n, num_rows, shift, CHUNK)
        one = tl.where(listed, _bucket_bit(bucket, CHUNK), 0)
        word = bucket >> 2
        c0 += tl.sum(tl.where(word == 0, one, 0), axis=0)
        if NUM_BUCKETS > 4:
            c1 += tl.sum(tl.where(word == 1, one, 0), axis=0)
        if NUM_BUCKETS > 8:
            c2 += tl.sum(tl.where(word == 2, one, 0), axis=0)
            c3 += tl.sum(tl.where(word == 3, one, 0), axis=0)
    # each bucket's first slot: the entries of the words before its own, then of the buckets
    # before it in its word
    before1 = _word_total(c0)
    before2 = before1 + _word_total(c1)
    n0 = _word_prefix(c0, zero)
    n1 = _word_prefix(c1, before1)
    n2 = _word_prefix(c2, before2)
    n3 = _word_prefix(c3, before2 + _word_total(c2))
    for start in range(0, n, CHUNK):
        k, listed, valid, idx, bucket = _chunk_buckets(row, stride_i_k, start, n, num_rows, shift, CHUNK)
        one = _bucket_bit(bucket, CHUNK)
        dest = k.to(tl.int64)
        dest, n0 = _place_word(n0, one, bucket, listed, dest, 0)
        if NUM_BUCKETS > 4:
            dest, n1 = _place_word(n1, one, bucket, listed, dest, 1)
        if NUM_BUCKETS > 8:
            dest, n2 = _place_word(n2, one, bucket, listed, dest, 2)
            dest, n3 = _place_word(n3, one, bucket, listed, dest, 3)
        # dest is a permutation of [0, n) over the listed entries; the bound guards the store
        tl.store(out_row + dest, tl.where(valid, idx, -1).to(tl.int32), mask=listed & (dest < n))
    for start in range((n // CHUNK) * CHUNK, topk, CHUNK):
        k = start + tl.arange(0, CHUNK)
        tl.store(out_row + k, tl.full([CHUNK], -1, dtype=tl.int32), mask=(k >= n) & (k < topk))


#: warps a program: one, whose scans over a chunk are shuffles alone (no barrier), so that many
#: programs fit on a compute unit; entries a step (a chunk), by backend, with no spill: sm_90 256
#: (189 registers; on an H100 1024 lists of 2048 in 8 buckets took 24.6 us, 28.7 in 128-entry
#: chunks), Intel GPUs (16-lane sub-groups) 64 (0 B spilled on pvc and bmg at 128 GRF; 128-entry
#: chunks spill 4-5 KB there)
NUM_WARPS = 1
CHUNK = {"xpu": 64}
DEFAULT_CHUNK = 256


def _chunk(backend: str) -> int:
    return CHUNK.get(backend, DEFAULT_CHUNK)


def _register_compile_variants():
    register_xpu_compile(
        _bucket_order_kernel, "int32,buckets16,topk_length",
        dict(idx_ptr="*i32", stride_i_t="i64", stride_i_h="i32", stride_i_k="i32", length_ptr="*i32", stride_len="i32",
             out_ptr="*i32", topk="i32", num_rows="i32", shift="i32", NUM_BUCKETS=16, CHUNK=_chunk("xpu"), HAS_LENGTH=True),
        num_warps=NUM_WARPS)


_register_compile_variants()


def locality_buckets(num_rows: int, row_bytes: int, lists: int, topk: int, device) -> int:
    """How many buckets ``order_by_bucket`` should group ``lists`` index lists of ``topk`` entries
    over a cache of ``num_rows`` rows of ``row_bytes`` by: 0 (keep the given order) where the cache
    is at most half the L2 cache, the lists are too few to fill the GPU or too long for one
    program's counts, or under the interpreter; else a power of two making a bucket at most
    1 / ``L2_SHARE`` of the L2 cache, at most ``CHOSEN_MAX_BUCKETS``."""
    if _device.backend() == "interpreter" or not 2 <= topk <= MAX_TOPK:
        return 0
    l2 = _device.l2_cache_bytes(device) or DEFAULT_L2_BYTES
    cache = num_rows * row_bytes
    if 2 * cache <= l2 or lists < _device.compute_units(device):
        return 0
    return min(CHOSEN_MAX_BUCKETS, next_power_of_2(cdiv(cache * L2_SHARE, l2)))


def order_by_bucket(indices: torch.Tensor, num_rows: int, buckets: int,
                    topk_length: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``indices [tokens, heads, topk]`` (int32 / int64, any strides) with each list grouped by
    bucket (internal; the caller has checked its arguments).

    Parameters
    ----------
    indices : torch.Tensor
        ``[tokens, heads, topk]`` index lists, ``topk <= MAX_TOPK``.
    num_rows : int
        Rows of the cache the lists name: an entry outside ``[0, num_rows)`` comes back as -1.
    buckets : int
        A power of two from 1 to ``MAX_BUCKETS``: entry ``i`` lies in bucket ``i >> shift``, the
        cache split into ``buckets`` equal power-of-two spans.
    topk_length : torch.Tensor, optional
        ``[tokens]``: list ``t`` counts only its first ``topk_length[t]`` entries (clamped to
        ``[0, topk]``); the rest come back as -1 after them.
    out : torch.Tensor, optional
        ``[tokens, heads, topk]`` int32, contiguous, to write the result into.

    Returns
    -------
    torch.Tensor
        ``[tokens, heads, topk]`` int32, contiguous: each list's counted entries (invalid ones as
        -1, in bucket 0) ordered by bucket, stably; then -1 for the entries that do not count. The
        same ``topk_length`` applies to it.
    """
    tokens, heads, topk = indices.shape
    if out is None:
        out = torch.empty((tokens, heads, topk), dtype=torch.int32, device=indices.device)
    if out.numel() == 0:
        return out
    shift = max(0, (max(num_rows, 1) - 1).bit_length() - (buckets.bit_length() - 1))
    with device_guard(indices.device):
        _bucket_order_kernel[(tokens, heads)](
            indices, *indices.stride(),
            topk_length if topk_length is not None else indices, topk_length.stride(0) if topk_length is not None else 0,
            out, topk, num_rows, shift,
            NUM_BUCKETS=buckets, CHUNK=_chunk(_device.backend()), HAS_LENGTH=topk_length is not None,
            num_warps=NUM_WARPS,
        )
    return out
