"""Native Intel GPU code of a compiled Triton kernel, read without an Intel GPU.

``.ci/xpu_compile_check.py --native OCLOC_ROOT`` hands each kernel's SPIR-V to Intel's offline
compiler ``ocloc`` (unpacked by ``.ci/ocloc_env.sh`` from Debian's packages into OCLOC_ROOT, run
through that folder's own loader: nothing is installed) for the kernel's target, with IGC's shader
dump on, and reads the dump: what decides speed on PVC / BMG (shared/notes/xpu_native.md).

Per compile: spill bytes per hardware thread (``.zeinfo``'s ``spill_size``, which the final
assembly's ``//.spill size`` matches), GRF count, instruction count, ``load_block2d`` /
``store_block2d`` (2D block IO), ``dpas`` instructions, gathers (``load.ugm``) and SLM loads; and
what one iteration of the key loop does per thread: its dpas instructions and their multiply-adds,
and the bytes its spill and fill messages move (``loop_work``). IGC
may compile a kernel more than once (a retry with other scheduling after a spill); the dump's
highest retry is the code the binary holds.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

LARGE_GRF_FLAG = "-cl-intel-256-GRF-per-thread"
#: triton-xpu's driver rebuilds a kernel that asked for no GRF mode with 256 GRF above this spill
#: (bytes per thread; backends/intel/driver.c ``max_reg_spill``)
DRIVER_SPILL_RETRY = 1000


@dataclasses.dataclass
class Native:
    spill: int  # bytes per hardware thread spilled to scratch
    grf: int  # registers per hardware thread
    instructions: int
    block2d_loads: int
    block2d_stores: int
    dpas: int
    gathers: int  # load.ugm messages (scalar / vector gathers)
    slm_loads: int
    loop_dpas: int = 0  # dpas instructions in the body of the loop that holds the most (the key loop)
    loop_macs: int = 0  # their multiply-adds (per thread and iteration)
    loop_spill_bytes: int = 0  # scratch bytes written (spills) plus read (fills) there: per thread and iteration


class Ocloc:
    """Intel's offline compiler from an unpacked folder (``usr/bin/ocloc-*`` and its libraries,
    run by the folder's own ``ld-linux``: Debian sid's libc is newer than the machine's)."""

    def __init__(self, root: str | os.PathLike):
        self.root = pathlib.Path(root).resolve()
        self.lib = self.root / "usr" / "lib" / "x86_64-linux-gnu"
        found = sorted((self.root / "usr" / "bin").glob("ocloc-*"))
        if not found or not (self.lib / "ld-linux-x86-64.so.2").exists():
            raise FileNotFoundError(f"no ocloc under {self.root} (run .ci/ocloc_env.sh {self.root})")
        self.exe = found[-1]

    def run(self, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
        cmd = [str(self.lib / "ld-linux-x86-64.so.2"), "--library-path", str(self.lib), str(self.exe), *args]
        return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=900)

    def version(self) -> str:
        stamp = self.root / "VERSIONS"
        return stamp.read_text().strip() if stamp.exists() else self.exe.name

    def native(self, spv: bytes, device: str, build_flags: str = "") -> Native:
        """Compile SPIR-V for ``device`` (pvc, bmg) with ``build_flags`` and read the result."""
        work = pathlib.Path(tempfile.mkdtemp(prefix="xpu_native_"))
        try:
            (work / "k.spv").write_bytes(spv)
            dump = work / "dump"
            args = ["compile", "-file", str(work / "k.spv"), "-spirv_input", "-device", device,
                    "-output", "k", "-out_dir", str(work), "-output_no_suffix"]
            if build_flags.strip():
                args += ["-options", build_flags.strip()]
            r = self.run(args, env={"IGC_ShaderDumpEnable": "1", "IGC_DumpToCustomDir": str(dump)})
            if r.returncode != 0:
                raise RuntimeError(f"ocloc exited {r.returncode}: {(r.stdout + r.stderr).strip()[-1500:]}")
            return parse_dump(dump)
        finally:
            shutil.rmtree(work, ignore_errors=True)


_ASM_RE = re.compile(r"_(?:(\d+)_)?simd\d+_entry_\d+\.asm$")


