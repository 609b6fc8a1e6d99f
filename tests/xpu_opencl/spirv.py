"""Reading and trimming SPIR-V modules made by Intel's Triton, for Intel's OpenCL CPU runtime.

A module is a little-endian stream of 32-bit words: a five-word header, then instructions whose
first word holds (word count << 16) | opcode (SPIR-V 1.6 specification, section 2.3).
"""
from __future__ import annotations

import struct

MAGIC = 0x07230203

# opcodes and enumerants (SPIR-V specification, section 3)
OP_EXTENSION = 10
OP_ENTRY_POINT = 15
OP_EXECUTION_MODE = 16
OP_CAPABILITY = 17
OP_DECORATE = 71
DECORATION_LINKAGE_ATTRIBUTES = 41
LINKAGE_IMPORT = 1
#: SPV_INTEL_kernel_attributes: the capability and the execution mode triton-xpu declares on every
#: kernel (an upper bound of the work-group size, a hint); the CPU runtime refuses the capability
CAPABILITY_KERNEL_ATTRIBUTES_INTEL = 5892
EXECUTION_MODE_MAX_WORKGROUP_SIZE_INTEL = 5893
EXTENSION_KERNEL_ATTRIBUTES = "SPV_INTEL_kernel_attributes"


def _words(module: bytes) -> list[int]:
    if len(module) % 4 or len(module) < 20:
        raise ValueError(f"not a SPIR-V module: {len(module)} bytes")
    words = list(struct.unpack(f"<{len(module) // 4}I", module))
    if words[0] != MAGIC:
        raise ValueError(f"not a SPIR-V module: magic {words[0]:#x}")
    return words


def _instructions(words: list[int]):
    """(start, opcode, operands) of every instruction after the header."""
    i = 5
    while i < len(words):
        count, opcode = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            raise ValueError(f"SPIR-V instruction of zero words at word {i}")
        yield i, opcode, words[i + 1:i + count]
        i += count


def _string(operands: list[int]) -> tuple[str, int]:
    """A literal string at the start of ``operands`` and the words it takes."""
    raw = b"".join(struct.pack("<I", w) for w in operands)
    text = raw.split(b"\0", 1)[0]
    return text.decode(), len(text) // 4 + 1


def imports(module: bytes) -> list[str]:
    """Names the module imports (``LinkageAttributes`` ``Import`` decorations): the functions and
    built-in variables the runtime, or a linked program, must define."""
    out = []
    for _, opcode, ops in _instructions(_words(module)):
        if opcode == OP_DECORATE and len(ops) > 2 and ops[1] == DECORATION_LINKAGE_ATTRIBUTES:
            name, n = _string(ops[2:])
            if ops[2 + n] == LINKAGE_IMPORT:
                out.append(name)
    return out


def imported_functions(module: bytes) -> list[str]:
    """Imported functions (mangled names), leaving out the ``__spirv_BuiltIn*`` variables that
    every OpenCL runtime defines."""
    return sorted({n for n in imports(module) if not n.startswith("__spirv_BuiltIn")})


def entry_points(module: bytes) -> list[str]:
    out = []
    for _, opcode, ops in _instructions(_words(module)):
        if opcode == OP_ENTRY_POINT:
            out.append(_string(ops[2:])[0])
    return out


def without_kernel_attributes(module: bytes) -> bytes:
    """The module less ``SPV_INTEL_kernel_attributes``: its capability, its extension and the
    ``MaxWorkgroupSizeINTEL`` execution modes (a hint the launch respects anyway). Every other
    word is kept as it is."""
    words = _words(module)
    keep = words[:5]
    for start, opcode, ops in _instructions(words):
        drop = ((opcode == OP_CAPABILITY and ops[0] == CAPABILITY_KERNEL_ATTRIBUTES_INTEL)
                or (opcode == OP_EXTENSION and _string(ops)[0] == EXTENSION_KERNEL_ATTRIBUTES)
                or (opcode == OP_EXECUTION_MODE and ops[1] == EXECUTION_MODE_MAX_WORKGROUP_SIZE_INTEL))
        if not drop:
            keep.extend(words[start:start + 1 + len(ops)])
    return struct.pack(f"<{len(keep)}I", *keep)
