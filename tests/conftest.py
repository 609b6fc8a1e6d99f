"""Test harness: the interpreter on CPU-only machines, hypothesis profiles, shared fixtures.

Importing triton_xpu_attn first sets TRITON_INTERPRET=1 when no GPU exists (before any kernel is
defined). Profiles: ``ci`` (default: few examples, no deadline, derandomised) and ``gpu``
(hundreds of examples), chosen with ``TRITON_XPU_ATTN_PROFILE=gpu``.
"""
import os

import pytest
from hypothesis import HealthCheck, settings

if os.environ.get("TRITON_XPU_ATTN_OPENCL"):  # Intel's SPIR-V on the OpenCL CPU device (tests/xpu_opencl)
    from xpu_opencl import harness as _opencl

    _opencl.activate(os.environ["TRITON_XPU_ATTN_OPENCL"])

import triton_xpu_attn  # noqa: F401  (selects the interpreter on a CPU-only machine)
from triton_xpu_attn import device as _device

settings.register_profile(
    "ci",
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
settings.register_profile(
    "gpu",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
settings.register_profile(
    "opencl",  # Intel's SPIR-V on the OpenCL CPU device: every new shape is a new build of minutes
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
OPENCL = os.environ.get("TRITON_XPU_ATTN_OPENCL")
settings.load_profile(os.environ.get("TRITON_XPU_ATTN_PROFILE", "opencl" if OPENCL else "ci"))

DEVICE = _device.default_device()
INTERPRET = _device.is_interpreter()
#: CPU execution, where every kernel is slow to run (the interpreter) or to build (Intel's OpenCL CPU
#: device): tests take their small shapes
SMALL = INTERPRET or bool(OPENCL)


def pytest_collection_modifyitems(config, items):
    if OPENCL:  # the set chosen for the OpenCL CPU device (tests/xpu_opencl/selected.txt), no other
        _opencl.select(config, items)
        return
    if not INTERPRET:
        return
    skip = pytest.mark.skip(reason="needs a compiled backend (runs on the GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE
