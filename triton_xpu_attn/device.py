"""Backend and device detection: the one place that knows which hardware we run on.

Order: Intel XPU (``torch.xpu.is_available()``), then CUDA, else the CPU through Triton's
interpreter. On a machine without a GPU this module sets ``TRITON_INTERPRET=1`` *at import*,
before any ``@triton.jit`` kernel module is imported (the package imports it first); an explicit
user setting of ``TRITON_INTERPRET`` always wins.
"""
from __future__ import annotations

import functools
import os
import re
import sys
import warnings

import torch

#: compute units assumed under the interpreter: small, so split heuristics stay cheap on a CPU.
INTERPRETER_COMPUTE_UNITS = 4


def _detect_backend() -> str:
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if torch.cuda.is_available():
        return "cuda"
    return "interpreter"


_HARDWARE_BACKEND = _detect_backend()
#: set when triton was imported before this package on a machine without a GPU: the first kernel
#: launch then raises (``check_interpreter_usable``) instead of failing inside Triton
_TRITON_IMPORTED_FIRST = False
if _HARDWARE_BACKEND == "interpreter" and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" in sys.modules:
        _TRITON_IMPORTED_FIRST = True
        # triton's own @jit library functions (tl.sum, tl.max, tl.cdiv, ...) were built for
        # compiled mode when triton was imported; the interpreter cannot call them afterwards.
        warnings.warn(
            "triton was imported before triton_xpu_attn on a machine without a GPU, so its library "
            "functions were not built for the interpreter and kernels will fail. Import "
            "triton_xpu_attn first, or set TRITON_INTERPRET=1 before importing triton.",
            RuntimeWarning,
            stacklevel=2,
        )


def check_interpreter_usable() -> None:
    """Raise a ``RuntimeError`` that says what to do when triton was imported before this package
    on a machine without a GPU: Triton's library functions (``tl.sum``, ``tl.max``, ...) were then
    built for compiled mode, and every interpreted kernel would fail inside Triton with
    "Cannot call @triton.jit'd outside of the scope of a kernel"."""
    if _TRITON_IMPORTED_FIRST:
        raise RuntimeError(
            "triton was imported before triton_xpu_attn on a machine without a GPU, so Triton's library "
            "functions were built for compiled mode and the CPU interpreter cannot run the kernels. Import "
            "triton_xpu_attn before triton (e.g. first in your script), or start Python with TRITON_INTERPRET=1 "
            "set (TRITON_INTERPRET=1 python ...)."
        )