def parse_dump(dump: pathlib.Path) -> Native:
    """Read a shader dump: the final (highest retry) assembly of the one kernel in it."""
    best = None
    for path in dump.glob("*.asm"):
        m = _ASM_RE.search(path.name)
        if not m:
            continue
        text = path.read_text(errors="replace")
        if "//.kernel Intel_Symbol_Table" in text[:2000]:
            continue  # the module's symbol-table stub
        retry = int(m.group(1) or 0)
        if best is None or retry > best[0]:
            best = (retry, text)
    if best is None:
        raise RuntimeError(f"no kernel assembly in the shader dump {dump}")
    text = best[1]
    spill = 0
    for zeinfo in dump.glob("*.zeinfo"):
        spill = max([spill] + [int(x) for x in re.findall(r"spill_size:\s*(\d+)", zeinfo.read_text())])

    def number(pattern: str) -> int:
        m = re.search(pattern, text)
        return int(m.group(1)) if m else 0

    loop_dpas, loop_macs, loop_spill = loop_work(text)
    return Native(
        spill=spill,
        grf=number(r"numGRF=(\d+)"),
        instructions=number(r"//\.instCount (\d+)"),
        block2d_loads=len(re.findall(r"\bload_block2d\b", text)),
        block2d_stores=len(re.findall(r"\bstore_block2d\b", text)),
        dpas=len(re.findall(r"\bdpas\.", text)),
        gathers=len(re.findall(r"\bload\.ugm\b", text)),
        slm_loads=len(re.findall(r"\bload\.slm\b", text)),
        loop_dpas=loop_dpas,
        loop_macs=loop_macs,
        loop_spill_bytes=loop_spill,
    )


_BLOCK_RE = re.compile(r"^// B(\d+): Preds:\{[^}]*\},\s*Succs:\{([^}]*)\}", re.M)
#: spill / fill messages: PVC's scratch block messages (``hword scratch block write x4``: 32-byte
#: hwords) and Xe2's LSC messages tagged ``spill to`` / ``fill from`` (``d32x64t``: 64 dwords)
_HWORD_RE = re.compile(r"hword scratch block (?:write|read) x(\d+)")
_LSC_SPILL_RE = re.compile(r"\b(?:store|load)\.ugm\.d(32|64)x(\d+)t\b[^\n]*//\s*(?:spill to|fill from)")


def spill_message_bytes(line: str) -> int:
    """Scratch bytes one instruction line moves for a spill or a fill (0 for any other line)."""
    m = _HWORD_RE.search(line)
    if m and ("spill" in line or "fill" in line):
        return 32 * int(m.group(1))
    m = _LSC_SPILL_RE.search(line)
    if m:
        return int(m.group(1)) // 8 * int(m.group(2))
    return 0


_DPAS_RE = re.compile(r"\bdpas\.(\d+)x(\d+) \((\d+)\|[^\n]*")


def dpas_macs(line: str) -> int:
    """Multiply-adds of one ``dpas.SxR (E|..)`` instruction line: systolic depth S times the
    operand pairs a channel holds (2 for 16-bit operands, 1 for tf32, 4 for 8-bit), R rows
    (repeat count), E columns (execution size); 0 for any other line."""
    m = _DPAS_RE.search(line)
    if not m:
        return 0
    depth, repeat, width = (int(x) for x in m.groups())
    ops = 2 if re.search(r":(bf|hf)\b", line) else 1 if ":tf32" in line else 4
    return depth * ops * repeat * width


def loop_work(text: str) -> tuple[int, int, int]:
    """(dpas instructions, their multiply-adds, spill + fill bytes) of one iteration of the kernel's key loop, per
    hardware thread, read from the static code: the loop is the back edge (a basic block whose
    successor precedes it, ``// Bnnn: Preds:{..}, Succs:{..}`` headers of IGC's assembly) whose
    blocks hold the most dpas instructions (the first such loop; one without dpas when no loop has
    any). Every instruction of the loop's blocks counts once (branches inside the loop taken or not)."""
    heads = list(_BLOCK_RE.finditer(text))
    if not heads:
        return 0, 0, 0
    bodies = {}
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        bodies[int(m.group(1))] = text[m.start():end]
    order = sorted(bodies)
    best = None
    for m in heads:
        block = int(m.group(1))
        for succ in re.findall(r"B(\d+)", m.group(2)):
            if int(succ) > block:
                continue
            blocks = [b for b in order if int(succ) <= b <= block]
            lines = [line for b in blocks for line in bodies[b].splitlines()]
            dpas = sum(len(re.findall(r"\bdpas\.", line)) for line in lines)
            work = (dpas, sum(dpas_macs(line) for line in lines), sum(spill_message_bytes(line) for line in lines))
            if best is None or dpas > best[0]:
                best = work
    return best or (0, 0, 0)


def launched(ocloc: Ocloc, spv: bytes, device: str, build_flags: str) -> tuple[Native, Native | None]:
    """(code at the kernel's own build flags, code the driver launches instead or None): a kernel
    that asks for no GRF mode and spills more than ``DRIVER_SPILL_RETRY`` bytes is rebuilt by
    triton-xpu's driver with 256 GRF."""
    first = ocloc.native(spv, device, build_flags)
    asked = any(f in build_flags for f in ("GRF-per-thread", "auto-large-GRF"))
    if asked or first.spill <= DRIVER_SPILL_RETRY:
        return first, None
    return first, ocloc.native(spv, device, f"{build_flags} {LARGE_GRF_FLAG}".strip())
