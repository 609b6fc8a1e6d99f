"""How the sparse MLA kernels read the rows their index lists select: the cache layouts (rows of
q's dtype; DeepSeek-V4's packed fp8 pages; DeepSeek-V3.2's fp8 records), their byte geometry, the
exact fp8 e4m3 / UE8M0 decoding, a tile's K channels (``_k_cols``: gathered, dequantised to q's
dtype before the dots) and an entry's row address in a paged or flat cache (``_cache_rows``).

Used by ``mla_sparse``'s kernel and, for the layouts' geometry, by the decode's launcher
(``mla_sparse_decode``)."""
from __future__ import annotations

import triton
import triton.language as tl

#: cache layouts of the selected rows (the kernel's ``LAYOUT``)
LAYOUT_PLAIN = 0  # rows of q's dtype, d_qk contiguous channels
LAYOUT_FP8_V4 = 1  # DeepSeek-V4 packed pages: 448 e4m3 + 64 bf16 per token, UE8M0 tile scales at the page end
LAYOUT_FP8_V32 = 2  # DeepSeek-V3.2 records: 512 e4m3, 4 fp32 tile scales, 64 bf16 per token (656 bytes)

#: DeepSeek-V4 packed page geometry (bytes): a token's nope + rope record, its scale record
V4_RECORD = 576
V4_SCALE_RECORD = 8
V4_NOPE = 448
V4_TILE = 64
#: DeepSeek-V3.2 record geometry (bytes): nope, then 4 fp32 scales, then the bf16 rope
V32_RECORD = 656
V32_NOPE = 512
V32_TILE = 128
V32_ROPE_AT = V32_NOPE + 16

# the same, for the kernels (a kernel reads module globals only as constexprs)
_PLAIN = tl.constexpr(LAYOUT_PLAIN)
_FP8_V4 = tl.constexpr(LAYOUT_FP8_V4)
_V4_RECORD = tl.constexpr(V4_RECORD)
_V4_SCALE_RECORD = tl.constexpr(V4_SCALE_RECORD)
_V4_NOPE = tl.constexpr(V4_NOPE)
_V4_TILE = tl.constexpr(V4_TILE)
_V32_NOPE = tl.constexpr(V32_NOPE)
_V32_TILE = tl.constexpr(V32_TILE)
_V32_ROPE_AT = tl.constexpr(V32_ROPE_AT)


@triton.jit
def _rows_cols_mask(rows_ok, cols, LIMIT: tl.constexpr, END: tl.constexpr):
    """2-D mask of rows ``rows_ok`` x columns ``cols < LIMIT`` of a block whose columns end at
    ``END``; the column test is left out when the whole block lies below ``LIMIT`` (a mask uniform
    along the contiguous dimension keeps accesses vectorised)."""
    if END <= LIMIT:
        return rows_ok[:, None]
    else:
        return rows_ok[:, None] & (cols < LIMIT)[None, :]


@triton.jit
def _e4m3_to_f32(b):
    """fp8 e4m3 (``float8_e4m3fn``) bytes (int32 0..255) to fp32, exactly, in integer arithmetic
    (no fp8 type needed: Intel GPUs have no fp8 units, the interpreter no fp8 arrays)."""
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal: m * 2^-9
    v = tl.where((b & 127) == 127, float("nan"), v)
    return tl.where(b >= 128, -v, v)


@triton.jit
def _ue8m0_to_f32(s):
    """UE8M0 scale bytes (int32 0..255): ``2^(s - 127)``, 255 = NaN."""
    v = (s << 23).to(tl.float32, bitcast=True)
    v = tl.where(s == 0, 5.877471754111438e-39, v)  # 2^-127 (an fp32 subnormal)
    return tl.where(s == 255, float("nan"), v)