def is_interpreter() -> bool:
    """True when Triton kernels run through the interpreter (``TRITON_INTERPRET`` set, not 0)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no")


def backend() -> str:
    """``'xpu'``, ``'cuda'`` or ``'interpreter'``: how kernels are executed in this process."""
    return "interpreter" if is_interpreter() else _HARDWARE_BACKEND


def intel_gpu() -> bool:
    """Whether kernels are compiled for an Intel GPU (``backend() == 'xpu'``): the ``INTEL_GPU``
    constexpr of the kernels that quantise to fp8 e4m3, which then encode in integer arithmetic
    (``_common.e4m3_bytes``) instead of triton-xpu's conversion (docs/xpu.md, "fp8 e4m3 stores").
    Tests force it under the interpreter to run that path."""
    return backend() == "xpu"


def default_device() -> torch.device:
    """Device on which tensors for our kernels live by default (CPU under the interpreter)."""
    if _HARDWARE_BACKEND == "interpreter":
        return torch.device("cpu")
    return torch.device(_HARDWARE_BACKEND)


def _index(device: torch.device | str | int | None) -> int:
    if device is None:
        return getattr(torch, _HARDWARE_BACKEND).current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.index is not None:
        return device.index
    return getattr(torch, device.type).current_device()


@functools.lru_cache(maxsize=None)
def _properties(kind: str, index: int):
    return getattr(torch, kind).get_device_properties(index)


def device_name(device: torch.device | str | int | None = None) -> str:
    """Human-readable device name, e.g. ``'NVIDIA H100 80GB HBM3'``; ``'cpu'`` under the interpreter."""
    if _HARDWARE_BACKEND == "interpreter":
        return "cpu"
    return _properties(_HARDWARE_BACKEND, _index(device)).name


def normalize_device_key(name: str) -> str:
    """Config-file key from a device name, as vLLM does: ``'NVIDIA H100 80GB HBM3'`` ->
    ``'NVIDIA_H100_80GB_HBM3'``; ``'Intel(R) Data Center GPU Max 1550'`` ->
    ``'Intel_R_Data_Center_GPU_Max_1550'``."""
    return re.sub(r"_+", "_", re.sub(r"[^0-9A-Za-z]+", "_", name)).strip("_") or "unknown"


def device_key(device: torch.device | str | int | None = None) -> str:
    """Normalised device name used to name config files in ``autotune_configs/<backend>/``."""
    return normalize_device_key(device_name(device))


def compute_units(device: torch.device | str | int | None = None) -> int:
    """Parallel compute units that a grid should fill.

    XPU: Xe-cores (``gpu_subslice_count``; ``max_compute_units`` counts EUs and would over-split).
    CUDA: streaming multiprocessors. Interpreter: :data:`INTERPRETER_COMPUTE_UNITS`.
    """
    if _HARDWARE_BACKEND == "interpreter" or (device is not None and torch.device(device).type == "cpu"):
        return INTERPRETER_COMPUTE_UNITS
    props = _properties(_HARDWARE_BACKEND, _index(device))
    if _HARDWARE_BACKEND == "xpu":
        return int(getattr(props, "gpu_subslice_count", 0) or getattr(props, "max_compute_units", 64) // 8)
    return int(props.multi_processor_count)


def l2_cache_bytes(device: torch.device | str | int | None = None) -> int | None:
    """The device's last-level (L2) cache in bytes, where torch reports it (CUDA); None elsewhere
    (XPU's device properties have no such field; the interpreter has no cache)."""
    if _HARDWARE_BACKEND != "cuda" or (device is not None and torch.device(device).type == "cpu"):
        return None
    return int(getattr(_properties("cuda", _index(device)), "L2_cache_size", 0) or 0) or None


#: CUDA limits beside those torch reports: registers are given out per warp in this granule, each
#: resident block reserves this much shared memory for the system, and an SM holds at most this
#: many blocks (sm_80 and sm_90 alike)
_CUDA_REGISTER_GRANULE = 256
_CUDA_RESERVED_SHARED_PER_BLOCK = 1024
_CUDA_MAX_BLOCKS_PER_SM = 32


def cuda_programs_per_sm(num_warps: int, registers_per_thread: int, shared_bytes: int, props) -> int:
    """Programs (thread blocks) of one kernel that an SM holds at once, the lowest of its thread,
    register and shared-memory limits (CUDA's occupancy rule). ``props`` carries
    ``max_threads_per_multi_processor``, ``regs_per_multiprocessor`` and
    ``shared_memory_per_multiprocessor`` (``torch.cuda.get_device_properties``)."""
    by_threads = props.max_threads_per_multi_processor // (32 * num_warps)
    warp_registers = -(-max(registers_per_thread, 1) * 32 // _CUDA_REGISTER_GRANULE) * _CUDA_REGISTER_GRANULE
    by_registers = (props.regs_per_multiprocessor // warp_registers) // num_warps
    by_shared = props.shared_memory_per_multiprocessor // (shared_bytes + _CUDA_RESERVED_SHARED_PER_BLOCK)
    return max(0, min(by_threads, by_registers, by_shared, _CUDA_MAX_BLOCKS_PER_SM))


def resident_programs(compile_kernel, device: torch.device | str | int | None = None) -> int | None:
    """Programs of a Triton kernel that the whole device runs at once (compute units x programs
    per unit). ``compile_kernel()`` returns the compiled kernel (``jit_fn.warmup(...)``); it is
    called only where the answer is known: None on XPU (threads per Xe-core follow the GRF mode,
    no occupancy rule here yet), under the interpreter, or with a Triton whose compiled kernels do
    not expose registers and shared memory."""
    if backend() != "cuda":
        return None
    props = _properties("cuda", _index(device))
    try:
        compiled = compile_kernel()
        compiled._init_handles()  # loads the binary; registers are known only after that
        per_sm = cuda_programs_per_sm(compiled.metadata.num_warps, compiled.n_regs, compiled.metadata.shared, props)
    except (AttributeError, TypeError):
        return None
    return per_sm * int(props.multi_processor_count) if per_sm > 0 else None


@functools.lru_cache(maxsize=None)
def _descriptor_class():
    """Triton's host ``TensorDescriptor`` (Triton >= 3.4), or None (triton-xpu 3.3 has none)."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


def tensor_descriptors(device: torch.device | str | int | None = None) -> bool:
    """Whether kernels may load tiles through host tensor descriptors on ``device``: Triton has
    them, and on CUDA the GPU has the copy engine they lower to (TMA, compute capability >= 9).
    The interpreter runs them too (Triton >= 3.7)."""
    if _descriptor_class() is None:
        return False
    if backend() == "cuda":
        return _properties("cuda", _index(device)).major >= 9
    return True


def cuda_fp8(device: torch.device | str | int | None = None) -> bool:
    """Whether kernels on ``device`` may use the GPU's own fp8 e4m3 arithmetic: its conversions and
    fp8 tensor-core dots (NVIDIA, compute capability >= 8.9). Intel GPUs have none (PVC/BMG: no
    fp8 DPAS), nor the interpreter."""
    if backend() != "cuda":
        return False
    props = _properties("cuda", _index(device))
    return (props.major, props.minor) >= (8, 9)


def tensor_descriptor(tensor: torch.Tensor, shape: list, strides: list, block_shape: list):
    """A host tensor descriptor of ``tensor``'s memory seen with ``shape``/``strides`` (elements),
    loaded in ``block_shape`` tiles; out-of-bounds elements read as 0."""
    return _descriptor_class()(tensor, shape, strides, block_shape)


def device_descriptors(device: torch.device | str | int | None = None) -> bool:
    """Whether kernels may create tensor descriptors on the device (``tl.make_tensor_descriptor``,
    Triton >= 3.4; not triton-xpu 3.3; probed by :func:`language_builds`): on CUDA where the GPU
    has TMA (compute capability >= 9). Intel's Triton lowers them to its 2D block IO (3.4 to 3.7.0
    through block pointers in its TTIR, later through its own descriptor rewrite); the interpreter
    runs them."""
    if not language_builds("make_tensor_descriptor"):
        return False
    if backend() == "cuda":
        return _properties("cuda", _index(device)).major >= 9
    return True


@functools.lru_cache(maxsize=None)
def _grid_dependency_control() -> bool:
    """Whether this Triton compiles grid dependency control (``tl.extra.cuda.gdc_wait``) and
    launches kernels with programmatic dependent launch (the ``launch_pdl`` option)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


def programmatic_launch(device: torch.device | str | int | None = None) -> bool:
    """Whether a kernel on ``device`` may be launched before the one ahead of it in the stream has
    finished, waiting in-kernel for its results (programmatic dependent launch: CUDA, compute
    capability >= 9, a Triton with grid dependency control). The split-KV combine starts this way,
    so its launch overlaps the attention kernel's tail. False on XPU and under the interpreter."""
    if backend() != "cuda" or not _grid_dependency_control():
        return False
    return _properties("cuda", _index(device)).major >= 9


def ensure_scratch_allocator(device: torch.device | str | int | None = None) -> None:
    """Give Triton a global-scratch allocator (torch memory on ``device``) if none was set: kernels
    that create tensor descriptors on the device need one on CUDA. An allocator the caller set
    is kept."""
    import triton

    try:
        from triton.runtime import _allocation

        if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):  # another Triton's internals: set ours
        pass
    where = torch.device(device) if device is not None else default_device()
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=where))


