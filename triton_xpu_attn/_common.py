"""Helpers shared by every op: argument checks, device guards, and the registry of kernels for the
ahead-of-time XPU compile check. Kept in one place so no op copies them."""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import numbers
import threading
from typing import Any, Iterable

import numpy as np
import torch

from . import device as _device  # first: selects the interpreter before triton is imported
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

#: page sizes every op accepts: powers of two from 1 to 2048 (vLLM's large-page pools reach 2048;
#: a page's tiles are addressed one tile at a time, so no 2D surface spans a whole page)
SUPPORTED_PAGE_SIZES = tuple(2**i for i in range(12))

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_DTYPES = tuple(
    dt for dt in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if dt is not None
)
INDEX_DTYPES = (torch.int32, torch.int64)

#: the most programs a launch grid's second axis may hold (CUDA's limit for grid dims 1 and 2)
MAX_GRID_DIM_1 = 65535


def dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(
    name: str,
    value: Any,
    *,
    dtypes: Iterable[torch.dtype] | None = None,
    ndim: int | Iterable[int] | None = None,
    shape: tuple | None = None,
    last_dim_contiguous: bool = False,
) -> torch.Tensor:
    """Raise ``TypeError``/``ValueError`` naming ``name`` unless ``value`` is a tensor as expected.

    ``shape`` entries that are ``None`` are not checked.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if value.dtype not in dtypes:
            hint = ""
            if not value.dtype.is_floating_point and not value.dtype.is_complex and value.dtype != torch.bool \
                    and all(not d.is_floating_point for d in dtypes):
                # an index tensor of another integer width (torch's default is int64): say how to fix it
                hint = f": convert it with {name if name.isidentifier() else ''}.to(torch.{dtype_names(dtypes[:1])})"
            raise TypeError(f"{name} must have dtype in ({dtype_names(dtypes)}), got {dtype_names([value.dtype])}{hint}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if value.dim() not in allowed:
            raise ValueError(f"{name} must have {' or '.join(map(str, allowed))} dimensions, got shape {tuple(value.shape)}")
    if shape is not None:
        if value.dim() != len(shape) or any(s is not None and s != v for s, v in zip(shape, value.shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {want}, got {list(value.shape)}")
    if last_dim_contiguous and value.dim() > 0 and value.shape[-1] > 1 and value.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride(-1) == 1), got stride {value.stride()}")
    return value


def check_same_device(*, host_ok: bool = False, **tensors: torch.Tensor | None) -> torch.device:
    """All given tensors (None skipped) must sit on one device; returns it.

    Unless ``host_ok`` (an op with a host path for CPU inputs), that device must also be one the
    kernels can run on (:func:`check_kernel_device`): every op that launches kernels calls this
    before its first launch, so none ever surfaces Triton's "cannot be accessed from Triton (cpu
    tensor?)" error."""
    device = None
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):  # e.g. sinks as a Python list
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            raise ValueError(f"{name} is on {t.device} but {first} is on {device}: all inputs must be on one device")
    if device is not None and not host_ok:
        check_kernel_device(first, device)
    return device


def check_kernel_device(name: str, device: torch.device) -> None:
    """``ValueError`` naming ``name`` and both devices when ``device`` is the CPU but the kernels
    run on a GPU (the compiled backends cannot read host memory; only the interpreter runs on the
    CPU)."""
    backend = _device.backend()
    if device.type == "cpu" and backend != "interpreter":
        gpu = _device.default_device()
        raise ValueError(
            f"{name} is on cpu but kernels run on {gpu} here (the {backend} backend): move the inputs to "
            f"the GPU, e.g. {name}.to({str(gpu)!r})"
        )


# ---- the argument contract: every op checks its scalars through these ----
# A scalar of the wrong type raises TypeError, one out of range or not finite ValueError, both
# naming the argument. A scalar may be a Python number, a numpy scalar or a one-element torch
# tensor on any device, as upstream's wrappers hand on to their ops (sgl-kernel-xpu's tests pass
# ``window_size = torch.randint(0, seqlen_k, (2,))``): reading a tensor's value is a host sync, so
# graph paths pass Python numbers. bool is not a number here (``causal=1``, ``num_splits=True``
# are mistakes), a float is not an int (``(1.7, 0)`` is not rounded), and a tensor of more than
# one element is not a scalar.


