"""OpenCL C emulations of the GPU-only builtins Intel's Triton (triton-xpu) imports, generated from
their Itanium-mangled names, for Intel's OpenCL CPU device (sub-group size 16).

Two families, from Intel's extension specifications:

* DPAS, ``intel_sub_group_<a>_<b>_matrix_mad_k<K>``: ``cl_intel_subgroup_matrix_multiply_accumulate``
  (section "Add a new Section 6.13.X - Subgroup Matrix Multiply Accumulate Instructions", its coding
  sample and the "OpenCL SPIR-V Environment" table for devices whose minimum sub-group size is 16)
  and ``cl_intel_subgroup_matrix_multiply_accumulate_tf32`` (section 6.13.X.Y "tf32 Subgroup Matrix
  Multiply Accumulate Functions").
* 2D block IO, ``intel_sub_group_2d_block_{read,read_transform,read_transpose,write,prefetch}_<E>b_<R>r<C>x<N>c``:
  ``cl_intel_subgroup_2d_block_io`` (sections 6.13.X.1-3 and 6.13.X.6 "Restrictions"), which refers
  for the assignment of block data to work-items to ``SPV_INTEL_2d_block_io`` (sections "Mapping
  Block Data to Invocations" and "Out-of-Bounds Behavior").

:func:`parse` describes a builtin from its mangled name and raises ``NotImplementedError`` naming
any symbol it does not know; :func:`source` is the OpenCL C text defining exactly the given
builtins, each ``__attribute__((overloadable, noinline))`` so that the C compiler mangles it to the
imported name. The numpy model the tests compare against is ``spec_model.py``.
"""
from __future__ import annotations

import dataclasses
import re

SUB_GROUP_SIZE = 16

#: Itanium mangling of the scalar types these builtins take (<builtin-type>)
_MANGLED_SCALAR = {"h": "uchar", "c": "char", "a": "char", "t": "ushort", "s": "short", "j": "uint", "i": "int",
                   "m": "ulong", "l": "long", "f": "float", "Dh": "half"}
#: the unsigned type of each element size (bytes), as OpenCL C spells it and as it is mangled
_UNSIGNED = {1: ("uchar", "h"), 2: ("ushort", "t"), 4: ("uint", "j"), 8: ("ulong", "m")}

_IO_NAME = re.compile(r"intel_sub_group_2d_block_(read|read_transform|read_transpose|write|prefetch)"
                      r"_(8|16|32|64)b_(\d+)r(\d+)x(\d+)c")
_IO_ARGS = re.compile(r"PU3AS1viiiDv2_i(?:P([a-z]))?")
_MAD_NAME = re.compile(r"intel_sub_group_(f16|bf16|tf32|i8|u8|i4|u4)_(f16|bf16|tf32|i8|u8|i4|u4)_matrix_mad_k(\d+)")
_MANGLED_ARG = re.compile(r"Dv(\d+)_(Dh|[a-z])|(Dh|[a-z])")