class _Touched(Exception):
    """Raised by :class:`_StandIn` when a probed builtin uses one of its arguments."""


class _StandIn:
    """An argument of a probed builtin: any use of it (an attribute, iteration, a conversion, an
    operator) records that the builtin went on to build something and raises :class:`_Touched`."""

    def __init__(self, uses: list):
        object.__setattr__(self, "_uses", uses)

    def __getattr__(self, name):
        self._uses.append(name)
        raise _Touched(name)

    def _use(self, *args, **kwargs):
        self._uses.append("use")
        raise _Touched("use")

    __iter__ = __len__ = __bool__ = __index__ = __int__ = __float__ = __getitem__ = __call__ = _use
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __lt__ = __gt__ = __le__ = __ge__ = _use


@functools.lru_cache(maxsize=None)
def language_builds(name: str) -> bool:
    """Whether ``triton.language.<name>`` (a builtin such as ``make_block_ptr``, ``advance`` or
    ``make_tensor_descriptor``) builds IR in this Triton: present, and not a stub left after its
    removal. Upstream Triton 3.9 and Intel's main (3.8.0, since 2026-07-23) keep
    ``make_block_ptr`` / ``tl.advance`` as builtins that raise ``NotImplementedError`` ("Block
    pointers have been removed in favor of the tensor descriptor API"), so ``hasattr`` is no test.

    The probe calls the builtin itself with stand-in arguments that record any use (the
    ``_semantic`` / ``_builder`` context included, whichever this Triton names): a removal stub
    raises ``NotImplementedError`` before it reads an argument, a working builtin starts building
    from them and trips on the stand-ins. The removal lives in the frontend builtin, which a kernel
    compile (any backend) and the interpreter both call, so this is what a kernel would see; it
    compiles nothing, needs no GPU, driver or backend target, costs microseconds and runs once per
    name (cached). Tracing a tiny kernel to TTIR instead would need the backend's target and a
    compile per process, for the same answer.

    Parameters
    ----------
    name : str
        Attribute of ``triton.language``.

    Returns
    -------
    bool
        False where it is missing or raises ``NotImplementedError`` before using an argument.
    """
    import inspect

    import triton.language as tl

    fn = getattr(tl, name, None)
    if fn is None:
        return False
    try:
        params = inspect.signature(inspect.unwrap(fn)).parameters.values()
    except (TypeError, ValueError):
        return True  # not a Python builtin we can call with stand-ins: present is all we know
    uses: list = []
    context = [p.name for p in params if p.name in ("_semantic", "_builder")]
    args = [_StandIn(uses) for p in params if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in context]
    try:
        fn(*args, **{c: _StandIn(uses) for c in context})
    except NotImplementedError:
        # a removal stub raises before it reads an argument; raised after a use, it was building
        return bool(uses)
    except Exception:  # noqa: BLE001  (_Touched, or what building from stand-ins raised)
        return True
    return True