@triton.jit
def _k_cols(rows, scale_rows, valid, c0, W: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr, D_QK: tl.constexpr,
            LAYOUT: tl.constexpr, DTYPE: tl.constexpr, FP8_CVT: tl.constexpr, WIDE_ROPE: tl.constexpr):
    """Channels ``[c0, c0 + W)`` of the selected rows as ``[BLOCK_N, W]`` ``DTYPE`` (``c0`` a
    multiple of ``W``, known to lie in ``[LO, HI - W]``): ``rows`` / ``scale_rows`` are the rows'
    starts (elements of the cache's dtype for ``LAYOUT_PLAIN``, bytes otherwise), ``valid`` the rows
    to read (others, and channels from ``D_QK`` on, give 0: a caller's channel end below the
    rope's start leaves the rope out). fp8 channels are dequantised (tile scale
    applied: one per row for a slice within a tile, else one per tile of the slice) before the cast;
    ``FP8_CVT``: e4m3 bytes through the hardware conversion, else in integer arithmetic (Intel GPUs
    and the interpreter have no fp8 arithmetic). ``WIDE_ROPE``: the rope channels are read as
    contiguous bf16 (wide loads; sm_90: one 16-byte load a thread and row instead of a 2-byte gather
    a channel) where a slice holds them alone, or (DeepSeek-V4) where they are its last 64-channel
    tile, put in place beside the fp8 tiles; else per channel (IGC: 1 KB spilled on bmg for V4 at 16
    warps with the wide form)."""
    cols = c0 + tl.arange(0, W)
    if LAYOUT == _PLAIN:
        k = tl.load(rows[:, None] + cols[None, :], mask=_rows_cols_mask(valid, cols, D_QK, HI), other=0.0)
        return k.to(DTYPE)
    else:
        NOPE: tl.constexpr = _V4_NOPE if LAYOUT == _FP8_V4 else _V32_NOPE
        TILE: tl.constexpr = _V4_TILE if LAYOUT == _FP8_V4 else _V32_TILE
        ROPE_AT: tl.constexpr = _V4_NOPE if LAYOUT == _FP8_V4 else _V32_ROPE_AT
        BLOCK_N: tl.constexpr = rows.shape[0]
        # DeepSeek-V4: a slice of several tiles ending at the rope's end, the 64 rope channels its
        # last tile (the held score dot's one 512-wide piece)
        # (pairs: triton-xpu 3.3 has no chained boolean operators)
        ROPE_LAST: tl.constexpr = ((LAYOUT == _FP8_V4 and WIDE_ROPE) and (W > TILE and D_QK == NOPE + TILE)) and (
            HI == D_QK and LO + W == HI)
        k = tl.zeros([BLOCK_N, W], dtype=tl.float32)
        if LO < NOPE:
            b = tl.load(rows[:, None] + cols[None, :], mask=_rows_cols_mask(valid, cols, NOPE, HI), other=0)
            if FP8_CVT:  # the GPU's own e4m3 conversion (NVIDIA sm_89+): a few instructions a pair
                k = b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            else:
                k = _e4m3_to_f32(b.to(tl.int32))
            if W <= TILE:
                # one tile: one scale a row
                in_nope = valid & ((c0 + tl.zeros([BLOCK_N], dtype=tl.int32)) < NOPE)
                if LAYOUT == _FP8_V4:
                    scale = _ue8m0_to_f32(tl.load(scale_rows + c0 // TILE, mask=in_nope, other=127).to(tl.int32))
                else:
                    scale = tl.load(scale_rows.to(tl.pointer_type(tl.float32)) + c0 // TILE, mask=in_nope, other=1.0)
                k = k * scale[:, None]
            else:
                G: tl.constexpr = W // TILE
                g = c0 // TILE + tl.arange(0, G)
                g_mask = valid[:, None] & (g < NOPE // TILE)[None, :]
                if LAYOUT == _FP8_V4:
                    scale = _ue8m0_to_f32(tl.load(scale_rows[:, None] + g[None, :], mask=g_mask, other=127).to(tl.int32))
                else:
                    scale = tl.load(scale_rows.to(tl.pointer_type(tl.float32))[:, None] + g[None, :], mask=g_mask,
                                    other=1.0)
                k3 = tl.reshape(k, [BLOCK_N, G, TILE]) * scale[:, :, None]
                if ROPE_LAST:
                    # the rope tile read as contiguous bf16 and selected into the last tile's place
                    # (not a 64-channel piece of its own: sm_90, 64 x 64 tiles, 68 instead of 80 wgmma
                    # a warp a tile, a 64 x 512 accumulator instead of 64 x 576, 60 instead of 540
                    # bytes spilled)
                    rope = tl.load((rows + ROPE_AT).to(tl.pointer_type(tl.bfloat16))[:, None]
                                   + tl.arange(0, TILE)[None, :], mask=valid[:, None], other=0.0)
                    k3 = tl.where((tl.arange(0, G) == G - 1)[None, :, None], rope.to(DTYPE)[:, None, :], k3.to(DTYPE))
                k = tl.reshape(k3, [BLOCK_N, W])
        if (HI > NOPE and D_QK > NOPE) and not ROPE_LAST:
            rope_ptr = (rows + ROPE_AT).to(tl.pointer_type(tl.bfloat16))
            if LO >= NOPE and WIDE_ROPE:
                k = tl.load(rope_ptr[:, None] + (cols - NOPE)[None, :], mask=_rows_cols_mask(valid, cols, D_QK, HI),
                            other=0.0)
            else:
                rope = tl.load(rope_ptr[:, None] + tl.where(cols >= NOPE, cols - NOPE, 0)[None, :],
                               mask=valid[:, None] & ((cols >= NOPE) & (cols < D_QK))[None, :], other=0.0).to(tl.float32)
                if LO < NOPE:
                    k = tl.where((cols < NOPE)[None, :], k, rope)
                else:
                    k = rope
        return k.to(DTYPE)


@triton.jit
def _cache_rows(base, idx, ok, page_size, page_shift, stride_page, stride_slot, num_rows, LAYOUT: tl.constexpr,
                PAGED: tl.constexpr, PAGE_SHIFTS: tl.constexpr):
    """``(valid, rows, scale_rows)`` of the entries ``idx`` (listed where ``ok``) of one cache
    starting ``base`` elements (bytes) from the kernel's cache pointer: an entry counts when its
    index lies in ``[0, num_rows)``; ``rows`` / ``scale_rows`` are 64-bit offsets of the row starts
    for ``_k_cols`` (an entry that does not count points at row 0 and is never loaded)."""
    valid = ok & (idx >= 0) & (idx < num_rows)
    # 32-bit: num_rows < 2^31 (the launchers check), and a 64-bit division is a called subroutine on
    # NVIDIA GPUs whose calls spill every live register
    safe = tl.where(valid, idx, 0).to(tl.int32)
    if PAGED:
        if PAGE_SHIFTS:
            # a power-of-two page (page_size == 1 << page_shift): a shift and a mask, where a
            # division by a runtime value is ~20 instructions an entry, repeated in each layout the
            # entries' rows are used in (sm_90, DeepSeek-V4 pages, 64 x 64 tiles, 1 stage: the key
            # loop 2568 instructions a warp a tile with the division, 2426 with the shift)
            page = safe >> page_shift
            slot = safe & (page_size - 1)
        else:
            page = safe // page_size
            slot = safe - page * page_size
    else:
        page = safe
        slot = safe * 0
    page = page.to(tl.int64)
    if LAYOUT == _FP8_V4:
        # DeepSeek-V4 page: page_size 576-byte records, then page_size 8-byte scale records
        page_start = base + page * stride_page
        rows = page_start + slot * _V4_RECORD
        scale_rows = page_start + page_size * _V4_RECORD + slot * _V4_SCALE_RECORD
    else:
        rows = base + page * stride_page + slot * stride_slot
        scale_rows = rows + _V32_NOPE  # DeepSeek-V3.2 record: the fp32 scales follow the nope bytes
    return valid, rows, scale_rows