def _scalar(value: Any, name: str) -> tuple[Any, str]:
    """``(the Python scalar value holds, what it was, for messages)``: the element of a one-element
    torch tensor on any device (``.item()``, a device->host sync for a GPU tensor) or the value of
    a numpy scalar; anything else as it is. ``ValueError`` naming ``name`` for a tensor of another
    size."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar or a one-element tensor, got a tensor of shape {list(value.shape)}")
        if value.is_meta:
            raise ValueError(f"{name} is a meta tensor: it holds no value to read")
        return value.item(), f"Tensor of dtype {dtype_names([value.dtype])}"
    if isinstance(value, np.generic):
        return value.item(), type(value).__name__
    return value, type(value).__name__


def _check_number(value: Any, name: str, kind: type, what: str, minimum, allow_none: bool):
    """``value`` (see ``_scalar``) converted to ``int``/``float`` when it is a ``kind`` number (not
    a bool), finite and at least ``minimum``; None where allowed."""
    if value is None and allow_none:
        return None
    value, got = _scalar(value, name)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {what}{' or None' if allow_none else ''}, got {got}")
    value = int(value) if kind is numbers.Integral else float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_int(value: Any, name: str, *, minimum: int | None = None, allow_none: bool = False) -> int | None:
    """``value`` as an int (a Python or numpy integer, or a one-element integer tensor on any
    device: reading it syncs with the host), at least ``minimum``; None where allowed."""
    return _check_number(value, name, numbers.Integral, "an int", minimum, allow_none)


def check_real(value: Any, name: str, *, minimum: float | None = None, allow_none: bool = False) -> float | None:
    """``value`` as a finite float (a Python or numpy real number, or a one-element integer or
    float tensor on any device: reading it syncs with the host), at least ``minimum``; None where
    allowed."""
    return _check_number(value, name, numbers.Real, "a real number", minimum, allow_none)


def check_bool(value: Any, name: str) -> bool:
    """``value`` as a bool: ``True``/``False``, a numpy bool or a one-element bool tensor (a host
    sync); ``causal="no"`` and ``causal=1`` are not bools."""
    value, got = _scalar(value, name)
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {got}")
    return value


def check_window(value: Any, name: str = "window_size") -> tuple[int, int]:
    """A ``(left, right)`` attention window: two ints >= -1 (-1: unbounded on that side), as a
    tuple or list of two scalars (``check_int``) or a tensor / numpy array of shape ``(2,)`` (a
    host sync for a GPU tensor)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if tuple(value.shape) != (2,):
            raise ValueError(f"{name} must be a (left, right) pair of ints, got a {type(value).__name__} of shape {list(value.shape)}")
        value = tuple(value.cpu() if isinstance(value, torch.Tensor) else value)  # one read for both entries
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be a (left, right) pair of ints, got {value!r}")
    left, right = (check_int(v, f"{name}[{i}]", minimum=-1) for i, v in enumerate(value))
    return left, right


def check_page_size(page_size: Any, name: str = "page_size") -> int:
    page_size = check_int(page_size, name)
    if page_size not in SUPPORTED_PAGE_SIZES:
        raise ValueError(f"{name} must be a power of two from 1 to 2048, got {page_size}")
    return page_size


def check_positive_int(value: Any, name: str) -> int:
    value = check_int(value, name)
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def validate_query_offsets(cu_seqlens_q: torch.Tensor, max_seqlen_q: int | None, name: str = "cu_seqlens_q") -> None:
    """validate=True, for every op that takes query offsets: ``cu_seqlens_q`` (on the host) starts
    at 0 (else the rows before it are never written), and ``max_seqlen_q``, when given, covers
    every request (else the rows past it are never written)."""
    if cu_seqlens_q.numel() and int(cu_seqlens_q[0]) != 0:
        raise ValueError(f"{name}[0] must be 0, got {int(cu_seqlens_q[0])}")
    if max_seqlen_q is not None and cu_seqlens_q.numel() > 1:
        q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
        b = int(q_lens.argmax())
        if int(q_lens[b]) > max_seqlen_q:
            raise ValueError(f"max_seqlen_q = {max_seqlen_q} but request {b} has {int(q_lens[b])} queries")