@functools.lru_cache(maxsize=None)
def block_pointers() -> bool:
    """Whether kernels may load tiles through ``tl.make_block_ptr`` / ``tl.advance``: where this
    Triton builds them (:func:`language_builds`). Triton 3.3-3.8 do, Intel's release/3.8.0
    branch too; upstream 3.9 and Intel's main removed them (a ``make_block_ptr`` that raises counts
    as absent). triton-xpu 3.3 turns those loads, and no other, into 2D block reads on Intel GPUs;
    newer Intel Triton prefers device-side tensor descriptors (:func:`device_descriptors`)."""
    return language_builds("make_block_ptr") and language_builds("advance")


def xpu_tile_loads() -> str:
    """How attention kernels read their 2D tiles (K/V, and q / out where they form a plain block)
    on Intel GPUs with the installed Triton: ``'descriptor'`` (device-side tensor descriptors,
    where ``tl.make_tensor_descriptor`` builds: Intel's Triton 3.4 on, the torch XPU wheels'
    3.7 and Intel's main), else ``'block_ptr'`` (block pointers: triton-xpu 3.3), else
    ``'pointer'`` (masked pointer loads, gathers)."""
    if language_builds("make_tensor_descriptor"):
        return "descriptor"
    return "block_ptr" if block_pointers() else "pointer"


def triton_version() -> str:
    """Version of the installed Triton (``pytorch-triton-xpu`` installs as ``triton`` too)."""
    import triton

    return triton.__version__


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


#: sub-group size of XPU launches of the attention kernels (those with ``tl.dot``): Intel's
#: backend lowers a dot to DPAS only at 16 lanes (PVC, BMG, Xe2), so launches state it
XPU_DPAS_SUB_GROUP = 16


def forget_probes() -> None:
    """Forget every cached answer about the installed Triton (``language_builds``,
    ``block_pointers``, ``xpu_option_fields``): tests that simulate another Triton call it."""
    language_builds.cache_clear()
    block_pointers.cache_clear()
    xpu_option_fields.cache_clear()


