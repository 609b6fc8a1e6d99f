"""Test harness: the interpreter on CPU-only machines, hypothesis profiles, shared fixtures.

Importing triton_xpu_attn first sets TRITON_INTERPRET=1 when no GPU exists (before any kernel is
defined). Profiles: ``ci`` (default: few examples, no deadline, derandomised) and ``gpu``
(hundreds of examples), chosen with ``TRITON_XPU_ATTN_PROFILE=gpu``.
"""
import os

import pytest
from hypothesis import HealthCheck, settings

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
settings.load_profile(os.environ.get("TRITON_XPU_ATTN_PROFILE", "ci"))

DEVICE = _device.default_device()
INTERPRET = _device.is_interpreter()


def pytest_collection_modifyitems(config, items):
    if not INTERPRET:
        return
    skip = pytest.mark.skip(reason="needs a compiled backend (runs on the GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE
