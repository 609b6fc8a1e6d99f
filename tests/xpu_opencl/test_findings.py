"""What running triton-xpu's code found, kept as tests on Intel's OpenCL CPU device (they run when
``TRITON_XPU_ATTN_OPENCL`` names a target; docs/xpu.md states each finding).

* triton-xpu 3.3 converts fp32 to e4m3 saturating at 256 (its LLVM IR clamps the fp16 intermediate
  at 0x5C00): a plain cast is wrong, the package's ``fp8_cast`` on the Intel path is right.
* triton-xpu 3.3 computes an fp32 ``tl.dot`` on its FMA path (``input_precision="ieee"``) wrongly
  when the accumulator tile repeats along N (N above 64 x warps): values land in other rows and
  columns. The LLVM IR triton-xpu emits computes it so (run on a host interpreter of that IR), so
  the CPU runtime is not the cause. ``tune.launch_options(..., fp32_dot_columns=N)`` gives the
  warps that avoid it.

The two miscompiles are strict xfails: a triton-xpu that fixes one fails its test, which then says so.
"""
from __future__ import annotations

import pytest

from . import harness

if harness.active() is None:
    pytest.skip("runs on Intel's OpenCL CPU device (TRITON_XPU_ATTN_OPENCL)", allow_module_level=True)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from triton_xpu_attn import _common, tune  # noqa: E402


@triton.jit
def _cast_e4m3(x_ptr, y_ptr, y8_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    tl.store(y_ptr + i, x.to(tl.float8e4nv))  # triton-xpu's own conversion
    tl.store(y8_ptr + i, _common.fp8_cast(x, y8_ptr, True))  # the Intel path of the quantisers


@triton.jit
def _dot_fp32(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    m = tl.arange(0, M)
    n = tl.arange(0, N)
    k = tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(c_ptr + m[:, None] * N + n[None, :], tl.dot(a, b, input_precision="ieee"))


VALUES = [300.0, -300.0, 448.0, 17.001, 400.0, 1000.0, -0.0, 0.5]


def _e4m3(values):
    x = torch.tensor(values)
    y = torch.empty(len(values), dtype=torch.float8_e4m3fn)
    y8 = torch.empty(len(values), dtype=torch.float8_e4m3fn)
    _cast_e4m3[(1,)](x, y, y8, len(values))
    want = x.clamp(-448, 448).to(torch.float8_e4m3fn)
    return y.view(torch.uint8), y8.view(torch.uint8), want.view(torch.uint8)


def test_fp8_cast_on_the_intel_path_saturates_at_448_and_rounds_to_nearest_even():
    _, ours, want = _e4m3(VALUES)
    assert torch.equal(ours, want)


@pytest.mark.xfail(strict=True, reason="triton-xpu 3.3 saturates fp32 -> e4m3 at 256 (docs/xpu.md, fp8 e4m3 stores)")
def test_triton_xpu_cast_to_e4m3():
    plain, _, want = _e4m3(VALUES)
    assert torch.equal(plain, want)


def _dot(n: int, warps: int) -> float:
    g = torch.Generator().manual_seed(n + warps)
    a, b = torch.randn(16, 16, generator=g), torch.randn(16, n, generator=g)
    c = torch.full((16, n), float("nan"))
    _dot_fp32[(1,)](a, b, c, 16, n, 16, **tune.launch_options({"num_warps": warps}))  # 16 lanes, as launched
    ref = a.double() @ b.double()
    return float((c.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("n", [128, 512])
def test_fp32_dot_on_the_warps_launch_options_give_is_right(n):
    warps = tune.launch_options({"num_warps": 1}, fp32_dot_columns=n)["num_warps"]
    assert warps == n // 64
    assert _dot(n, warps) < 1e-6


@pytest.mark.xfail(strict=True, reason="triton-xpu 3.3: fp32 FMA dot whose accumulator repeats along N (docs/xpu.md, fp32 dots)")
@pytest.mark.parametrize("n, warps", [(512, 4), (128, 1)])
def test_triton_xpu_fp32_dot_repeating_along_n(n, warps):
    assert _dot(n, warps) < 1e-6
