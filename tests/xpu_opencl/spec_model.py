"""A numpy model of the GPU builtins ``emulation.py`` emulates, written from Intel's specifications
for sub-group size 16, to test the emulation against (``test_emulation.py``).

2D block IO (``cl_intel_subgroup_2d_block_io``, which refers to ``SPV_INTEL_2d_block_io`` for the
assignment of block data to work-items): a block is cut from a row-major region of ``height`` rows
of ``width`` bytes, ``pitch`` bytes apart, at element ``x`` of row ``y``; out-of-bounds elements
read as zero and are not written ("Out-of-Bounds Behavior"); the block is padded, transformed or
transposed, then its rows are given to the work-items ("Mapping Block Data to Invocations").
Several blocks are adjacent in x and each block's data follows the previous block's in a
work-item's storage.

DPAS (``cl_intel_subgroup_matrix_multiply_accumulate``, ``..._tf32``): the result is acc + A @ B,
computed here in float64 from the exact inputs.

Every function returns what each of the 16 work-items holds: an array of shape (16, ...).
"""
from __future__ import annotations

import numpy as np

LANES = 16
_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def element(memory: np.ndarray, width: int, height: int, pitch: int, col: int, row: int, bits: int) -> int | None:
    """The element at column ``col`` (elements) of row ``row`` of the region, or None out of bounds.
    ``memory``: the bytes of the region (uint8, at least height x pitch)."""
    size = bits // 8
    if col < 0 or row < 0 or row >= height or (col + 1) * size > width:
        return None
    start = row * pitch + col * size
    return int.from_bytes(memory[start:start + size].tobytes(), "little")


def _block(memory, width, height, pitch, x, y, bits, rows, cols, prows, pcols):
    """One block of ``rows`` x ``cols`` elements at (x, y), padded to ``prows`` x ``pcols`` with zeros;
    out-of-bounds elements are zero. Also whether each element is inside the (unpadded) block."""
    out = np.zeros((prows, pcols), dtype=np.uint64)
    inside = np.zeros((prows, pcols), dtype=bool)
    for r in range(rows):
        for c in range(cols):
            v = element(memory, width, height, pitch, x + c, y + r, bits)
            out[r, c] = 0 if v is None else v
            inside[r, c] = True
    return out, inside


