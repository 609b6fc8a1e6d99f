"""The builtin emulation (``emulation.py``) on its own, against the numpy model of the specifications
(``spec_model.py``), on Intel's OpenCL CPU device.

Each builtin is called from a small OpenCL C kernel (sub-group size 16) that declares it by its
mangled name (an asm label, so a definition that mangles differently fails to link), linked with
``emulation.source`` as the driver links it; the kernel writes every work-item's destination to a
buffer. Reads and writes must match the model bit for bit; DPAS results the float64 value of
acc + A @ B within the rounding of an fp32 sum of 17 terms (the products are exact).

One layout is not settled by the specifications' words: a transposed read of 32 rows
(``transpose_32b_32r8x1c``). SPV_INTEL_2d_block_io's third mapping case ("the first set of elements
are assigned to the first invocation, then the next set ...") read with a set of two 32-bit
elements would give work-item l rows 2l and 2l + 1; read with a set of one element of the
destination type (uint), as for every other builtin (a 32-column 8-bit read's set is its ushort),
work-item l gets rows l and l + 16 ("each work-item ... reads one or two columns of data", 6.13.X.1).
Intel's Triton decides it: a bf16 or fp16 dot with a column-major operand, which it lowers to that
read, is exact with the second layout and wrong with the first (checked through the driver), so
the emulation and the model use the second.

Shapes and data are chosen so that a wrong layout cannot pass by symmetry: random nonzero bytes
(distinct from the zero fill), non-square blocks, offsets that are not multiples of a block, blocks
cut by the right and bottom edges and by negative coordinates, pitch larger than width (the bytes
between width and pitch are nonzero and must read as zero).
"""
from __future__ import annotations

import re

import pytest

cl = pytest.importorskip("pyopencl")
np = pytest.importorskip("numpy")

from . import emulation, spec_model  # noqa: E402


def _io(family, bits, rows, cols, blocks, ptr, op=None):
    op = op or {"read": "read", "transform": "read_transform", "transpose": "read_transpose",
                "write": "write", "prefetch": "prefetch"}[family]
    name = f"intel_sub_group_2d_block_{op}_{bits}b_{rows}r{cols}x{blocks}c"
    args = "PU3AS1viiiDv2_i" + (f"P{ptr}" if ptr else "")
    return f"_Z{len(name)}{name}{args}", dict(family=family, bits=bits, rows=rows, cols=cols, blocks=blocks, ptr=ptr)


#: the names Intel's Triton imports for this package's kernels (/work/proto/allimports.log), then others
IO = dict([
    _io("read", 16, 8, 16, 2, "t"),
    _io("read", 8, 16, 16, 2, "h"),
    _io("read", 8, 32, 16, 2, "h"),
    _io("write", 16, 8, 16, 1, "t"),
    _io("transpose", 32, 16, 8, 1, "j"),
    _io("transpose", 32, 32, 8, 1, "j"),
    _io("transform", 16, 16, 16, 2, "j"),
    _io("transform", 16, 32, 16, 2, "j"),
    # plain reads: one element a row (16 columns), two a row (8-bit, 32 columns: as ushort per the
    # OpenCL C declaration, or as uchar, the SPIR-V element type), a row pair per register (8 columns)
    _io("read", 16, 1, 16, 1, "t"),
    _io("read", 16, 32, 16, 1, "t"),
    _io("read", 16, 5, 16, 1, "t"),
    _io("read", 64, 8, 4, 1, "m"),
    _io("read", 8, 4, 32, 2, "t"),
    _io("read", 8, 8, 32, 1, "h"),
    _io("read", 8, 8, 16, 4, "h"),
    _io("read", 32, 8, 8, 2, "j"),
    _io("read", 32, 1, 8, 1, "j"),
    _io("read", 32, 16, 16, 1, "j"),
    _io("read", 32, 3, 8, 1, "j"),
    # imported by Intel's Triton for int8 and tf32 dots
    _io("read", 8, 16, 32, 2, "t"),
    _io("read", 32, 16, 8, 2, "j"),
    _io("read", 32, 32, 16, 1, "j"),
    # transformed (VNNI) reads
    _io("transform", 16, 16, 16, 1, "j"),
    _io("transform", 16, 32, 16, 1, "j"),
    _io("transform", 16, 7, 16, 1, "j"),
    _io("transform", 8, 32, 16, 1, "j"),
    _io("transform", 8, 32, 16, 4, "j"),
    # transposed reads (16 rows: one row a work-item; 32: two; 8: a row pair per register)
    _io("transpose", 32, 32, 1, 1, "j"),
    _io("transpose", 32, 16, 4, 1, "j"),
    _io("transpose", 32, 8, 8, 1, "j"),
    # writes
    _io("write", 16, 1, 16, 1, "t"),
    _io("write", 8, 4, 32, 1, "t"),
    _io("write", 8, 2, 16, 1, "h"),
    _io("write", 32, 8, 16, 1, "j"),
    # prefetches (no effect on memory)
    _io("prefetch", 16, 8, 16, 2, None),
    _io("prefetch", 32, 16, 8, 1, None),
    _io("prefetch", 8, 32, 32, 2, None),
])