def validate_lengths_and_pages(lengths_name: str, lengths: torch.Tensor, page_table: torch.Tensor, page_size: int,
                               num_pages: int) -> None:
    """``validate=True`` of the paged ops (a host sync): every length fits the page-table width and
    every page id that will be read lies in ``[0, num_pages)``; ``ValueError`` otherwise."""
    lens = lengths.long().cpu()
    width = page_table.shape[1]
    if (lens < 0).any():
        raise ValueError(f"{lengths_name} must be >= 0, got {lens.min().item()}")
    if (lens > width * page_size).any():
        b = int((lens > width * page_size).nonzero()[0])
        raise ValueError(
            f"{lengths_name}[{b}] = {int(lens[b])} exceeds the page table: {width} pages x page_size {page_size}"
        )
    used = torch.arange(width)[None, :] < ((lens + page_size - 1) // page_size)[:, None]
    pages = page_table.cpu()[used]
    if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= num_pages):
        bad = pages[(pages < 0) | (pages >= num_pages)][0]
        raise ValueError(f"page_table holds page id {int(bad)} outside the pool [0, {num_pages})")


def interpreter_float32(*tensors: torch.Tensor | None) -> tuple:
    """The tensors a launcher hands a kernel, with each bf16 one as an fp32 copy under Triton's
    interpreter, whose bf16 arithmetic is wrong upstream (loads, stores and casts are right).

    Everything else, and every tensor on a compiled backend, comes back as it is (no copy), so the
    GPU hot path is untouched. Pass outputs too and copy a stand-in back into the caller's tensor
    (``if stand_in is not out: out.copy_(stand_in)``), or cast a result the launcher allocated."""
    if not _device.is_interpreter():
        return tensors
    return tuple(t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 else t for t in tensors)


#: Triton's interpreter keeps a launch's grid and its patched ``triton.language`` in process-wide
#: state: two threads launching at once break each other ("y >= grid_dim[1]", "Did you forget to
#: add @triton.jit ?"). Interpreted launches take turns on this lock (reentrant: a launcher's
#: combine step runs inside its guard); compiled launches run concurrently.
_INTERPRETER_LOCK = threading.RLock()


def device_guard(device: torch.device) -> contextlib.AbstractContextManager:
    """Make ``device`` current while launching, so ``cuda:1`` / ``xpu:1`` inputs run on their GPU;
    under the interpreter, one thread's launches at a time (``_INTERPRETER_LOCK``). Every kernel
    launch of the package sits inside one."""
    if _device.is_interpreter():
        _device.check_interpreter_usable()  # triton imported first: say what to do, not a Triton error
        return _INTERPRETER_LOCK  # the interpreter runs on the host whatever device the tensors are on
    if device.type == "cuda":
        return torch.cuda.device(device)
    if device.type == "xpu":
        return torch.xpu.device(device)
    return contextlib.nullcontext()


def paged_rows_descriptors(cache: torch.Tensor, page_size: int, row_width: int, blocks, device) -> list | None:
    """Host tensor descriptors of a paged cache seen as ``[pages * page_size, row_width]`` rows (a
    contiguous ``[rows, ...]`` tensor: ``page_size = 0``), one per block shape of ``blocks``, or
    None where they cannot be used: the device or Triton lacks them, pages do not follow each
    other at ``page_size`` row strides, the row stride or the base is not 16-byte aligned, or the
    rows reach 2^31 (descriptor coordinates are 32-bit). Kernels load whole key tiles of one page
    through them (TMA on Hopper, 2D block IO on Intel GPUs)."""
    if not _device.tensor_descriptors(device):
        return None
    if page_size:
        rows, stride_row = cache.shape[0] * page_size, cache.stride(1)
        if cache.stride(0) != page_size * stride_row:
            return None
    else:
        rows, stride_row = cache.shape[0], cache.stride(0)
    if rows >= 2**31 or (stride_row * cache.element_size()) % 16 or cache.data_ptr() % 16:
        return None
    return [_device.tensor_descriptor(cache, [rows, row_width], [stride_row, 1], list(block)) for block in blocks]


