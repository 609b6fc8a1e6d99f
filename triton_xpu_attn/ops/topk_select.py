"""DeepSeek sparse attention (DSA) top-k: the selection kernels and their launcher ``_select``,
which the ops of ``topk.py`` (``fast_topk_v2`` and the transforms) call. The selection contract is
``topk.py``'s (``reference.topk_select``); this module holds how it is computed, the geometry
constants that size it (``ONESHOT_MAX``, ``GROUPS``, ``CAPACITY``, ``ROWS_PER_LAUNCH``,
``STREAM_BLOCK``, ``MAX_SPLITS``, ``SPLIT_MIN_POSITIONS``: read by ``_select`` at each call) and the
kernels' XPU compile variants.

Kernels compare order-preserving int32 keys of the fp32 scores (``_order_key``). The ``topk``-th
largest key is found by bisection over the key bits (``_kth_largest``, one bit a step) on a
register-resident set:

* rows no wider than ``ONESHOT_MAX`` (``_topk_select_kernel`` with ``ONESHOT``): the whole section,
  one program per row, one read of the scores;
* wider rows, two kernels per group of at most ``ROWS_PER_LAUNCH`` rows: ``_topk_candidates_kernel``
  reads the section once taking the running maximum of ``GROUPS`` strided groups (position ``j`` in
  group ``j % GROUPS``); the ``topk``-th largest group maximum ``v`` bounds the threshold from below
  (at least ``topk`` groups hold a score ``>= v``), and for scores without structure only about
  ``GROUPS * ln(GROUPS / (GROUPS - topk))`` positions reach it (2800 for topk 2048), whatever the
  row's width. A second read compacts the positions whose key is ``>= v`` (and their keys) into
  scratch, in order; ``_topk_select_kernel`` then bisects over those candidates. Fewer rows than
  the device has units are read by several programs each (``_topk_group_max_kernel`` writes each
  split's group maxima, the candidates kernel folds them, then each program compacts its own range). Where more than
  ``CAPACITY`` positions reach ``v`` (heavy ties, or scores shaped to defeat the groups) the select
  kernel streams the row instead: the threshold is ``v`` itself when fewer than ``topk`` keys
  exceed it, else found by bisection over the row (16 reads); one more read writes the selection.
  Exact in every case, fast in the common one.

The transform of a selected position happens in ``_emit`` (``MODE``), where the position is written.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device
from .. import tune
from .._common import device_guard, next_power_of_2, register_xpu_compile

#: rows at most this wide are selected in one read, whole in registers (a power of two <= 16384)
ONESHOT_MAX = 8192
#: strided groups whose maxima bound the threshold of a wider row (a power of two >= 2 * topk, <= 16384)
GROUPS = 4096
#: candidates a wider row keeps for the exact bisection (a power of two >= topk, <= 16384): unstructured
#: rows of any width keep about 2800 for topk 2048 (module docstring); more overflow to the streamed row
CAPACITY = 4096
#: rows per pair of launches of the two-kernel path (scratch: 8 * CAPACITY bytes a row)
ROWS_PER_LAUNCH = 1024
#: positions a streaming step reads at once (a power of two <= 16384: counts share int32 fields)
STREAM_BLOCK = 8192
#: requests a step of the row -> request search reads (``cu_seqlens_q``)
REQUEST_BLOCK = 1024
#: few wide rows are read by up to this many programs each (splits of one row)
MAX_SPLITS = 32
#: ... each reading at least this many positions
SPLIT_MIN_POSITIONS = 16384

# what the transform does with a selected position j (kernel constexpr MODE)
MODE_INDEX, MODE_PAGE_TABLE, MODE_RAGGED, MODE_PAGED = 0, 1, 2, 3

_I32_MIN = tl.constexpr(-2147483648)


@triton.jit
def _zero(dtype: tl.constexpr):
    """A scalar 0 of ``dtype`` that a loop may carry (an argument specialised to the constant 1
    would make ``arg * 0`` a constant)."""
    return tl.sum(tl.zeros([1], dtype=dtype), axis=0)


@triton.jit
def _order_key(x):
    """int32 keys whose signed order is the order of the scores ``x`` (any float dtype, taken as
    fp32): ``+0`` and ``-0`` share a key, NaN (either sign) gets the lowest key, below ``-inf``."""
    bits = x.to(tl.float32).to(tl.int32, bitcast=True)
    bits = tl.where(bits == _I32_MIN, 0, bits)  # -0 -> +0
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: magnitude bits flipped
    return tl.where(x != x, _I32_MIN, key)


@triton.jit
def _kth_largest(keys, k):
    """A threshold ``t`` (int32 scalar) whose selection is the ``k`` largest of ``keys`` (entries
    that do not count hold ``_I32_MIN``, which no candidate threshold reaches): the largest ``t``
    with ``#{key >= t} >= k`` (``_I32_MIN`` when no larger ``t`` has ``k``), found one bit a step,
    or, earlier, a ``t > _I32_MIN`` with ``#{key >= t} == k`` exactly. Either selects the same keys
    (all above ``t``, then the first ties at ``t``): once exactly ``k`` keys reach ``t`` they are
    the ``k`` largest, whatever the remaining bits. Scores without structure stop after about 20
    of the 32 steps (the search's block reductions bound a single program's time)."""
    t = _zero(tl.int64) - 2147483648  # offset 0 in unsigned order
    reached = _zero(tl.int32) - 1  # #{key >= t} once t has been raised (-1: not yet)
    step = _zero(tl.int32)
    while (step < 32) & (reached != k):
        c = t + ((_zero(tl.int64) + 1) << (31 - step))
        count = tl.sum((keys >= c.to(tl.int32)).to(tl.int32), axis=0)
        t = tl.where(count >= k, c, t)
        reached = tl.where(count >= k, count, reached)
        step += 1
    return t.to(tl.int32)


@triton.jit
def _section(len_ptr, stride_len, rs_ptr, stride_rs, row, width, HAS_ROW_STARTS: tl.constexpr):
    """(positions ``n`` as int32, first column ``s`` as int64) of a row's section, clipped to the
    row: ``s`` to ``[0, width]``, ``n`` to ``[0, width - s]``."""
    length = tl.load(len_ptr + row * stride_len).to(tl.int64)
    if HAS_ROW_STARTS:
        start = tl.minimum(tl.maximum(tl.load(rs_ptr + row * stride_rs).to(tl.int64), 0), width)
    else:
        start = row * 0
    n = tl.minimum(tl.maximum(length, 0), width - start)
    return n.to(tl.int32), start


@triton.jit
def _emit(out_row, raw_row, slot, j, keep, valid, pt_row, stride_ptc, pt_cols, offset, page_bits,
          MODE: tl.constexpr, HAS_RAW: tl.constexpr):
    """Store slots ``slot`` (where ``keep``) of one output row: position ``j`` transformed by
    ``MODE`` where ``valid``, else -1. ``pt_row``: the page-table row (MODE 1, 3; ``pt_cols`` its
    columns, 0 when the row has none); ``offset``: the ragged offset (MODE 2)."""
    if MODE == 0:
        val = j
    elif MODE == 1:
        inside = valid & (j < pt_cols)
        val = tl.load(pt_row + j.to(tl.int64) * stride_ptc, mask=inside & keep, other=-1)
    elif MODE == 2:
        val = j + offset
    else:
        page = j >> page_bits
        inside = valid & (page < pt_cols)
        pid = tl.load(pt_row + page.to(tl.int64) * stride_ptc, mask=inside & keep, other=0)
        val = tl.where(inside, (pid << page_bits) | (j & ((1 << page_bits) - 1)), -1)
    tl.store(out_row + slot, tl.where(valid, val, -1), mask=keep)
    if HAS_RAW:
        tl.store(raw_row + slot, tl.where(valid, j, -1), mask=keep)


@triton.jit
def _emit_selected(keys, idx, valid, t, k, out_row, raw_row, pt_row, stride_ptc, pt_cols, offset, page_bits,
                   MODE: tl.constexpr, HAS_RAW: tl.constexpr):
    """Write the ``k`` selected of a register-resident set (``keys``, positions ``idx`` ascending,
    ``valid``; ``t`` its ``k``-th largest key): keys above ``t``, then the first ties, in order."""
    gt = valid & (keys > t)
    eq = valid & (keys == t)
    need = k - tl.sum(gt.to(tl.int32), axis=0)
    packed = eq.to(tl.int32) + (gt.to(tl.int32) << 16)  # at most 32768 entries: fields do not carry
    before = tl.cumsum(packed, axis=0) - packed
    eq_before = before & 0xFFFF
    sel = gt | (eq & (eq_before < need))
    slot = (before >> 16) + tl.minimum(eq_before, need)
    _emit(out_row, raw_row, slot, idx, sel, sel, pt_row, stride_ptc, pt_cols, offset, page_bits, MODE, HAS_RAW)


@triton.jit
def _stream_kth_largest(row_ptr, stride_sc, n, k, BLOCK: tl.constexpr):
    """``_kth_largest`` over a whole section read from memory: two bits a step (three counts packed
    in int64, 21-bit fields per block), one read a step."""
    t = _zero(tl.int64) - 2147483648
    b = tl.arange(0, BLOCK)
    for step in range(16):
        unit = (_zero(tl.int64) + 1) << (30 - 2 * step)
        c1 = (t + unit).to(tl.int32)
        c2 = (t + 2 * unit).to(tl.int32)
        c3 = (t + 3 * unit).to(tl.int32)
        n1 = _zero(tl.int64)
        n2 = _zero(tl.int64)
        n3 = _zero(tl.int64)
        for c in range(0, n, BLOCK):
            ok = c + b < n
            key = _order_key(tl.load(row_ptr + (c + b).to(tl.int64) * stride_sc, mask=ok, other=0.0))
            packed = ((ok & (key >= c1)).to(tl.int64) + ((ok & (key >= c2)).to(tl.int64) << 21)
                      + ((ok & (key >= c3)).to(tl.int64) << 42))
            total = tl.sum(packed, axis=0)
            n1 += total & 0x1FFFFF
            n2 += (total >> 21) & 0x1FFFFF
            n3 += total >> 42
        d = tl.where(n3 >= k, 3, tl.where(n2 >= k, 2, tl.where(n1 >= k, 1, 0)))
        t = t + d.to(tl.int64) * unit
    return t.to(tl.int32)


@triton.jit
def _stream_emit(row_ptr, stride_sc, n, t, k, out_row, raw_row, pt_row, stride_ptc, pt_cols, offset, page_bits,
                 MODE: tl.constexpr, HAS_RAW: tl.constexpr, BLOCK: tl.constexpr):
    """``_emit_selected`` over a section read from memory (``t`` its ``k``-th largest key)."""
    b = tl.arange(0, BLOCK)
    need = _zero(tl.int32) + k
    gt_base = _zero(tl.int32)
    eq_base = _zero(tl.int32)
    for c in range(0, n, BLOCK):  # keys above t first: how many there are decides the ties taken
        ok = c + b < n
        key = _order_key(tl.load(row_ptr + (c + b).to(tl.int64) * stride_sc, mask=ok, other=0.0))
        need -= tl.sum((ok & (key > t)).to(tl.int32), axis=0)
    for c in range(0, n, BLOCK):
        j = c + b
        ok = j < n
        key = _order_key(tl.load(row_ptr + j.to(tl.int64) * stride_sc, mask=ok, other=0.0))
        gt = ok & (key > t)
        eq = ok & (key == t)
        packed = eq.to(tl.int32) + (gt.to(tl.int32) << 16)
        before = tl.cumsum(packed, axis=0) - packed
        eq_before = eq_base + (before & 0xFFFF)
        sel = gt | (eq & (eq_before < need))
        slot = gt_base + (before >> 16) + tl.minimum(eq_before, need)
        _emit(out_row, raw_row, slot, j, sel, sel, pt_row, stride_ptc, pt_cols, offset, page_bits, MODE, HAS_RAW)
        total = tl.sum(packed, axis=0)
        gt_base += total >> 16
        eq_base += total & 0xFFFF


@triton.jit
def _group_maxima(base, stride_sc, n, first, step, GROUPS: tl.constexpr):
    """Running maxima of the keys of positions ``j % GROUPS``, over the chunks of ``GROUPS``
    positions from ``first`` every ``step`` positions (two chunks' loads in flight at a time)."""
    g = tl.arange(0, GROUPS)
    acc = tl.full([GROUPS], _I32_MIN, dtype=tl.int32)
    for c in range(first, n, 2 * step):
        ok0 = c + g < n
        ok1 = c + step + g < n
        x0 = tl.load(base + (c + g).to(tl.int64) * stride_sc, mask=ok0, other=0.0)
        x1 = tl.load(base + (c + step + g).to(tl.int64) * stride_sc, mask=ok1, other=0.0)
        acc = tl.maximum(acc, tl.maximum(tl.where(ok0, _order_key(x0), _I32_MIN), tl.where(ok1, _order_key(x1), _I32_MIN)))
    return acc


@triton.jit
def _topk_group_max_kernel(
    score_ptr, stride_sr, stride_sc, width, len_ptr, stride_len, rs_ptr, stride_rs,
    max_ptr,  # [rows * SPLITS, GROUPS] int32: each split's group maxima
    row0, topk,
    HAS_ROW_STARTS: tl.constexpr, GROUPS: tl.constexpr, SPLITS: tl.constexpr,
):
    """Program ``(r, p)``: the group maxima of split ``p`` of row ``row0 + r`` (every
    ``SPLITS``-th chunk of ``GROUPS`` positions), stored as its own row (the candidates kernel
    folds the splits: no fill, no atomics)."""
    r = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    row = row0 + r
    n, start = _section(len_ptr, stride_len, rs_ptr, stride_rs, row, width, HAS_ROW_STARTS)
    if n > topk:
        acc = _group_maxima(score_ptr + row * stride_sr + start * stride_sc, stride_sc, n, p * GROUPS,
                            SPLITS * GROUPS, GROUPS)
        tl.store(max_ptr + (r * SPLITS + p) * GROUPS + tl.arange(0, GROUPS), acc)


@triton.jit
def _topk_candidates_kernel(
    score_ptr, stride_sr, stride_sc, width,  # [B, W] scores
    len_ptr, stride_len, rs_ptr, stride_rs,  # [B] lengths, [B] row starts (read when HAS_ROW_STARTS)
    max_ptr,  # [rows * SPLITS, GROUPS] int32 group maxima of each split (SPLITS > 1: the group-max kernel's)
    skey_ptr, sidx_ptr,  # [rows * SPLITS, CAPACITY] int32 scratch: candidates' keys and positions
    meta_ptr,  # [rows * SPLITS, 4] int32 scratch: candidates, bound v, keys above v
    row0, topk,
    HAS_ROW_STARTS: tl.constexpr, GROUPS: tl.constexpr, CAPACITY: tl.constexpr, BLOCK: tl.constexpr,
    SPLITS: tl.constexpr,
):
    """Program ``(r, p)`` for row ``row0 + r`` wider than ``topk``: the bound ``v`` from the
    strided groups' maxima, then the positions of split ``p`` (a contiguous range) with key
    ``>= v`` compacted in order (the first ``CAPACITY`` of them) and counted."""
    r = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    row = row0 + r
    region = r * SPLITS + p
    n, start = _section(len_ptr, stride_len, rs_ptr, stride_rs, row, width, HAS_ROW_STARTS)
    if n > topk:
        base = score_ptr + row * stride_sr + start * stride_sc
        g = tl.arange(0, GROUPS)
        if SPLITS == 1:
            acc = _group_maxima(base, stride_sc, n, 0, GROUPS, GROUPS)
        else:
            acc = tl.load(max_ptr + r * SPLITS * GROUPS + g)
            for q in range(1, SPLITS):
                acc = tl.maximum(acc, tl.load(max_ptr + (r * SPLITS + q) * GROUPS + g))
        v = _kth_largest(acc, topk)
        span = tl.cdiv(tl.cdiv(n, SPLITS), BLOCK) * BLOCK
        lo = p * span
        hi = tl.minimum(lo + span, n)
        b = tl.arange(0, BLOCK)
        m = _zero(tl.int32)
        above = _zero(tl.int32)
        for c in range(lo, hi, BLOCK):
            j = c + b
            ok = j < hi
            key = _order_key(tl.load(base + j.to(tl.int64) * stride_sc, mask=ok, other=0.0))
            packed = (ok & (key >= v)).to(tl.int32) + ((ok & (key > v)).to(tl.int32) << 16)
            pos = m + (tl.cumsum(packed, axis=0) & 0xFFFF) - 1
            keep = ((packed & 1) != 0) & (pos < CAPACITY)
            tl.store(skey_ptr + region * CAPACITY + pos, key, mask=keep)
            tl.store(sidx_ptr + region * CAPACITY + pos, j, mask=keep)
            total = tl.sum(packed, axis=0)
            m += total & 0xFFFF
            above += total >> 16
        tl.store(meta_ptr + region * 4, m)
        tl.store(meta_ptr + region * 4 + 1, v)
        tl.store(meta_ptr + region * 4 + 2, above)


@triton.jit
def _select_candidates(skey_ptr, sidx_ptr, meta_ptr, r, m, k, out_row, raw_row, pt_row, stride_ptc, pt_cols, offset,
                       page_bits, MODE: tl.constexpr, HAS_RAW: tl.constexpr, CAPACITY: tl.constexpr,
                       SPLITS: tl.constexpr):
    """The ``k`` selected of row ``r``'s ``m <= CAPACITY`` candidates (the splits' scratch regions
    of ``CAPACITY`` entries, joined in order: positions ascending)."""
    i = tl.arange(0, CAPACITY)
    keys = tl.full([CAPACITY], _I32_MIN, dtype=tl.int32)
    idx = tl.zeros([CAPACITY], dtype=tl.int32)
    first = _zero(tl.int32)
    for p in range(SPLITS):
        region = r * SPLITS + p
        count = tl.load(meta_ptr + region * 4)
        inside = (i >= first) & (i < first + count)
        keys = tl.where(inside, tl.load(skey_ptr + region * CAPACITY + (i - first), mask=inside), keys)
        idx = tl.where(inside, tl.load(sidx_ptr + region * CAPACITY + (i - first), mask=inside), idx)
        first += count
    t = _kth_largest(keys, k)
    _emit_selected(keys, idx, i < m, t, k, out_row, raw_row, pt_row, stride_ptc, pt_cols, offset, page_bits, MODE,
                   HAS_RAW)


@triton.jit
def _topk_select_kernel(
    score_ptr, stride_sr, stride_sc, width,  # [B, W] scores
    len_ptr, stride_len, rs_ptr, stride_rs,  # [B] lengths, [B] row starts (read when HAS_ROW_STARTS)
    out_ptr, stride_or,  # [B, topk] int32 (slots contiguous)
    raw_ptr, stride_rr,  # [B, topk] int32 raw positions (written when HAS_RAW)
    pt_ptr, stride_ptr, stride_ptc, pt_rows, pt_cols,  # page table (MODE 1: [requests, C]; MODE 3: [B, pages])
    cu_ptr, stride_cu, n_req,  # [requests + 1] query offsets (MODE 1 unless DIRECT_REQUEST)
    off_ptr, stride_off,  # [B] int32 ragged offsets (MODE 2)
    page_bits,  # log2(page_size) (MODE 3)
    skey_ptr, sidx_ptr, meta_ptr,  # the candidates kernel's scratch (not ONESHOT)
    row0, topk,
    HAS_ROW_STARTS: tl.constexpr, MODE: tl.constexpr, DIRECT_REQUEST: tl.constexpr, HAS_RAW: tl.constexpr,
    ONESHOT: tl.constexpr, CAPACITY: tl.constexpr, TOPK_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
    REQUEST_BLOCK: tl.constexpr, SPLITS: tl.constexpr,
):
    """One program per row ``row0 + program_id(0)``: its ``topk`` output slots. ``ONESHOT``: the
    section (at most ``CAPACITY`` positions) is read whole; else the candidates kernel's scratch is
    read, or the row streamed where it overflowed."""
    r = tl.program_id(0).to(tl.int64)
    row = row0 + r
    n, start = _section(len_ptr, stride_len, rs_ptr, stride_rs, row, width, HAS_ROW_STARTS)
    out_row = out_ptr + row * stride_or
    raw_row = raw_ptr + row * stride_rr
    pt_row = pt_ptr
    cols = pt_cols
    offset = 0
    if MODE == 1:
        if DIRECT_REQUEST:
            req = row
        else:
            # the request whose query rows hold this row: #{i >= 1 : cu[i] <= row}; a row before
            # cu[0] or past cu[n_req] belongs to none and reads request 0 (as upstream)
            below = _zero(tl.int64)
            for s in range(0, n_req, REQUEST_BLOCK):
                i = s + tl.arange(0, REQUEST_BLOCK)
                bound = tl.load(cu_ptr + (i + 1).to(tl.int64) * stride_cu, mask=i < n_req, other=0)
                below += tl.sum(((i < n_req) & (bound.to(tl.int64) <= row)).to(tl.int64), axis=0)
            req = tl.where(below < n_req, below, 0)
        pt_row = pt_ptr + req * stride_ptr
        cols = tl.where(req < pt_rows, pt_cols, 0)
    elif MODE == 2:
        offset = tl.load(off_ptr + row * stride_off)
    elif MODE == 3:
        pt_row = pt_ptr + row * stride_ptr
    row_ptr = score_ptr + row * stride_sr + start * stride_sc
    if n <= topk:
        slot = tl.arange(0, TOPK_BLOCK)
        _emit(out_row, raw_row, slot, slot, slot < topk, slot < n, pt_row, stride_ptc, cols, offset, page_bits, MODE,
              HAS_RAW)
    else:
        i = tl.arange(0, CAPACITY)
        if ONESHOT:
            valid = i < n
            keys = _order_key(tl.load(row_ptr + i.to(tl.int64) * stride_sc, mask=valid, other=0.0))
            keys = tl.where(valid, keys, _I32_MIN)
            t = _kth_largest(keys, topk)
            _emit_selected(keys, i, valid, t, topk, out_row, raw_row, pt_row, stride_ptc, cols, offset, page_bits,
                           MODE, HAS_RAW)
        else:
            m = _zero(tl.int32)
            above = _zero(tl.int32)
            for p in range(SPLITS):
                m += tl.load(meta_ptr + (r * SPLITS + p) * 4)
                above += tl.load(meta_ptr + (r * SPLITS + p) * 4 + 2)
            if m <= CAPACITY:  # the common case (unstructured scores: ~2800 for topk 2048)
                _select_candidates(skey_ptr, sidx_ptr, meta_ptr, r, m, topk, out_row, raw_row, pt_row, stride_ptc, cols,
                                   offset, page_bits, MODE, HAS_RAW, CAPACITY, SPLITS)
            else:
                t = tl.load(meta_ptr + r * SPLITS * 4 + 1)
                if above >= topk:  # the threshold lies above the bound
                    t = _stream_kth_largest(row_ptr, stride_sc, n, topk, BLOCK)
                _stream_emit(row_ptr, stride_sc, n, t, topk, out_row, raw_row, pt_row, stride_ptc, cols, offset,
                             page_bits, MODE, HAS_RAW, BLOCK)


def _register_compile_variants():
    rows = dict(
        score_ptr="*fp32", stride_sr="i64", stride_sc="i32", width="i32",
        len_ptr="*i32", stride_len="i32", rs_ptr="*i32", stride_rs="i32", row0="i32", topk="i32", HAS_ROW_STARTS=True,
    )
    scratch = dict(skey_ptr="*i32", sidx_ptr="*i32", meta_ptr="*i32")
    select = dict(
        rows, **scratch, out_ptr="*i32", stride_or="i32", raw_ptr="*i32", stride_rr="i32",
        pt_ptr="*i32", stride_ptr="i64", stride_ptc="i32", pt_rows="i32", pt_cols="i32",
        cu_ptr="*i32", stride_cu="i32", n_req="i32", off_ptr="*i32", stride_off="i32", page_bits="i32",
        DIRECT_REQUEST=False, HAS_RAW=False, TOPK_BLOCK=2048, BLOCK=STREAM_BLOCK, REQUEST_BLOCK=REQUEST_BLOCK, SPLITS=1,
    )
    opts = _options(max(GROUPS, CAPACITY, STREAM_BLOCK), "xpu")
    register_xpu_compile(_topk_group_max_kernel, f"groups{GROUPS},splits8,row_starts",
                         dict(rows, max_ptr="*i32", GROUPS=GROUPS, SPLITS=8), **opts)
    for splits in (1, 8):
        register_xpu_compile(_topk_candidates_kernel, f"groups{GROUPS},cap{CAPACITY},splits{splits},row_starts",
                             dict(rows, **scratch, max_ptr="*i32", GROUPS=GROUPS, CAPACITY=CAPACITY, BLOCK=STREAM_BLOCK,
                                  SPLITS=splits), **opts)
    for mode, label in ((MODE_INDEX, "index"), (MODE_PAGE_TABLE, "page_table"), (MODE_RAGGED, "ragged")):
        register_xpu_compile(_topk_select_kernel, f"{label},oneshot{ONESHOT_MAX},row_starts",
                             dict(select, MODE=mode, ONESHOT=True, CAPACITY=ONESHOT_MAX), **_options(ONESHOT_MAX, "xpu"))
        register_xpu_compile(_topk_select_kernel, f"{label},cap{CAPACITY},row_starts",
                             dict(select, MODE=mode, ONESHOT=False, CAPACITY=CAPACITY), **opts)
    register_xpu_compile(_topk_select_kernel, f"page_table,cap{CAPACITY},splits8",
                         dict(select, MODE=MODE_PAGE_TABLE, ONESHOT=False, CAPACITY=CAPACITY, SPLITS=8,
                              HAS_ROW_STARTS=False, rs_ptr=None, DIRECT_REQUEST=True), **opts)
    paged = dict(select, MODE=MODE_PAGED, HAS_ROW_STARTS=False, HAS_RAW=True, rs_ptr=None)
    register_xpu_compile(_topk_select_kernel, f"paged,raw,oneshot{ONESHOT_MAX}",
                         dict(paged, ONESHOT=True, CAPACITY=ONESHOT_MAX), **_options(ONESHOT_MAX, "xpu"))
    register_xpu_compile(_topk_select_kernel, f"paged,raw,cap{CAPACITY}",
                         dict(paged, ONESHOT=False, CAPACITY=CAPACITY), **opts)


def _options(block: int, backend: str | None = None) -> dict:
    """Launch options for a kernel whose register-resident set holds ``block`` keys: enough warps
    that each thread keeps at most 16 of them (at least 4 warps). XPU: 16-lane sub-groups, 256
    registers (0 B spilled: the native-code table)."""
    if (backend or _device.backend()) == "xpu":
        return dict(num_warps=min(32, max(4, block // 256)), num_stages=1, grf_mode=_device.xpu_large_grf_mode())
    return dict(num_warps=min(16, max(4, block // 512)), num_stages=1)


#: one-shot launches of at least this many rows per compute unit run on 4 warps (on MANY_ROWS_BACKENDS)
MANY_ROWS_PER_UNIT = 4
#: two-kernel launches of at least this many rows per compute unit (one program a row) take the
#: many-row geometry below on these backends: warps per candidates / select program, and the
#: positions a compaction or streaming step reads
MANY_ROWS_TWO_KERNEL = 2
MANY_ROWS_BACKENDS = ("cuda",)
MANY_ROWS_CANDIDATE_WARPS = 8
MANY_ROWS_SELECT_WARPS = 8
MANY_ROWS_BLOCK = 1024


def _many_rows(rows: int, per_unit: int, device) -> bool:
    """Whether a launch of ``rows`` rows takes the many-row geometry: at least ``per_unit`` rows
    per compute unit, on a backend of ``MANY_ROWS_BACKENDS`` (throughput over one row's latency)."""
    return rows > 0 and _device.backend() in MANY_ROWS_BACKENDS and rows >= per_unit * _device.compute_units(device)


def _launch_options(block: int, rows: int = 0, device=None) -> dict:
    """``_options``, except one-shot selections of many rows (``_many_rows``): 4 warps a row, not
    up to 16. The bisection's 32 dependent steps each end in a block-wide sum; with many rows a
    unit runs several 4-warp programs side by side instead (H100, 1024 rows of 5120: 0.73-0.79x the
    time of 16 warps; for few rows 4 warps cost 1.3-1.5x: bench/results/*/experiments/topk_warps.txt)."""
    options = _options(block)
    if _many_rows(rows, MANY_ROWS_PER_UNIT, device):
        options["num_warps"] = 4
    return tune.launch_options(options)


_register_compile_variants()


def _select(score, lengths, row_starts, topk, out, *, raw=None, mode=MODE_INDEX, page_table=None, cu=None,
            offsets=None, page_bits=0, direct_request=False):
    """Launch the selection of every row of ``score`` into ``out [B, topk]`` (and ``raw``)."""
    rows, width = score.shape
    if rows == 0:
        return
    device = score.device
    # absent or empty tensors: any tensor of the call in their place (never read)
    stand_in = out

    def ptr(t):
        return t if t is not None and t.numel() else stand_in

    pt = ptr(page_table)
    pt_rows, pt_cols = (page_table.shape[0], page_table.shape[1]) if page_table is not None else (0, 0)
    pt_strides = (page_table.stride(0), page_table.stride(1)) if page_table is not None else (0, 1)
    select_args = [
        out, out.stride(0), ptr(raw), raw.stride(0) if raw is not None else 0,
        pt, *pt_strides, pt_rows, pt_cols,
        ptr(cu), cu.stride(0) if cu is not None else 0, (cu.shape[0] - 1) if cu is not None else 0,
        ptr(offsets), offsets.stride(0) if offsets is not None else 0, page_bits,
    ]
    row_args = [ptr(score), score.stride(0), score.stride(1), width,
                lengths, lengths.stride(0), ptr(row_starts), row_starts.stride(0) if row_starts is not None else 0]
    flags = dict(HAS_ROW_STARTS=row_starts is not None, MODE=mode, DIRECT_REQUEST=direct_request,
                 HAS_RAW=raw is not None, TOPK_BLOCK=next_power_of_2(topk), BLOCK=STREAM_BLOCK,
                 REQUEST_BLOCK=REQUEST_BLOCK)
    with device_guard(device):
        if width <= ONESHOT_MAX:
            block = max(16, next_power_of_2(width))
            _topk_select_kernel[(rows,)](*row_args, *select_args, stand_in, stand_in, stand_in, 0, topk,
                                         ONESHOT=True, CAPACITY=block, SPLITS=1, **flags,
                                         **_launch_options(block, rows, device))
            return
        per_launch = min(rows, ROWS_PER_LAUNCH)
        splits = _splits(rows, width, device)
        regions = per_launch * splits
        skey = torch.empty((regions, CAPACITY), dtype=torch.int32, device=device)
        sidx = torch.empty((regions, CAPACITY), dtype=torch.int32, device=device)
        meta = torch.empty((regions, 4), dtype=torch.int32, device=device)
        maxima = torch.empty((regions, GROUPS), dtype=torch.int32, device=device) if splits > 1 else stand_in
        step = STREAM_BLOCK
        options = select_options = _launch_options(max(GROUPS, CAPACITY, STREAM_BLOCK))
        if _many_rows(rows, MANY_ROWS_TWO_KERNEL, device):
            # throughput, not one row's latency: smaller programs, several a unit side by side (each
            # step ends in block-wide sums). H100: 0.57-0.65x the time from 1024 rows up; at 1-2 rows a
            # unit and 64k-128k keys the 16-warp programs stay faster (experiments/topk_geometry.txt)
            step = MANY_ROWS_BLOCK
            options = tune.launch_options(dict(num_warps=MANY_ROWS_CANDIDATE_WARPS, num_stages=1))
            select_options = tune.launch_options(dict(num_warps=MANY_ROWS_SELECT_WARPS, num_stages=1))
        for row0 in range(0, rows, per_launch):
            count = min(per_launch, rows - row0)
            if splits > 1:
                _topk_group_max_kernel[(count, splits)](*row_args, maxima, row0, topk, HAS_ROW_STARTS=row_starts is not None,
                                                        GROUPS=GROUPS, SPLITS=splits, **options)
            _topk_candidates_kernel[(count, splits)](*row_args, maxima, skey, sidx, meta, row0, topk,
                                                     HAS_ROW_STARTS=row_starts is not None, GROUPS=GROUPS,
                                                     CAPACITY=CAPACITY, BLOCK=step, SPLITS=splits, **options)
            _topk_select_kernel[(count,)](*row_args, *select_args, skey, sidx, meta, row0, topk, ONESHOT=False,
                                          CAPACITY=CAPACITY, SPLITS=splits, **{**flags, "BLOCK": step},
                                          **select_options)


def _splits(rows: int, width: int, device) -> int:
    """Programs per row of the two-kernel path: one, or for fewer rows than the device has units,
    enough that the grid covers about two programs a unit, each reading at least
    ``SPLIT_MIN_POSITIONS`` of the widest possible section (at most ``MAX_SPLITS``)."""
    units = _device.compute_units(device)
    if rows >= units:
        return 1
    return max(1, min(MAX_SPLITS, 2 * units // rows, width // SPLIT_MIN_POSITIONS))
