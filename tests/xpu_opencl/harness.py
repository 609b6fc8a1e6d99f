"""Run the package's own tests with triton-xpu's SPIR-V executed on Intel's OpenCL CPU device.

``activate(target)`` must run before ``triton_xpu_attn`` is imported (``tests/conftest.py`` calls
it when ``TRITON_XPU_ATTN_OPENCL`` names a target, ``pvc`` or ``bmg``). It makes the package see an
Intel GPU of that target with CPU tensors:

* Triton compiles (``TRITON_INTERPRET=0``) through Intel's backend for the target's properties
  (DPAS, 2D block IO, sub-group sizes) and launches through :mod:`.driver`;
* the package's device module reports backend ``"xpu"`` with the target's name and Xe-cores, so
  the XPU configs (``autotune_configs/xpu/<device>.json``), tiles and ``INTEL_GPU`` code paths
  are the ones selected, exactly as on the GPU;
* tensors stay on the CPU (the OpenCL CPU device reads host memory in place): the check that
  refuses host tensors on a GPU backend is lifted, nothing else.
"""
from __future__ import annotations

import os

from . import driver

#: the environment variable that selects the OpenCL CPU device and names the target
ENV = "TRITON_XPU_ATTN_OPENCL"


class _Properties:
    """What ``torch.xpu.get_device_properties`` reports that the package reads."""

    def __init__(self, target: str):
        self.name = driver.TARGETS[target]["name"]
        self.gpu_subslice_count = driver.TARGET_CORES[target]
        self.max_compute_units = 8 * self.gpu_subslice_count
        self.total_memory = 16 << 30


def install_arch_parser_stub() -> None:
    """triton-xpu's backend builds a SYCL helper (``arch_utils``) that only names the architecture
    for an optional ``ocloc`` query; without SYCL headers it cannot build, so it answers "" here."""
    from triton.backends import backends

    g = backends["intel"].compiler.__init__.__globals__
    original = g["compile_module_from_src"]
    if getattr(original, "_arch_stub", False):
        return

    class _Arch:
        def parse_device_arch(self, value):
            return ""

    def compile_module_from_src(src, name, *args, **kwargs):
        return _Arch() if name == "arch_utils" else original(src, name, *args, **kwargs)

    compile_module_from_src._arch_stub = True
    g["compile_module_from_src"] = compile_module_from_src


_ACTIVE: str | None = None


def active() -> str | None:
    """The target the tests run on (``"pvc"`` / ``"bmg"``), or None."""
    return _ACTIVE


def activate(target: str) -> None:
    global _ACTIVE
    if target not in driver.TARGETS:
        raise ValueError(f"{ENV}={target!r}: the OpenCL targets are {sorted(driver.TARGETS)}")
    if _ACTIVE == target:
        return
    if _ACTIVE is not None:
        raise RuntimeError(f"the OpenCL device already runs target {_ACTIVE!r}")
    os.environ["TRITON_INTERPRET"] = "0"
    import torch
    import triton

    if "intel" not in __import__("triton.backends", fromlist=["backends"]).backends:
        raise RuntimeError("the OpenCL CPU device runs Intel's Triton (triton-xpu); the installed Triton "
                           f"{triton.__version__} has no Intel backend")
    install_arch_parser_stub()
    triton.runtime.driver.set_active(driver.make_driver(target))

    from triton_xpu_attn import _common, device

    properties = _Properties(target)
    device._HARDWARE_BACKEND = "xpu"
    device._properties = lambda kind, index: properties
    device._index = lambda dev=None: 0
    device.default_device = lambda: torch.device("cpu")
    _common.check_kernel_device = lambda name, dev: None
    _ACTIVE = target


#: the tests that run on the OpenCL CPU device, one pytest node id a line (``#`` comments): CI's set,
#: or the longer one with ``TRITON_XPU_ATTN_OPENCL_SET=full``
SET_ENV = "TRITON_XPU_ATTN_OPENCL_SET"


def selected_path() -> str:
    name = {"": "selected.txt", "ci": "selected.txt", "full": "selected_full.txt"}.get(os.environ.get(SET_ENV, ""))
    if name is None:
        raise ValueError(f"{SET_ENV}={os.environ[SET_ENV]!r}: the sets are 'ci' (default) and 'full'")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def selected_ids() -> list[str]:
    with open(selected_path()) as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


def select(config, items) -> None:
    """Keep the items the selected set names (a node id, or a test's id without its parameters for
    all of them) and the emulation's own tests; ``pytest.UsageError`` naming every listed id that
    matches nothing collected, so a renamed test cannot leave the set silently."""
    import pytest

    wanted = selected_ids()
    own = os.path.dirname(os.path.abspath(__file__))
    keep, hit = [], set()
    for item in items:
        base = item.nodeid.split("[", 1)[0]
        match = [w for w in wanted if w in (item.nodeid, base)]
        if match or os.path.abspath(str(item.fspath)).startswith(own):
            keep.append(item)
            hit.update(match)
    tests_dir = os.path.dirname(own)
    whole_suite = all(os.path.abspath(a.split("::", 1)[0]) == tests_dir for a in config.args)
    missing = [w for w in wanted if w not in hit]
    if missing and whole_suite:  # a run of one file misses the others' ids by design
        raise pytest.UsageError(f"{selected_path()} names tests that were not collected: {missing}")
    deselected = [i for i in items if i not in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = keep