# Grid dependency control (programmatic dependent launch, device.programmatic_launch): Triton >= 3.4
# has it in tl.extra.cuda. Triton resolves every attribute a kernel names when it hashes the kernel,
# taken branch or not, so naming tl.extra.cuda.gdc_wait in a kernel fails to compile on a Triton
# without it (triton-xpu 3.3) even behind a constexpr False. Kernels call these instead: the real
# instructions where this Triton has them, else no-ops (their launches never ask for them there).
_CUDA_EXTRA = getattr(getattr(tl, "extra", None), "cuda", None)
if hasattr(_CUDA_EXTRA, "gdc_wait") and hasattr(_CUDA_EXTRA, "gdc_launch_dependents"):
    @triton.jit
    def gdc_wait():
        """Wait until the grid this one was launched after has finished and its writes are visible."""
        tl.extra.cuda.gdc_wait()

    @triton.jit
    def gdc_launch_dependents():
        """Let the grid launched after this one start (it waits in-kernel with gdc_wait)."""
        tl.extra.cuda.gdc_launch_dependents()
else:
    @triton.jit
    def gdc_wait():
        """No-op: this Triton has no grid dependency control."""
        pass

    @triton.jit
    def gdc_launch_dependents():
        """No-op: this Triton has no grid dependency control."""
        pass


# Device-side tensor descriptors (tl.make_tensor_descriptor: Triton >= 3.4, not triton-xpu 3.3),
# bound here behind the probe like gdc_wait above: kernels call rows_descriptor only on launches
# that asked for descriptors (device.device_descriptors), and on a Triton without them the stub's
# body names nothing it lacks, so the kernels' other paths still compile there.
if _device.language_builds("make_tensor_descriptor"):
    @triton.jit
    def rows_descriptor(base, stride_tok, width, rows, BLOCK_ROWS: tl.constexpr, BLOCK_W: tl.constexpr):
        """Device-side tensor descriptor over ``rows`` rows of ``width`` elements from ``base``
        (row pitch ``stride_tok``, elements contiguous), read in ``[BLOCK_ROWS, BLOCK_W]`` blocks:
        rows outside ``[0, rows)`` and columns past ``width`` read 0 (a block loaded at row
        ``-skip`` covers a key tile whose first ``skip`` rows no query sees) and are never
        written by a store. Base and row pitch must be 16-byte aligned. The 2D load Intel's Triton
        prefers (lowered to its 2D block IO); TMA on Hopper."""
        return tl.make_tensor_descriptor(base, shape=[rows, width], strides=[stride_tok, 1],
                                         block_shape=[BLOCK_ROWS, BLOCK_W])
else:
    @triton.jit
    def rows_descriptor(base, stride_tok, width, rows, BLOCK_ROWS: tl.constexpr, BLOCK_W: tl.constexpr):
        """Triton without ``tl.make_tensor_descriptor`` (triton-xpu 3.3): never called (launchers
        ask for descriptors only where ``device.device_descriptors()``)."""
        return base


@triton.jit
def block_rows(base, stride_tok, width, rows, skip, BLOCK_ROWS: tl.constexpr, BLOCK_W: tl.constexpr,
                TRANSPOSED: tl.constexpr, col=0):
    """Block pointer over ``BLOCK_ROWS`` cache rows of ``width`` elements whose row ``skip`` is at
    ``base``: rows ``skip .. skip + rows - 1`` of the block are the valid ones, the rest (and
    columns past ``width``) read as 0 through the boundary check, so a row no query may see is
    never loaded. ``TRANSPOSED``: the block is ``[BLOCK_W, BLOCK_ROWS]``, column-major (K^T), the
    form triton-xpu turns into transposed 2D block reads (rows loaded and transposed stay gathers);
    else ``[BLOCK_ROWS, BLOCK_W]`` row-major (V). The row pitch is a kernel argument: a pitch
    computed in the kernel keeps triton-xpu on gathers (shared/notes/xpu_native.md). ``col``: the
    block's first column, as an offset of the block pointer, not added to ``base``: triton-xpu
    3.3 passes a base that is not 64-byte aligned to the 2D block read as it is, with the
    misalignment also added to x and the width, so it counts twice where the low 6 bits of the
    base are not ignored (BMG; intel-xpu-backend-for-triton #4304, fixed by #4335)."""
    if TRANSPOSED:
        block = tl.make_block_ptr(base, shape=(width, rows), strides=(1, stride_tok), offsets=(col, -skip),
                                  block_shape=(BLOCK_W, BLOCK_ROWS), order=(0, 1))
    else:
        block = tl.make_block_ptr(base, shape=(rows, width), strides=(stride_tok, 1), offsets=(-skip, col),
                                  block_shape=(BLOCK_ROWS, BLOCK_W), order=(1, 0))
    return block