def _mad(mangled, a, b, k, m, aty, bty, accty):
    na = max(1, m // 2) if a == "tf32" else m
    return mangled, dict(a=a, b=b, k=k, m=m, aty=aty, na=na, bty=bty, accty=accty)


#: Itanium manglings as the OpenCL C compiler (and Intel's Triton) spell them: a repeated vector
#: type is a substitution (S_, S0_, ...)
DPAS = dict([
    _mad("_Z38intel_sub_group_f16_f16_matrix_mad_k16Dv8_sDv8_iDv8_f", "f16", "f16", 16, 8, "short", "int", "float"),
    _mad("_Z40intel_sub_group_bf16_bf16_matrix_mad_k16Dv8_sDv8_iDv8_f", "bf16", "bf16", 16, 8, "short", "int", "float"),
    _mad("_Z38intel_sub_group_f16_f16_matrix_mad_k16sDv8_if", "f16", "f16", 16, 1, "short", "int", "float"),
    _mad("_Z40intel_sub_group_bf16_bf16_matrix_mad_k16Dv4_sDv8_iDv4_f", "bf16", "bf16", 16, 4, "short", "int", "float"),
    _mad("_Z40intel_sub_group_bf16_bf16_matrix_mad_k16Dv2_sDv8_iDv2_f", "bf16", "bf16", 16, 2, "short", "int", "float"),
    _mad("_Z39intel_sub_group_tf32_tf32_matrix_mad_k8Dv4_fDv8_fS0_", "tf32", "tf32", 8, 8, "float", "float", "float"),
    _mad("_Z39intel_sub_group_tf32_tf32_matrix_mad_k8fDv8_fDv2_f", "tf32", "tf32", 8, 2, "float", "float", "float"),
    _mad("_Z39intel_sub_group_tf32_tf32_matrix_mad_k8fDv8_ff", "tf32", "tf32", 8, 1, "float", "float", "float"),
    _mad("_Z36intel_sub_group_i8_i8_matrix_mad_k32Dv8_sDv8_iS0_", "i8", "i8", 32, 8, "short", "int", "int"),
    _mad("_Z36intel_sub_group_u8_i8_matrix_mad_k32Dv4_tDv8_iDv4_i", "u8", "i8", 32, 4, "ushort", "int", "int"),
    _mad("_Z36intel_sub_group_i8_u8_matrix_mad_k32Dv2_sDv8_jDv2_i", "i8", "u8", 32, 2, "short", "uint", "int"),
    _mad("_Z36intel_sub_group_u8_u8_matrix_mad_k32tDv8_ji", "u8", "u8", 32, 1, "ushort", "uint", "int"),
])

_CTYPE = {"h": "uchar", "t": "ushort", "j": "uint", "m": "ulong"}
_SIZE = {"h": 1, "t": 2, "j": 4, "m": 8}

# the region every 2D block test reads or writes
WIDTH, HEIGHT, PITCH, ROWS_ALLOCATED = 100, 40, 112, 48


def _lane_bytes(p):
    """Bytes of a work-item's destination, from the function lists of cl_intel_subgroup_2d_block_io
    ("reads eight ushorts", ...) generalised: per block, rows x columns / 16 elements (transform:
    32-bit values of 2 or 4 rows; 8 columns: at least one register of two rows)."""
    e = p["bits"] // 8
    rows, cols = p["rows"], 1 << (p["cols"] - 1).bit_length()
    if p["family"] == "transform":
        pack = 4 // e
        return p["blocks"] * -(-rows // pack) * cols // 16 * 4
    if p["family"] == "transpose":
        rows, cols = p["cols"], 1 << (p["rows"] - 1).bit_length()
    if cols < 16:   # "reads four uints" for 32b_8r8x1c: 16 / cols rows a register
        return p["blocks"] * -(-rows // (16 // cols)) * e
    return p["blocks"] * rows * cols // 16 * e


def _kernels():
    src = []
    for i, (mangled, p) in enumerate(IO.items()):
        sig = "global void*, int, int, int, int2" + (f", private {_CTYPE[p['ptr']]}*" if p["ptr"] else "")
        src.append(f'void emu_io{i}({sig}) __asm__("{mangled}");')
        head = (f"__attribute__((intel_reqd_sub_group_size(16)))\nkernel void io{i}(global uchar* mem, int width, "
                f"int height, int pitch, int x, int y, global uchar* data)\n{{\n"
                f"    const int lane = get_sub_group_local_id();\n")
        if p["family"] == "prefetch":
            src.append(head + f"    emu_io{i}(mem, width, height, pitch, (int2)(x, y));\n}}")
            continue
        t, n = _CTYPE[p["ptr"]], _lane_bytes(p) // _SIZE[p["ptr"]]
        if p["family"] == "write":
            src.append(head + f"    {t} v[{n}];\n    for (int i = 0; i < {n}; ++i) v[i] = ((global {t}*)data)"
                       f"[lane * {n} + i];\n    emu_io{i}(mem, width, height, pitch, (int2)(x, y), v);\n}}")
        else:
            src.append(head + f"    {t} v[{n}];\n    for (int i = 0; i < {n}; ++i) v[i] = ({t})0x5a5a5a5a5a5a5a5aUL;\n"
                       f"    emu_io{i}(mem, width, height, pitch, (int2)(x, y), v);\n"
                       f"    for (int i = 0; i < {n}; ++i) ((global {t}*)data)[lane * {n} + i] = v[i];\n}}")
    for i, (mangled, p) in enumerate(DPAS.items()):
        m, na = p["m"], p["na"]
        at, bt, ct = p["aty"], p["bty"], p["accty"]
        vec = lambda t, n: t if n == 1 else f"{t}{n}"  # noqa: E731
        load = lambda arr, n: f"{arr}[lane]" if n == 1 else f"vload{n}(lane, {arr})"  # noqa: E731
        src.append(f'{vec(ct, m)} emu_mad{i}({vec(at, na)}, {bt}8, {vec(ct, m)}) __asm__("{mangled}");')
        store = "out[lane] = r;" if m == 1 else f"vstore{m}(r, lane, out);"
        src.append(f"__attribute__((intel_reqd_sub_group_size(16)))\nkernel void mad{i}(global const {at}* a, "
                   f"global const {bt}* b, global const {ct}* acc, global {ct}* out)\n{{\n"
                   f"    const int lane = get_sub_group_local_id();\n"
                   f"    {vec(ct, m)} r = emu_mad{i}({load('a', na)}, vload8(lane, b), {load('acc', m)});\n"
                   f"    {store}\n}}")
    return "\n".join(src)


@pytest.fixture(scope="module")
def device():
    try:
        devices = [d for p in cl.get_platforms() if "Intel" in p.name for d in p.get_devices()
                   if d.type & cl.device_type.CPU]
    except cl.Error:
        devices = []
    if not devices:
        pytest.skip("no Intel OpenCL CPU device (intel-opencl-rt, OCL_ICD_VENDORS)")
    ctx = cl.Context(devices[:1])
    queue = cl.CommandQueue(ctx)
    names = list(IO) + list(DPAS)
    kernels = cl.Program(ctx, _kernels()).compile("-cl-std=CL3.0")
    builtins = cl.Program(ctx, emulation.source(names)).compile("-cl-std=CL3.0")
    program = cl.link_program(ctx, [kernels, builtins])
    return ctx, queue, program


def _run(device, kernel, arrays, scalars=()):
    ctx, queue, program = device
    mf = cl.mem_flags
    bufs = [cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=a) for a in arrays]
    k = getattr(program, kernel)
    args = list(bufs)
    if scalars:
        args = [bufs[0], *[np.int32(s) for s in scalars], *bufs[1:]]
    k(queue, (16,), (16,), *args)
    for a, b in zip(arrays, bufs):
        cl.enqueue_copy(queue, a, b)
    queue.finish()
    return arrays


def _memory(seed):
    """The region's bytes: random and nonzero everywhere, also past ``width`` and below ``height``."""
    return np.random.default_rng(seed).integers(1, 256, ROWS_ALLOCATED * PITCH, dtype=np.uint8)


def _cases(p):
    """(label, x, y): inside the region at offsets that are no multiple of the block; cut by the
    right and bottom edges; at negative coordinates. x stays a multiple of four (8-bit) or two
    (16-bit) elements (cl_intel_subgroup_2d_block_io 6.13.X.6 "Restrictions")."""
    e = p["bits"] // 8
    span = p["cols"] * p["blocks"]
    width = WIDTH // e
    edge_x = (width - span // 2) // 4 * 4 if e < 4 else width - span // 2
    return [("inside", 4, 3),
            ("edge", edge_x, HEIGHT - (p["rows"] + 1) // 2),
            ("negative", -4, -(p["rows"] // 2))]


READS = [(n, label) for n, p in IO.items() if p["family"] in ("read", "transform", "transpose")
         for label, _, _ in _cases(p)]
WRITES = [(n, label) for n, p in IO.items() if p["family"] == "write" for label, _, _ in _cases(p)]


@pytest.mark.parametrize("mangled,label", READS)
def test_read(device, mangled, label):
    """SPV_INTEL_2d_block_io "Mapping Block Data to Invocations" (padding, transform, transpose, the
    three width cases) and "Out-of-Bounds Behavior" (zero); cl_intel_subgroup_2d_block_io 6.13.X.1
    (coord in elements, width and pitch in bytes; blocks adjacent horizontally)."""
    p = IO[mangled]
    i = list(IO).index(mangled)
    x, y = {lb: (x, y) for lb, x, y in _cases(p)}[label]
    memory = _memory(i)
    out = np.zeros(16 * _lane_bytes(p), dtype=np.uint8)
    _run(device, f"io{i}", [memory.copy(), out], (WIDTH, HEIGHT, PITCH, x, y))
    want, defined = spec_model.read(memory, WIDTH, HEIGHT, PITCH, x, y, family=p["family"], bits=p["bits"],
                                    rows=p["rows"], cols=p["cols"], blocks=p["blocks"])
    got = out.reshape(16, -1)
    assert want.shape == got.shape
    bad = np.argwhere((want != got) & defined)
    assert bad.size == 0, f"{len(bad)} bytes differ, first (lane, byte) {bad[:4].tolist()}"


@pytest.mark.parametrize("mangled,label", WRITES)
def test_write(device, mangled, label):
    """cl_intel_subgroup_2d_block_io 6.13.X.3; SPV_INTEL_2d_block_io: the mapping of a load, stores
    leave padded and out-of-bounds elements alone."""
    p = IO[mangled]
    i = list(IO).index(mangled)
    x, y = {lb: (x, y) for lb, x, y in _cases(p)}[label]
    memory = _memory(100 + i)
    source = np.random.default_rng(200 + i).integers(1, 256, 16 * _lane_bytes(p), dtype=np.uint8)
    got, _ = _run(device, f"io{i}", [memory.copy(), source], (WIDTH, HEIGHT, PITCH, x, y))
    want = spec_model.write(memory, WIDTH, HEIGHT, PITCH, x, y, source.reshape(16, -1), bits=p["bits"],
                            rows=p["rows"], cols=p["cols"])
    assert (want != memory).any()
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} bytes differ, first offsets {bad[:4].ravel().tolist()}"


@pytest.mark.parametrize("mangled", [n for n, p in IO.items() if p["family"] == "prefetch"])
@pytest.mark.parametrize("label", ["inside", "edge", "negative"])
def test_prefetch(device, mangled, label):
    """cl_intel_subgroup_2d_block_io 6.13.X.2: "Prefetching does not affect the functionality of a
    kernel": memory is unchanged, also out of bounds."""
    p = IO[mangled]
    i = list(IO).index(mangled)
    x, y = {lb: (x, y) for lb, x, y in _cases(p)}[label]
    memory = _memory(i)
    got, _ = _run(device, f"io{i}", [memory.copy(), np.zeros(16, np.uint8)], (WIDTH, HEIGHT, PITCH, x, y))
    assert (got == memory).all()


def _dpas_inputs(p, rng):
    m, na = p["m"], p["na"]
    if p["a"] in ("f16", "bf16"):
        def bits(n):
            f = rng.standard_normal(n) * np.exp2(rng.integers(-6, 6, n))
            if p["a"] == "f16":
                f[::7] *= 2.0 ** -20  # subnormal halfs
                return f.astype(np.float16).view(np.uint16).view(np.int16)
            return (f.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
        a = bits(16 * m).reshape(16, m)
        b = bits(16 * 16).view(np.int32).reshape(16, 8)
        acc = (rng.standard_normal((16, m)) * 4).astype(np.float32)
    elif p["a"] == "tf32":
        a = rng.standard_normal((16, na)).astype(np.float32)
        b = rng.standard_normal((16, 8)).astype(np.float32)
        acc = (rng.standard_normal((16, m)) * 4).astype(np.float32)
    else:
        a = rng.integers(-2**15, 2**15, (16, m)).astype(np.int16)
        b = rng.integers(-2**31, 2**31, (16, 8)).astype(np.int32)
        acc = rng.integers(-2**31, 2**31, (16, m)).astype(np.int32)
        if p["aty"] == "ushort":
            a = a.view(np.uint16)
        if p["bty"] == "uint":
            b = b.view(np.uint32)
    return np.ascontiguousarray(a), np.ascontiguousarray(b), np.ascontiguousarray(acc)


@pytest.mark.parametrize("mangled", list(DPAS))
def test_dpas(device, mangled):
    """cl_intel_subgroup_matrix_multiply_accumulate 6.13.X (A: M x int16_t, K elements across the
    work-items; B: 8 x int32_t, one column a work-item, rows packed low to high, as the coding
    sample's as_char4; acc and result: one column a work-item), its sub-group size 16 table; tf32:
    cl_intel_subgroup_matrix_multiply_accumulate_tf32 6.13.X.Y (even rows of A in work-items 0-7,
    odd rows in 8-15)."""
    p = DPAS[mangled]
    i = list(DPAS).index(mangled)
    a, b, acc = _dpas_inputs(p, np.random.default_rng(300 + i))
    out = np.zeros_like(acc)
    _run(device, f"mad{i}", [a, b, acc, out])
    want = spec_model.dpas(p["a"], p["b"], p["m"], a, b, acc)
    if p["accty"] == "int":
        assert (out.astype(np.int64) == want).all()
        return
    # fp32: acc plus 16 (tf32: 8) exact products summed in fp32: |error| <= n u sum |terms|
    mag = spec_model.dpas(p["a"], p["b"], p["m"], _abs_bits(p, a), _abs_bits(p, b), np.abs(acc))
    bound = p["k"] * 2.0 ** -24 * mag * 1.0001
    err = np.abs(out.astype(np.float64) - want)
    assert (err <= bound).all(), f"max error {err.max()} (bound {bound[err > bound].min()})"
    # and not trivially: the products matter
    assert np.abs(want - acc).max() > 0.1


def _abs_bits(p, x):
    """The operand with every element's sign cleared (for the error bound's sum of |terms|)."""
    if p["a"] == "tf32":
        return np.abs(x)
    return (x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint16) & np.array(0x7FFF7FFF).astype(
        np.uint32 if x.dtype.itemsize == 4 else np.uint16)).view(x.dtype)


# -- parsing ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("mangled", list(IO))
def test_parse_block_io(mangled):
    p = IO[mangled]
    d = emulation.parse(mangled)
    assert (d.family, d.element_bits, d.rows, d.columns, d.blocks, d.pointer) == (
        p["family"], p["bits"], p["rows"], p["cols"], p["blocks"], p["ptr"])
    if p["ptr"]:
        assert d.lane_bytes == _lane_bytes(p)


@pytest.mark.parametrize("mangled", list(DPAS))
def test_parse_dpas(mangled):
    p = DPAS[mangled]
    d = emulation.parse(mangled)
    assert (d.family, d.a_type, d.b_type, d.k, d.m) == ("dpas", p["a"], p["b"], p["k"], p["m"])


@pytest.mark.parametrize("mangled", [
    "_Z3foov",
    "_Z26__spirv_ControlBarrierINTELiii",
    # sub-group size 8 DPAS (int a operand), reduced-precision accumulators, 4-bit
    "_Z40intel_sub_group_bf16_bf16_matrix_mad_k16Dv8_iDv8_iDv8_f",
    "_Z40intel_sub_group_bf16_bf16_matrix_mad_k16Dv8_sDv8_iDv8_s",
    "_Z38intel_sub_group_f16_f16_matrix_mad_k16Dv8_sDv8_iDv8_Dh",
    "_Z37intel_sub_group_i4_i4_matrix_mad_k64Dv8_sDv8_iDv8_i",
    "_Z38intel_sub_group_f16_f16_matrix_mad_k16Dv8_sDv8_iDv4_f",   # M of a and acc differ
    "_Z36intel_sub_group_i8_i8_matrix_mad_k32Dv8_sDv8_iDv8_i",     # not the compiler's mangling (S0_)
    "_Z37intel_sub_group_bf16_f16_matrix_mad_k16Dv8_sDv8_iDv8_f",
    # destination types the specifications do not give these shapes
    _io("read", 16, 8, 16, 2, "j")[0],
    _io("read", 8, 16, 16, 2, "t")[0],
    _io("transform", 16, 16, 16, 2, "t")[0],
    _io("read", 16, 8, 16, 2, "m")[0],
    # shapes outside the hardware messages
    _io("read", 16, 8, 16, 4, "t")[0],
    _io("read", 16, 33, 16, 1, "t")[0],
    _io("transpose", 16, 16, 8, 1, "t")[0],
    _io("write", 16, 16, 16, 1, "t")[0],
    _io("write", 16, 8, 16, 2, "t")[0],
    _io("read", 8, 8, 30, 1, "h")[0],
    _io("read", 16, 5, 16, 2, "t")[0],
    _io("read", 16, 8, 12, 2, "t")[0],
    "_Z41intel_sub_group_2d_block_read_16b_8r16x2cPU3AS1viiiDv2_i",            # no destination
    "_Z41intel_sub_group_2d_block_read_16b_8r16x2cPU3AS3viiiDv2_iPt",          # local memory
])
def test_unknown_names_are_refused_by_name(mangled):
    with pytest.raises(NotImplementedError, match=re.escape(mangled)):
        emulation.parse(mangled)
    with pytest.raises(NotImplementedError, match=re.escape(mangled)):
        emulation.source([next(iter(IO)), mangled])


def test_compiled_symbols_are_the_mangled_names(device):
    """Each definition's symbol in the compiled emulation is the mangled name itself (the OpenCL C
    compiler mangles the overloadable definitions as Intel's Triton mangles its imports)."""
    ctx = device[0]
    names = list(IO) + list(DPAS)
    binary = cl.Program(ctx, emulation.source(names)).compile("-cl-std=CL3.0").binaries[0]
    assert [n for n in names if n.encode() not in binary] == []


def test_source_defines_exactly_the_names():
    names = [list(IO)[0], list(DPAS)[1]]
    text = emulation.source(names)
    assert [line[3:] for line in text.splitlines() if line.startswith("// _Z")] == sorted(names)
    assert text.count("__attribute__((overloadable, noinline))") == 2