def _assign(block: np.ndarray, set_size: int = 1) -> tuple[list[list[int]], list[list[bool]]]:
    """The elements of a (padded) ``block`` each work-item is assigned, in order, and whether each is
    defined (SPV_INTEL_2d_block_io "Mapping Block Data to Invocations"). ``set_size``: the elements
    in one element of the OpenCL C destination type, for blocks wider than the sub-group."""
    h, w = block.shape
    lanes = [[] for _ in range(LANES)]
    defined = [[] for _ in range(LANES)]
    if w == LANES:
        # "each invocation is assigned one element of the block row"
        for lane in range(LANES):
            lanes[lane] = [block[r, lane] for r in range(h)]
            defined[lane] = [True] * h
    elif w < LANES:
        # "the first row is assigned to the first set of invocations, then the next row to the next set"
        per = LANES // w
        for group in range(-(-h // per)):
            for lane in range(LANES):
                r, c = group * per + lane // w, lane % w
                lanes[lane].append(block[r, c] if r < h else 0)
                # OpenCL C 6.13.X.1: "If there is only one row, the data assigned to the last eight
                # work-items is undefined"
                defined[lane].append(r < h)
    else:
        # "the first set of elements are assigned to the first invocation, then the next set ...",
        # a set being what one element of the destination type holds (cl_intel_subgroup_2d_block_io
        # 6.13.X.1: a ushort of two 8-bit elements for 32 columns; a uint, one element, for a
        # transposed read of 32 rows, "each work-item reads ... two columns"): each row is cut into
        # runs of 16 sets, one set a work-item (for the transposed read, work-item l gets rows l
        # and l + 16, as Intel's Triton's lowering expects; see test_emulation.py)
        for lane in range(LANES):
            for r in range(h):
                for run in range(w // (LANES * set_size)):
                    start = run * LANES * set_size + lane * set_size
                    lanes[lane] += [block[r, start + j] for j in range(set_size)]
                    defined[lane] += [True] * set_size
    return lanes, defined


def _to_bytes(values, bits):
    return b"".join(int(v).to_bytes(bits // 8, "little") for v in values)


def read(memory, width, height, pitch, x, y, *, family, bits, rows, cols, blocks):
    """(data, defined): the bytes each work-item's destination holds, shape (16, n) uint8, and a
    mask of the bytes the specifications define. ``family``: "read", "transform" or "transpose"."""
    per_lane = [b"" for _ in range(LANES)]
    mask = [[] for _ in range(LANES)]
    for b in range(blocks):
        bx = x + b * cols   # "the blocks of data are adjacent horizontally"
        if family == "read":
            # Block Width padded to the next power of two
            block, _ = _block(memory, width, height, pitch, bx, y, bits, rows, cols, rows, _pow2(cols))
            unit_bits = bits
        elif family == "transform":
            # Block Width padded to a power of two, Block Height to a multiple of 2 (2-byte) or 4
            # (1-byte elements); every 2 or 4 rows of a column packed into 32 bits, lower rows in
            # the lower bits
            pack = 32 // bits
            prows = -(-rows // pack) * pack
            raw, _ = _block(memory, width, height, pitch, bx, y, bits, rows, cols, prows, _pow2(cols))
            block = np.zeros((prows // pack, raw.shape[1]), dtype=np.uint64)
            for q in range(prows // pack):
                for i in range(pack):
                    block[q] |= raw[q * pack + i] << np.uint64(bits * i)
            unit_bits = 32
        elif family == "transpose":
            # Block Height padded to the next power of two; column c becomes row c
            raw, _ = _block(memory, width, height, pitch, bx, y, bits, rows, cols, _pow2(rows), cols)
            block = raw.T.copy()
            unit_bits = bits
        else:
            raise ValueError(family)
        # two 8-bit elements a ushort for a 32-column read; else one element a destination element
        set_size = 2 if family == "read" and bits == 8 and block.shape[1] == 32 else 1
        lanes, defined = _assign(block, set_size)
        for lane in range(LANES):
            per_lane[lane] += _to_bytes(lanes[lane], unit_bits)
            mask[lane] += [d for d in defined[lane] for _ in range(unit_bits // 8)]
    data = np.frombuffer(b"".join(per_lane), dtype=np.uint8).reshape(LANES, -1)
    return data, np.array(mask, dtype=bool)


def write(memory, width, height, pitch, x, y, source, *, bits, rows, cols):
    """The region after a one-block write of ``source`` (the bytes of each work-item's source,
    shape (16, n) uint8): elements out of bounds or in the padding are not written."""
    out = memory.copy()
    size = bits // 8
    pcols = _pow2(cols)
    # which block element each of a work-item's elements is: the mapping of a read, inverted
    index = np.arange(rows * pcols).reshape(rows, pcols)
    lanes, defined = _assign(index, 2 if bits == 8 and pcols == 32 else 1)
    values = [np.frombuffer(source[lane].tobytes(), dtype=_UINT[bits]) for lane in range(LANES)]
    for lane in range(LANES):
        for i, flat in enumerate(lanes[lane]):
            r, c = divmod(int(flat), pcols)
            if not defined[lane][i] or r >= rows or c >= cols:
                continue
            col, row = x + c, y + r
            if element(memory, width, height, pitch, col, row, bits) is None:
                continue
            start = row * pitch + col * size
            out[start:start + size] = np.frombuffer(int(values[lane][i]).to_bytes(size, "little"), dtype=np.uint8)
    return out


# -- DPAS -------------------------------------------------------------------------------------------

def _f16(bits):
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float64)


def _bf16(bits):
    return (np.asarray(bits, dtype=np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def _tf32(values):
    # tf32 spec 6.3.1.X: "Only 10 mantissa bits are used" (of the 23): the low 13 are dropped
    u = np.asarray(values, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return u.view(np.float32).astype(np.float64)


def dpas(a_type, b_type, m, a, b, acc):
    """The result each work-item gets, shape (16, m) (float64 for floating point, int64 for
    integers), from the work-items' ``a`` (16, components), ``b`` (16, 8) and ``acc`` (16, m)."""
    a, b, acc = np.asarray(a), np.asarray(b), np.asarray(acc)
    n = np.arange(LANES)
    if a_type in ("f16", "bf16"):
        conv = _f16 if a_type == "f16" else _bf16
        # A is M x 16: "each work item contributes 16 bits per row", work-item k holds A[m][k]
        A = conv(a.astype(np.uint16).T)                                      # (m, 16)
        # B is 16 x 16: work-item n holds column n, 2 rows (32 bits) in each int, lower row low
        bw = b.astype(np.uint32)
        B = np.empty((16, LANES))
        for k in range(16):
            B[k] = conv((bw[:, k // 2] >> np.uint32(16 * (k % 2))) & np.uint32(0xFFFF))
        C = acc.astype(np.float64).T
        return (C + A @ B).T
    if a_type == "tf32":
        # "the first K work-items contribute the even rows of the matrix a, and the remaining
        # work-items contribute the odd rows"; B: work-item n holds column n, row k in b[k]
        A = np.empty((m, 8))
        for row in range(m):
            A[row] = _tf32(a[(row % 2) * 8 + np.arange(8), row // 2])
        B = _tf32(b).T                                                      # (8, 16)
        C = acc.astype(np.float64).T
        return (C + A @ B).T
    # 8-bit integers: A is M x 32, work-item l holds elements 2l (low byte) and 2l+1 of each row;
    # B is 32 x 16, work-item n holds 4 rows of column n in each int, lowest row in the lowest byte
    adt = np.int8 if a_type == "i8" else np.uint8
    bdt = np.int8 if b_type == "i8" else np.uint8
    A = a.astype(np.uint16).T.copy().view(np.uint8).reshape(m, 32).view(adt).astype(np.int64)
    B = b.astype(np.uint32).copy().view(np.uint8).reshape(LANES, 32).view(bdt).astype(np.int64).T
    C = acc.astype(np.int64).T
    r = C + A @ B
    return ((r + 2**31) % 2**32 - 2**31).T[n]