@functools.lru_cache(maxsize=None)
def xpu_option_fields() -> dict | None:
    """Field name -> default of the installed Intel backend's options dataclass (``XPUOptions``):
    the launch and compile options it takes (its ``parse_options`` drops any other without a
    word). None where no Intel backend is installed (upstream Triton, the interpreter)."""
    import dataclasses

    try:
        from triton.backends import backends
    except ImportError:
        return None
    intel = backends.get("intel")
    if intel is None:
        return None
    compiler = intel.compiler
    found = None
    for fn in (getattr(compiler, "parse_options", None), getattr(compiler, "__init__", None)):
        found = getattr(fn, "__globals__", {}).get("XPUOptions")
        if found is not None:
            break
    if found is None or not dataclasses.is_dataclass(found):
        return None
    return {f.name: f.default for f in dataclasses.fields(found)}


def xpu_sub_group_option(fields: dict | None = None) -> str | None:
    """Name of the sub-group size option in the installed Intel Triton: ``'warp_size'`` (from
    3.6: Intel renamed it on 2025-09-17) or ``'threads_per_warp'`` (3.3-3.5), read from its
    options dataclass (``fields``: :func:`xpu_option_fields` unless given); by the version where
    that class cannot be read; None where the class has neither."""
    fields = xpu_option_fields() if fields is None else fields
    if fields is None:
        return "warp_size" if _version_tuple(triton_version()) >= (3, 6) else "threads_per_warp"
    return next((name for name in ("warp_size", "threads_per_warp") if name in fields), None)


#: grf_mode spellings: triton-xpu 3.3-3.5 take ``small``/``large`` (128/256 registers a thread),
#: 3.6 on take the register counts
_GRF_BY_COUNT = {"small": "128", "large": "256"}
_GRF_BY_NAME = {"128": "small", "256": "large"}


def xpu_grf_modes(fields: dict | None = None) -> tuple:
    """``grf_mode`` values the installed Intel Triton takes: 3.3-3.5 list them as the field's
    default (``('small', 'large', 'auto', 'default')``); 3.6 takes ``'default'``, ``'128'``,
    ``'256'``, ``'auto'``, and 3.7.2 on ``'512'`` too (its default is the string ``'default'``)."""
    fields = xpu_option_fields() if fields is None else fields
    default = (fields or {}).get("grf_mode")
    if isinstance(default, tuple):
        return default
    if fields is None and _version_tuple(triton_version()) < (3, 6):
        return ("small", "large", "auto", "default")
    return ("default", "128", "256", "auto") + (("512",) if _version_tuple(triton_version()) >= (3, 7, 2) else ())


def xpu_grf_mode(mode: str, num_warps: int | None = None, fields: dict | None = None) -> str:
    """A ``grf_mode`` in the installed Intel Triton's spelling.

    Parameters
    ----------
    mode : str
        ``'128'`` / ``'small'``, ``'256'`` / ``'large'``, ``'512'``, ``'auto'`` or ``'default'``.
    num_warps : int, optional
        The launch's warps: 256 and 512 registers a thread take at most 32.
    fields : dict, optional
        The backend's options fields (:func:`xpu_option_fields` unless given).

    Returns
    -------
    str
        ``'large'`` / ``'small'`` for triton-xpu 3.3-3.5, ``'256'`` / ``'128'`` from 3.6.

    Raises
    ------
    ValueError
        A mode this Triton does not take (``'512'`` before 3.7.2), or 256/512 registers with more
        than 32 warps (the backend refuses to compile that).
    """
    modes = xpu_grf_modes(fields)
    spelled = mode
    if mode not in modes:
        spelled = (_GRF_BY_NAME if "large" in modes else _GRF_BY_COUNT).get(mode, mode)
    if spelled not in modes:
        raise ValueError(f"grf_mode {mode!r} is not one this Intel Triton ({triton_version()}) takes: {modes}")
    if spelled in ("large", "256", "512") and num_warps is not None and num_warps > 32:
        raise ValueError(f"grf_mode {mode!r} with num_warps = {num_warps}: Intel's backend refuses more than 32 warps "
                         "at 256 or 512 registers a thread")
    return spelled


def xpu_large_grf_mode() -> str:
    """Spelling of the 256-register mode for the installed Intel Triton: ``'256'`` from
    triton-xpu 3.6 on, ``'large'`` before (:func:`xpu_grf_mode`)."""
    return xpu_grf_mode("256")


def describe() -> dict:
    """Everything the self-check prints about the machine."""
    return {
        "backend": backend(),
        "device": device_name(),
        "device_key": device_key(),
        "compute_units": compute_units(),
        "triton": triton_version(),
        "torch": torch.__version__,
    }