@dataclasses.dataclass(frozen=True)
class BlockIO:
    """A 2D block read, transform read, transpose read, write or prefetch (``SPV_INTEL_2d_block_io``:
    ``OpSubgroup2DBlockLoadINTEL``, ``...LoadTransformINTEL``, ``...LoadTransposeINTEL``,
    ``...StoreINTEL``, ``...PrefetchINTEL``)."""

    mangled: str
    name: str
    family: str            # "read", "transform", "transpose", "write", "prefetch"
    element_bits: int
    rows: int              # Block Height
    columns: int           # Block Width (elements)
    blocks: int            # Block Count
    pointer: str | None    # mangled type of the destination (reads) / source (writes); None for prefetch

    @property
    def element_bytes(self) -> int:
        return self.element_bits // 8

    @property
    def pointer_type(self) -> str | None:
        return None if self.pointer is None else _MANGLED_SCALAR[self.pointer]

    @property
    def pointer_bytes(self) -> int:
        return {"h": 1, "c": 1, "a": 1, "t": 2, "s": 2, "j": 4, "i": 4, "m": 8, "l": 8}[self.pointer]

    # -- "Mapping Block Data to Invocations" -----------------------------------------------------
    @property
    def unit_bytes(self) -> int:
        """Bytes of one assigned unit: an element, or a packed 32-bit value after a transform."""
        return 4 if self.family == "transform" else self.element_bytes

    @property
    def packing(self) -> int:
        """Rows packed into one 32-bit value by a transform (2 for 2-byte, 4 for 1-byte elements), else 1."""
        return 4 // self.element_bytes if self.family == "transform" else 1

    @property
    def assigned_shape(self) -> tuple[int, int]:
        """(rows, width) of one block as it is assigned to work-items: after padding (Block Width to
        a power of two, or Block Height for transpose; Block Height to the packing for transform),
        after the transform (packed rows) or the transpose (columns become rows)."""
        if self.family == "transpose":
            return self.columns, _pow2(self.rows)
        height = _ceil_to(self.rows, self.packing) // self.packing
        return height, _pow2(self.columns)

    @property
    def set_units(self) -> int:
        """Units in one element of the OpenCL C destination type (the ushort of 8-bit 32-column
        blocks holds two; the uint of a transposed read one)."""
        return 2 if self.family in ("read", "write") and self.element_bits == 8 and self.assigned_shape[1] == 32 else 1

    @property
    def units_per_block(self) -> int:
        """Units each work-item holds per block."""
        height, width = self.assigned_shape
        if width >= SUB_GROUP_SIZE:
            return height * (width // SUB_GROUP_SIZE)
        per_unit = SUB_GROUP_SIZE // width
        return -(-height // per_unit)

    @property
    def lane_bytes(self) -> int:
        """Bytes of the destination (or source) of one work-item."""
        return self.blocks * self.units_per_block * self.unit_bytes


@dataclasses.dataclass(frozen=True)
class MatrixMad:
    """A DPAS, ``intel_sub_group_<a>_<b>_matrix_mad_k<K>`` for sub-group size 16."""

    mangled: str
    name: str
    a_type: str            # "f16", "bf16", "tf32", "i8", "u8"
    b_type: str
    k: int                 # K (depth)
    m: int                 # M (repeat count: rows of a, acc and the result)
    a_arg: tuple[str, int]     # (OpenCL C scalar type, components) of each argument
    b_arg: tuple[str, int]
    acc_arg: tuple[str, int]

    family = "dpas"

    @property
    def result(self) -> tuple[str, int]:
        return self.acc_arg


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def _split(mangled: str) -> tuple[str, str]:
    m = re.fullmatch(r"_Z(\d+)(\w+)", mangled)
    if not m:
        raise NotImplementedError(f"{mangled}: not an Itanium-mangled function name")
    n = int(m.group(1))
    rest = m.group(2)
    if len(rest) < n:
        raise NotImplementedError(f"{mangled}: malformed mangled name")
    return rest[:n], rest[n:]


def parse(mangled: str) -> BlockIO | MatrixMad:
    """The builtin ``mangled`` names. ``NotImplementedError`` naming it for anything this emulation
    does not define (another function, a sub-group size 8 variant, a shape or destination type
    outside the specifications, a reduced-precision accumulator)."""
    name, args = _split(mangled)
    io = _IO_NAME.fullmatch(name)
    if io:
        return _parse_io(mangled, name, args, io)
    mad = _MAD_NAME.fullmatch(name)
    if mad:
        return _parse_mad(mangled, name, args, mad)
    raise NotImplementedError(f"{mangled}: no emulation of {name!r} (not a DPAS or 2D block IO builtin of "
                              "cl_intel_subgroup_matrix_multiply_accumulate / cl_intel_subgroup_2d_block_io)")


def _parse_io(mangled, name, args, io) -> BlockIO:
    op, bits, rows, cols, blocks = io.group(1), int(io.group(2)), int(io.group(3)), int(io.group(4)), int(io.group(5))
    family = {"read": "read", "read_transform": "transform", "read_transpose": "transpose",
              "write": "write", "prefetch": "prefetch"}[op]
    a = _IO_ARGS.fullmatch(args)
    if not a or (a.group(1) is None) != (family == "prefetch"):
        raise NotImplementedError(f"{mangled}: unexpected arguments {args!r} for {name} (the specification's "
                                  "signature is (global void*, int, int, int, int2[, private T*]))")
    d = BlockIO(mangled, name, family, bits, rows, cols, blocks, a.group(1))
    e = d.element_bytes
    why = None
    # the shapes the hardware block messages take (cl_intel_subgroup_2d_block_io 6.13.X.1-3 and the
    # SPIR-V environment table; SPV_INTEL_2d_block_io "Restrictions": Block Width a multiple of four
    # for 1-byte elements, of two for 2-byte elements). Intel's Triton also emits shapes the OpenCL
    # list leaves out (8b 16-column 1- and 2-block reads); the SPIR-V mapping rules define those.
    if not (1 <= rows <= 32 and cols >= 1 and blocks in (1, 2, 4)):
        why = "rows must be 1..32 and the block count 1, 2 or 4"
    elif blocks > 1 and (cols != _pow2(cols) or rows != _pow2(rows)):
        # where a padded block's successor begins (in memory, in the destination) is not specified
        why = "several blocks must have a power-of-two width and height"
    elif (e == 1 and cols % 4) or (e == 2 and cols % 2):
        why = "the block width must be a multiple of four for 1-byte, of two for 2-byte elements"
    elif family == "transpose":
        if bits != 32 or cols > 8 or blocks != 1:
            why = "transposed reads are of 32-bit elements, at most 8 columns, one block"
    elif family == "transform":
        if bits not in (8, 16) or d.assigned_shape[1] * e * blocks > 64:
            why = "transformed reads are of 8- or 16-bit elements, at most 64 bytes of block rows"
    elif family == "write":
        if blocks != 1 or rows > 8 or _pow2(cols) * e > 64:
            why = "writes are of one block of at most 8 rows and 64 bytes a row"
    elif _pow2(cols) * e * blocks > 64:
        why = "a read or prefetch takes at most 64 bytes of block rows"
    if why is None and family not in ("prefetch", "transpose") and d.assigned_shape[1] > SUB_GROUP_SIZE \
            and not (bits == 8 and d.assigned_shape[1] == 32):
        why = "blocks wider than 16 elements are of 8-bit elements, 32 columns"
    if why is None and d.pointer is not None:
        allowed = {_UNSIGNED[e][1]}   # the element type (SPIR-V: the pointer's element size is the Element Size)
        if family == "transform":
            allowed = {"j"}           # SPIR-V: "it must point to a scalar 32-bit integer type"; OpenCL C: uint*
        elif family in ("read", "write") and d.assigned_shape[1] > SUB_GROUP_SIZE:
            # OpenCL C: a 32-column 8-bit block gives each work-item two elements a row, as a ushort
            allowed.add(_UNSIGNED[e * d.assigned_shape[1] // SUB_GROUP_SIZE][1])
        if d.pointer not in allowed:
            why = f"the {'source' if family == 'write' else 'destination'} type must be one of " + \
                  ", ".join(f"{_MANGLED_SCALAR[t]}* (P{t})" for t in sorted(allowed))
        elif d.lane_bytes % d.pointer_bytes:
            why = "the work-item's data is not a whole number of destination elements"
    if why:
        raise NotImplementedError(f"{mangled}: {name} is outside the specified 2D block IO ({why})")
    return d


def _parse_mad_args(mangled, args) -> list[tuple[str, int]]:
    """The (scalar type, components) of each argument in ``args``, reading Itanium substitutions
    (``S_``, ``S0_``, ...: a repeated vector type; builtin scalar types are not candidates)."""
    out, pos, candidates = [], 0, []
    while pos < len(args):
        sub = re.compile(r"S(\d*)_").match(args, pos)
        if sub:
            index = int(sub.group(1)) + 1 if sub.group(1) else 0
            if index >= len(candidates):
                raise NotImplementedError(f"{mangled}: substitution {sub.group(0)} refers to no earlier type")
            out.append(candidates[index])
            pos = sub.end()
            continue
        m = _MANGLED_ARG.match(args, pos)
        if not m:
            raise NotImplementedError(f"{mangled}: cannot read the argument types {args!r}")
        if m.group(1):
            arg = (_MANGLED_SCALAR[m.group(2)], int(m.group(1)))
            if arg not in candidates:
                candidates.append(arg)
        else:
            arg = (_MANGLED_SCALAR[m.group(3)], 1)
        out.append(arg)
        pos = m.end()
    return out


_SCALAR_MANGLING = {"uchar": "h", "char": "c", "ushort": "t", "short": "s", "uint": "j", "int": "i",
                    "ulong": "m", "long": "l", "float": "f", "half": "Dh"}


def mangle(name: str, args: list[tuple[str, int]]) -> str:
    """The Itanium mangling of an overloadable OpenCL C function ``name`` taking ``args`` ((scalar
    type, components)), as the OpenCL C compiler spells it: a vector type met again is a
    substitution (the first ``S_``, the next ``S0_``, ...)."""
    out, candidates = [f"_Z{len(name)}{name}"], []
    for arg in args:
        if arg[1] == 1:
            out.append(_SCALAR_MANGLING[arg[0]])
        elif arg in candidates:
            i = candidates.index(arg)
            out.append(f"S{i - 1 if i else ''}_")
        else:
            candidates.append(arg)
            out.append(f"Dv{arg[1]}_{_SCALAR_MANGLING[arg[0]]}")
    return "".join(out)


def _parse_mad(mangled, name, args, mad) -> MatrixMad:
    at, bt, k = mad.group(1), mad.group(2), int(mad.group(3))
    parsed = _parse_mad_args(mangled, args)
    if len(parsed) != 3:
        raise NotImplementedError(f"{mangled}: {name} takes three arguments (a, b, acc), not {args!r}")
    a_arg, b_arg, acc_arg = parsed
    m = acc_arg[1]
    # cl_intel_subgroup_matrix_multiply_accumulate: the functions for devices whose minimum sub-group
    # size is 16 (tf32: cl_intel_subgroup_matrix_multiply_accumulate_tf32)
    if at in ("f16", "bf16") and bt == at:
        expect = (k == 16, a_arg == ("short", m), b_arg == ("int", 8), acc_arg[0] == "float")
        if a_arg[0] == "int":
            raise NotImplementedError(f"{mangled}: {name} with an int a operand is the sub-group size 8 "
                                      "variant; Triton's sub-group size is 16")
        if acc_arg[0] in ("short", "half"):
            raise NotImplementedError(f"{mangled}: {name} with a {acc_arg[0]} accumulator (bf16/fp16 result): the "
                                      "specification does not define the rounding of the result; not emulated")
    elif at == "tf32" and bt == "tf32":
        expect = (k == 8, a_arg == ("float", max(1, m // 2)), b_arg == ("float", 8), acc_arg[0] == "float")
    elif at in ("i8", "u8") and bt in ("i8", "u8"):
        expect = (k == 32, a_arg == ("short" if at == "i8" else "ushort", m),
                  b_arg == ("int" if bt == "i8" else "uint", 8), acc_arg[0] == "int")
    elif at in ("i4", "u4") and bt in ("i4", "u4"):
        raise NotImplementedError(f"{mangled}: {name}: 4-bit DPAS is not emulated (the specification does not "
                                  "state the order of the nibbles in a packed operand)")
    else:
        expect = (False,)
    if not all(expect) or m not in (1, 2, 4, 8):
        raise NotImplementedError(f"{mangled}: {name}({args}) is not a sub-group size 16 function of the "
                                  "matrix multiply accumulate specifications")
    canonical = mangle(name, parsed)
    if canonical != mangled:
        # an overloadable OpenCL C definition can only have the compiler's mangling
        raise NotImplementedError(f"{mangled}: not the mangling the OpenCL C compiler gives {name}"
                                  f"({', '.join(map(_ctype, parsed))}), which is {canonical}")
    return MatrixMad(mangled, name, at, bt, k, m, a_arg, b_arg, acc_arg)


# ------------------------------------------------------------------------------------------------
# OpenCL C generation
# ------------------------------------------------------------------------------------------------

def _ctype(arg: tuple[str, int]) -> str:
    return arg[0] if arg[1] == 1 else f"{arg[0]}{arg[1]}"


_PRELUDE = """\
// Generated by tests/xpu_opencl/emulation.py: emulations of GPU-only builtins for sub-group size 16.
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
"""

_HELPERS = {
    # SPV_INTEL_2d_block_io "Out-of-Bounds Behavior": bounds are Memory Width (bytes) and Memory
    # Height (rows); x counts elements, y rows; pitch is the bytes between rows.
    "load": """\
static ulong __emu_load(const global uchar* base, int width, int height, int pitch, int x, int y, int bytes)
{{
    if (x < 0 || y < 0 || y >= height || (long)x * bytes + bytes > (long)width)
        return 0;   // out-of-bounds elements are assigned the value zero
    const global uchar* p = base + (long)y * pitch + (long)x * bytes;
    switch (bytes) {{
    case 1: return *p;
    case 2: return *(const global ushort*)p;
    case 4: return *(const global uint*)p;
    default: return *(const global ulong*)p;
    }}
}}
""",
    "store": """\
static void __emu_store(global uchar* base, int width, int height, int pitch, int x, int y, int bytes, ulong v)
{{
    if (x < 0 || y < 0 || y >= height || (long)x * bytes + bytes > (long)width)
        return;     // out-of-bounds elements are ignored
    global uchar* p = base + (long)y * pitch + (long)x * bytes;
    switch (bytes) {{
    case 1: *p = (uchar)v; break;
    case 2: *(global ushort*)p = (ushort)v; break;
    case 4: *(global uint*)p = (uint)v; break;
    default: *(global ulong*)p = v; break;
    }}
}}
""",
    # exact conversions of the 16-bit floating-point inputs of DPAS to fp32
    "f16": """\
static float __emu_f16(ushort h)
{{
    uint s = (uint)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return as_float(s | 0x7f800000u | (m << 13));          // inf, nan
    if (e == 0u) return as_float(s | as_uint((float)m * 0x1p-24f));         // zero, subnormal: exact
    return as_float(s | ((e + 112u) << 23) | (m << 13));
}}
""",
    "bf16": """\
static float __emu_bf16(ushort h) {{ return as_float((uint)h << 16); }}
""",
    # cl_intel_subgroup_matrix_multiply_accumulate_tf32 6.3.1.X: "Only 10 mantissa bits are used
    # when performing operations on tf32 data": the 13 low mantissa bits are dropped (a value
    # rounded by intel_convert_tfloat32_as_float is unchanged)
    "tf32": """\
static float __emu_tf32(float f) {{ return isnan(f) ? f : as_float(as_uint(f) & 0xffffe000u); }}
""",
}


def _lane_unit(d: BlockIO) -> str:
    """C statements computing, for unit ``i`` of a block held by work-item ``lane``, the row ``r``
    and column ``c`` of the assigned (padded, transformed or transposed) block
    (SPV_INTEL_2d_block_io, "Mapping Block Data to Invocations", its three cases)."""
    height, width = d.assigned_shape
    if width == SUB_GROUP_SIZE:
        # 1. padded width == sub-group size: each invocation is assigned one element of the block row
        return "const int r = i, c = lane;"
    if width < SUB_GROUP_SIZE:
        # 2. narrower: the first row to the first set of invocations, the next row to the next set
        per = SUB_GROUP_SIZE // width
        return f"const int r = i * {per} + lane / {width}, c = lane % {width};"
    # 3. wider: several elements of each row a work-item. A "set" is one element of the OpenCL C
    # destination type: two 8-bit elements (ushort) for a 32-column read or write, one 32-bit
    # element (uint) for a 32-row transposed read. A row is cut into runs of 16 sets, the first set
    # of a run to the first invocation, the next to the next. For the transposed read this gives
    # work-item l rows l and l + 16 (pre-transpose), one after the other for each column -- the
    # layout Intel's Triton relies on (see the report in test_emulation.py); with 8-bit elements
    # it gives work-item l columns 2l and 2l + 1 (the ushort packing of 6.13.X.1)
    per = width // SUB_GROUP_SIZE
    s = d.set_units
    return f"const int r = i / {per}, c = (i % {per}) / {s} * {16 * s} + lane * {s} + i % {s};"


def _io_source(d: BlockIO) -> tuple[str, set[str]]:
    sig = "global void* base, int width, int height, int pitch, int2 coord"
    if d.family == "prefetch":
        # 6.13.X.2: "Prefetching does not affect the functionality of a kernel"
        return (f"__attribute__((overloadable, noinline))\nvoid {d.name}({sig})\n{{\n"
                "    (void)base; (void)width; (void)height; (void)pitch; (void)coord;\n}\n"), set()
    ptr = f"private {d.pointer_type}* {'value' if d.family == 'write' else 'destination'}"
    ut = _UNSIGNED[d.unit_bytes][0]
    e, height, width = d.element_bytes, *d.assigned_shape
    head = (f"__attribute__((overloadable, noinline))\nvoid {d.name}({sig}, {ptr})\n{{\n"
            "    const int lane = get_sub_group_local_id();\n")
    loop = (f"    for (int b = 0; b < {d.blocks}; ++b)\n"
            f"    for (int i = 0; i < {d.units_per_block}; ++i) {{\n"
            f"        {_lane_unit(d)}\n")
    # blocks are side by side in x ("the blocks are adjacent horizontally"), the next block's data
    # beginning immediately after the previous block's in the work-item's storage
    x0 = f"coord.x + b * {d.columns}"
    if d.family == "write":
        body = (f"    const private {ut}* src = (const private {ut}*)value;\n" + loop +
                f"        if (r < {d.rows} && c < {d.columns})   // padded elements are ignored\n"
                f"            __emu_store((global uchar*)base, width, height, pitch, {x0} + c, coord.y + r, {e}, "
                f"src[b * {d.units_per_block} + i]);\n    }}\n")
        return head + body + "}\n", {"store"}
    if d.family == "read":
        value = (f"(r < {d.rows} && c < {d.columns}) ? __emu_load((const global uchar*)base, width, height, pitch, "
                 f"{x0} + c, coord.y + r, {e}) : 0")   # padded elements are zero
    elif d.family == "transpose":
        # the block's column c' becomes row c' of the transposed block: (r, c) here is (c', r')
        value = (f"(c < {d.rows} && r < {d.columns}) ? __emu_load((const global uchar*)base, width, height, pitch, "
                 f"{x0} + r, coord.y + c, {e}) : 0")
    else:
        # transform: rows p*r .. p*r+p-1 of column c packed into 32 bits, lower rows in lower bits
        p = d.packing
        value = "v"
        loop += (f"        uint v = 0;\n"
                 f"        for (int k = 0; k < {p}; ++k)\n"
                 f"            if (r * {p} + k < {d.rows} && c < {d.columns})\n"
                 f"                v |= (uint)__emu_load((const global uchar*)base, width, height, pitch, {x0} + c, "
                 f"coord.y + r * {p} + k, {e}) << ({8 * e} * k);\n")
    body = (f"    private {ut}* dst = (private {ut}*)destination;\n" + loop +
            f"        dst[b * {d.units_per_block} + i] = ({ut})({value});\n    }}\n")
    return head + body + "}\n", {"load"}


def _unpack(var: str, arg: tuple[str, int], arr: str) -> str:
    if arg[1] == 1:
        return f"    {arg[0]} {arr}[1] = {{ {var} }};\n"
    return f"    {arg[0]} {arr}[{arg[1]}]; vstore{arg[1]}({var}, 0, {arr});\n"


def _mad_source(d: MatrixMad) -> tuple[str, set[str]]:
    rt = _ctype(d.result)
    head = (f"__attribute__((overloadable, noinline))\n"
            f"{rt} {d.name}({_ctype(d.a_arg)} a, {_ctype(d.b_arg)} b, {_ctype(d.acc_arg)} acc)\n{{\n"
            + _unpack("a", d.a_arg, "av") + _unpack("b", d.b_arg, "bv") + _unpack("acc", d.acc_arg, "cv")
            + f"    {d.acc_arg[0]} out[{d.m}];\n")
    m = d.m
    if d.a_type in ("f16", "bf16"):
        cv = "__emu_f16" if d.a_type == "f16" else "__emu_bf16"
        # A: M x int16_t: work-item k holds A[m][k] in component m of a (K = 16 = sub-group size);
        # B: 8 x int32_t, work-item n holds column n, rows 2i (low 16 bits) and 2i+1 (high) in b[i]
        body = (f"    for (int m = 0; m < {m}; ++m) {{\n"
                f"        float s = cv[m];\n"
                f"        for (int k = 0; k < 16; ++k) {{\n"
                f"            float x = {cv}((ushort)sub_group_shuffle(av[m], (uint)k));\n"
                f"            float y = {cv}((ushort)((uint)bv[k / 2] >> (16 * (k % 2))));\n"
                f"            s = s + x * y;   // exact product, fp32 sum in k order\n"
                f"        }}\n        out[m] = s;\n    }}\n")
        helpers = {d.a_type}
    elif d.a_type == "tf32":
        # A: ceil(M/2) floats: work-items 0-7 hold the even rows, 8-15 the odd rows (K = 8);
        # B: float8, work-item n holds column n, row k in b[k]
        body = (f"    for (int m = 0; m < {m}; ++m) {{\n"
                f"        float s = cv[m];\n"
                f"        for (int k = 0; k < 8; ++k) {{\n"
                f"            float x = __emu_tf32(sub_group_shuffle(av[m / 2], (uint)((m % 2) * 8 + k)));\n"
                f"            float y = __emu_tf32(bv[k]);\n"
                f"            s = s + x * y;\n"
                f"        }}\n        out[m] = s;\n    }}\n")
        helpers = {"tf32"}
    else:
        # A: M x int16_t, two 8-bit elements a work-item a row: work-item l holds A[m][2l] (low byte)
        # and A[m][2l+1]; B: 8 x int32_t, work-item n holds rows 4i..4i+3 of column n in b[i], lowest
        # row in the lowest byte (the coding sample's as_char4); signed or unsigned as named
        at = "char" if d.a_type == "i8" else "uchar"
        bt = "char" if d.b_type == "i8" else "uchar"
        body = (f"    for (int m = 0; m < {m}; ++m) {{\n"
                f"        uint s = (uint)cv[m];\n"
                f"        for (int k = 0; k < 32; ++k) {{\n"
                f"            int x = ({at})((ushort)sub_group_shuffle(av[m], (uint)(k / 2)) >> (8 * (k % 2)));\n"
                f"            int y = ({bt})((uint)bv[k / 4] >> (8 * (k % 4)));\n"
                f"            s += (uint)(x * y);   // 32-bit wrap-around\n"
                f"        }}\n        out[m] = (int)s;\n    }}\n")
        helpers = set()
    ret = "    return out[0];\n" if m == 1 else f"    return vload{m}(0, out);\n"
    return head + body + ret + "}\n", helpers


def source(names) -> str:
    """OpenCL C defining exactly the builtins ``names`` (mangled), in a stable order.
    ``NotImplementedError`` naming any it does not know."""
    descs = [parse(n) for n in sorted(set(names))]
    parts, helpers = [], set()
    for d in descs:
        text, needs = _mad_source(d) if isinstance(d, MatrixMad) else _io_source(d)
        parts.append(f"// {d.mangled}\n{text}")
        helpers |= needs
    head = [_PRELUDE] + [_HELPERS[h].format() for h in ("load", "store", "f16", "bf16", "tf32") if h in helpers]
    return "\n".join(head + parts)