@triton.jit
def clamp_page(page, num_pages):
    """Kernel helper: page ids ``page`` (int32 or int64, scalar or tensor) with an id outside the
    pool ``[0, num_pages)`` (``num_pages >= 1``; the launchers return early on an empty cache)
    replaced by the pool's last page, as an unsigned int of their width (one unsigned min: a
    negative id wraps past any pool size; widen with ``.to(tl.int64)``). With ``validate=False``
    the ops trust no page table: such an id is never followed, the keys it names read the last
    page's rows in its place (in bounds, deterministic). Checks that make the result loud (NaN
    scores) cost decode kernels registers and occupancy (experiments/untrusted_metadata.txt)."""
    # (num_pages - 1 joins the unsigned compare at the ids' width; as a plain int when Triton
    # specialises a one-page pool's count to the constant 1). int64 tables: unsigned int64
    if page.dtype.is_int64():
        return tl.minimum(page.to(tl.uint64, bitcast=True), num_pages - 1)
    else:
        return tl.minimum(page.to(tl.uint32, bitcast=True), num_pages - 1)


@triton.jit
def tile_row(pt_row, kv_start, n0, hi, PAGE_SIZE: tl.constexpr):
    """Kernel helper: cache row of key ``n0`` in the ``[token rows, row]`` view that
    ``paged_rows_descriptors`` gives: through the page table row ``pt_row`` (0 when ``n0 >= hi``,
    a tile that is never loaded), or ``kv_start + n0`` for contiguous K/V (``PAGE_SIZE = 0``).
    No ``clamp_page`` here: a descriptor load bounds-checks its coordinates in hardware (TMA, Intel
    2D block reads), so a page id outside the pool reads zeros (or, past int32, a wrapped row of
    the cache), never memory outside it; a clamp in this prefetch cost TMA prefill 1.5% on an H100
    (experiments/untrusted_metadata.txt)."""
    if PAGE_SIZE == 0:
        return kv_start + n0
    else:
        return tl.load(pt_row + n0 // PAGE_SIZE, mask=n0 < hi, other=0) * PAGE_SIZE + n0 % PAGE_SIZE


@triton.jit
def online_max(m_i, tile_max):
    """Kernel helper: the running row maxima ``m_i`` against a key tile's ``tile_max`` (log2
    units): (new max, the max to subtract from the tile's scores, rescale of the running sums). A
    row that has seen no key yet keeps max -inf and subtracts 0."""
    m_new = tl.maximum(m_i, tile_max)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, m_safe, tl.exp2(m_i - m_safe)


@triton.jit
def softmax_step(s, m_i, l_i, scale=1.0, SCALE_IN_EXP: tl.constexpr = False):
    """Kernel helper: online-softmax update of one score tile ``s`` (log2 units) against the
    running row maxima ``m_i`` and sums ``l_i``: (probabilities, rescale of the running sums, new
    max, new sum); a row that has seen no key yet gets probabilities 0. ``SCALE_IN_EXP``: ``s``
    holds unscaled scores and ``scale`` (> 0) their factor to log2 units (see ``exp2_shifted``)."""
    tile_max = tl.max(s, axis=1)
    if SCALE_IN_EXP:
        tile_max = tile_max * scale
    m_new, m_safe, alpha = online_max(m_i, tile_max)
    p = exp2_shifted(s, scale, m_safe, SCALE_IN_EXP)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def exp2_shifted(s, scale, m_safe, SCALE_IN_EXP: tl.constexpr):
    """``2 ** (s - m_safe)`` per row, or with ``SCALE_IN_EXP`` ``2 ** (s * scale - m_safe)``: one
    fused multiply-add a score instead of a multiply before the row max and a subtract after it
    (the max of unscaled scores times a positive scale is the max of the scaled ones, rounding
    being monotonic). Masked scores are -inf either way."""
    if SCALE_IN_EXP:
        p = tl.exp2(s * scale - m_safe[:, None])
    else:
        p = tl.exp2(s - m_safe[:, None])
    return p


def kernel_quantises(fmt: torch.dtype) -> bool:
    """Whether a kernel converts to the fp8 type ``fmt`` itself. Compiled backends do. Triton's
    interpreter casts fp32 -> fp8 wrongly (a mantissa carry into the exponent is dropped: 31.94 ->
    16 in e4m3), so under it torch quantises and the kernel copies the bytes, except e4m3 on the
    Intel path (``device.intel_gpu()``: the kernel's ``INTEL_GPU`` encodes in integer arithmetic,
    exact there, :func:`fp8_cast`)."""
    return not _device.is_interpreter() or (fmt == torch.float8_e4m3fn and _device.intel_gpu())


@triton.jit
def e4m3_bytes(x):
    """Kernel helper: fp32 ``x`` as fp8 e4m3fn bytes (int32, 0..255), in integer arithmetic:
    rounded to nearest even, saturated to +-448 (infinities too), subnormals (multiples of 2^-9)
    rounded likewise, the sign kept (-0.0 -> 0x80), NaN -> 0x7F / 0xFF. Bit for bit
    ``x.clamp(-448, 448).to(torch.float8_e4m3fn)``. The Intel GPU path of the e4m3 quantisers
    (``fp8_cast``): triton-xpu's own fp32 -> e4m3 conversion saturates at 256 and rounds through
    fp16 before 3.4, and through fp16 in 3.4 (docs/xpu.md, "fp8 e4m3 stores")."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    e = mag >> 23  # fp32 biased exponent; e4m3 normals (|x| >= 2^-6) have e >= 121
    # normals: drop 20 of the 23 mantissa bits to nearest even (a carry runs into the exponent),
    # rebias (120 << 3 = 960); 0x7E (448) at most; |x| capped at inf first (no int32 overflow)
    m = tl.minimum(mag, 0x7F800000)
    normal = tl.minimum(((m + 0x7FFFF + ((m >> 20) & 1)) >> 20) - 960, 0x7E)
    # below 2^-6: the 24-bit significand shifted right by 141 - e (k * 2^-9, k = 0..8; 8 is the
    # smallest normal's byte), to nearest even; shifts kept in [21, 31] on every lane
    s = tl.minimum(tl.maximum(141 - e, 21), 31)
    sig = (mag & 0x7FFFFF) | 0x800000
    q = sig >> s
    rest = sig - (q << s)
    half = 1 << (s - 1)
    sub = q + ((rest > half) | ((rest == half) & ((q & 1) == 1))).to(tl.int32)
    y = tl.where(e >= 121, normal, sub)
    return tl.where(mag > 0x7F800000, 0x7F, y) | sign


@triton.jit
def fp8_cast(x, ptr, INTEL_GPU: tl.constexpr):
    """Kernel helper: ``x`` as the element type of ``ptr``, what a store through ``ptr`` takes:
    ``x.to(ptr.dtype.element_ty)``, except a wider float into an e4m3 target with ``INTEL_GPU``,
    which gets :func:`e4m3_bytes` of its fp32 value reinterpreted as e4m3 (exact on every
    triton-xpu; fp8 ``x`` is copied as it is). Elsewhere (NVIDIA: the hardware's saturating
    conversion) the code is the plain cast."""
    if INTEL_GPU and ptr.dtype.element_ty == tl.float8e4nv:
        if x.dtype.is_fp8():
            y = x.to(ptr.dtype.element_ty)
        else:
            y = e4m3_bytes(x.to(tl.float32)).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
    else:
        y = x.to(ptr.dtype.element_ty)
    return y


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def config_pow2(op: str, name: str, value, low: int = 16) -> int:
    """A tile size ``name`` of ``op``'s config (an override's or a file's) as an int: a power of two
    >= ``low``, else a ``ValueError`` naming the op and the knob."""
    value = int(value)
    if value < low or value & (value - 1):
        raise ValueError(f"{op} config: {name} must be a power of two >= {low}, got {value}")
    return value


def whole_wave_splits(splits: int, programs_per_split: int, resident: int | None) -> int:
    """KV splits cut down so the programs fill whole waves of the device.

    ``resident``: programs the device runs at once (``device.resident_programs``; None = unknown,
    ``splits`` is kept). A grid of at most one wave is kept as it is; a larger one drops its last,
    partial wave (a thin second wave runs on a few units after the rest went idle: H200, 8/1/128
    q_len-4 drafts at 32k keys, 5 splits = 1.2 waves 378 us, 4 splits = one wave 270 us)."""
    if not resident or splits <= 1 or splits * programs_per_split <= resident:
        return splits
    waves = splits * programs_per_split // resident
    return max(1, waves * resident // programs_per_split)


# --------------------------------------------------------------------------------------------
# Registry for the ahead-of-time XPU compile check (.ci/xpu_compile_check.py).
# Each kernel registers representative compile settings right where it is defined, so a kernel
# added later is compiled by the check without editing any hand-kept list.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LaunchShape:
    """The work one launch of a compile variant does at a stated problem shape (the native-code
    table's work columns: what the per-program code costs times the programs, beside the
    algorithm's minimum)."""

    shape: str  # the problem, e.g. "B1 H128 L4096"
    programs: int  # programs the launch runs
    iterations: int  # key-loop iterations of a program (the mean where they differ)
    loaded_bytes: int  # K/V bytes a program loads per iteration
    min_macs: int  # the algorithm's multiply-adds: each score and each P @ V product once
    min_bytes: int  # the algorithm's K/V bytes: each byte once per KV head (group)


@dataclasses.dataclass
class CompileVariant:
    kernel: Any  # the @triton.jit function
    label: str
    signature: dict  # argument name -> Triton type string ("*fp16", "i32", "fp32", ...) or "constexpr"
    constexprs: dict  # constexpr argument name -> value
    options: dict  # num_warps, num_stages, ...
    dots: int  # how many tl.dot the kernel holds (the check asserts DPAS when > 0)
    op: str | None = None  # op name used in autotune_configs/<backend>/*.json ("ops" keys); None = no config
    block_2d: tuple = ()  # operands this variant reads by 2D block reads on XPU (the native audit checks it)
    launch: Any = None  # constexprs -> LaunchShape of a representative launch (work columns), or None


COMPILE_VARIANTS: list[CompileVariant] = []


def register_xpu_compile(kernel, label: str, args: dict, *, dots: int = 0, op: str | None = None, block_2d: tuple = (),
                         launch=None, **options) -> None:
    """Record one representative compilation of ``kernel``.

    ``args`` maps every kernel parameter to either a Triton type string (``"*bf16"``, ``"i32"``,
    ``"i64"``, ``"fp32"``) for runtime arguments, or its value for ``tl.constexpr`` parameters.
    ``dots`` is the number of ``tl.dot`` in the kernel (tests/test_registry.py checks it).
    ``op`` names the op whose tuned configs launch this kernel: the key under ``"ops"`` in
    ``autotune_configs/<backend>/<device>.json`` (the one ``tune.lookup(op, ...)`` uses). Ops that
    read config files must set it, so the compile check also compiles this variant with each
    file's launch options (``num_warps``, ``num_stages``, ``grf_mode``). ``block_2d`` names the
    operands (``"K"``, ``"V"``, ...) this variant loads through 2D block reads on Intel GPUs: the
    native-code audit fails when it has none. ``launch`` maps the compile's constexprs (the
    variant's, or a config's overrides of them) to the ``LaunchShape`` of a representative launch:
    the table then shows the DPAS work and K/V bytes of the whole launch beside the algorithm's
    minimum. Remaining keyword arguments are launch options of this variant.
    """
    fn = getattr(kernel, "fn", kernel)
    parameters = inspect.signature(fn).parameters
    params = list(parameters)
    # constexpr parameters, and arguments passed as None (Triton specialises those as constexprs)
    constexpr_names = {p.name for p in parameters.values() if "constexpr" in str(p.annotation) or args.get(p.name, 0) is None}
    missing = [p for p in params if p not in args]
    extra = [a for a in args if a not in params]
    if missing or extra:
        raise AssertionError(f"compile variant {label} of {fn.__name__}: missing {missing}, unknown {extra}")
    signature = {p: ("constexpr" if p in constexpr_names else args[p]) for p in params}
    constexprs = {p: args[p] for p in params if p in constexpr_names}
    COMPILE_VARIANTS.append(
        CompileVariant(kernel, f"{fn.__name__}[{label}]", signature, constexprs, options, dots, op, tuple(block_2d),
                       launch))
