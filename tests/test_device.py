"""Device detection helpers: CUDA occupancy arithmetic and the whole-wave split rule."""
from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import DEVICE, INTERPRET
from triton_xpu_attn import device as _device
from triton_xpu_attn._common import whole_wave_splits

# H100 and H200 (sm_90) report the same per-SM limits
SM90 = types.SimpleNamespace(
    max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472,
)


@pytest.mark.parametrize(
    "num_warps, registers, shared, expected",
    [
        (4, 168, 73728, 3),  # paged decode tile, 8/1/128 on the H200: registers and shared memory allow 3
        (4, 168, 81920, 2),  # its q_len-4 tile: 80 KiB of shared memory allow only 2
        (4, 128, 38912, 4),  # 32/8/64 decode: registers allow 4 (shared memory would allow 5)
        (4, 138, 38912, 3),  # 138 registers round up to 144 per thread (256 per warp): 3, not 3.7
        (32, 32, 0, 2),  # 1024 threads a block: the thread limit (2048 per SM)
        (32, 64, 0, 1),  # ... and at 64 registers a thread, the register file holds one
        (1, 16, 0, 32),  # tiny blocks: the 32-block limit
        (4, 255, 232448, 1),  # the most shared memory a block may opt into: one block
    ],
)
def test_cuda_programs_per_sm(num_warps, registers, shared, expected):
    assert _device.cuda_programs_per_sm(num_warps, registers, shared, SM90) == expected


@given(
    num_warps=st.sampled_from([1, 2, 4, 8, 16, 32]),
    registers=st.integers(1, 255),
    shared=st.integers(0, 232448),
    more_registers=st.integers(0, 64),
    more_shared=st.integers(0, 65536),
)
def test_cuda_programs_per_sm_never_grows_with_resources(num_warps, registers, shared, more_registers, more_shared):
    base = _device.cuda_programs_per_sm(num_warps, registers, shared, SM90)
    bigger = _device.cuda_programs_per_sm(num_warps, min(registers + more_registers, 255), shared + more_shared, SM90)
    assert 0 <= bigger <= base <= 32
    # what fits really fits: threads, registers (per-warp granule) and shared memory of `base` blocks
    assert base * num_warps * 32 <= 2048
    assert base * num_warps * (-(-registers * 32 // 256) * 256) <= 65536
    assert base * (shared + 1024) <= 233472


@pytest.mark.parametrize(
    "splits, per_split, resident, expected",
    [
        (5, 64, 264, 4),  # H200 8/1/128 B=64 q_len 4: 320 programs = 1.2 waves -> one wave of 256
        (5, 128, 528, 4),  # 640 programs of 528 -> 512
        (3, 128, 528, 3),  # 384 programs: within one wave, kept
        (10, 64, 264, 8),  # 640 programs = 2.4 waves -> two waves of 256
        (2, 300, 528, 1),  # 600 programs: one wave holds no two splits -> no split
        (7, 16, None, 7),  # unknown occupancy (XPU, interpreter): kept
        (1, 1000, 10, 1),  # no split stays no split
    ],
)
def test_whole_wave_splits_examples(splits, per_split, resident, expected):
    assert whole_wave_splits(splits, per_split, resident) == expected


@given(splits=st.integers(1, 256), per_split=st.integers(1, 4096), resident=st.integers(1, 20000))
def test_whole_wave_splits_fills_whole_waves(splits, per_split, resident):
    cut = whole_wave_splits(splits, per_split, resident)
    assert 1 <= cut <= splits
    programs = splits * per_split
    if programs <= resident:
        assert cut == splits  # one wave or less: nothing to gain
    else:
        waves = programs // resident
        # no partial wave beyond the whole ones (a launch without splits has nothing to cut)
        assert cut == 1 or cut * per_split <= waves * resident
        assert cut == 1 or (cut + 1) * per_split > waves * resident  # and the most splits that allows


def test_resident_programs_unknown_off_cuda():
    """Under the interpreter (and on XPU) nothing is compiled to answer: None, thunk not called."""
    if _device.backend() == "cuda":
        pytest.skip("CUDA answers; covered by the GPU test")

    def compile_kernel():
        raise AssertionError("must not compile where occupancy is unknown")

    assert _device.resident_programs(compile_kernel, DEVICE) is None


def test_cuda_fp8_follows_the_compute_capability(monkeypatch):
    """fp8 e4m3 arithmetic only on NVIDIA sm_89+: never under the interpreter or on XPU."""
    if _device.backend() == "cuda":
        props = torch.cuda.get_device_properties(DEVICE)
        assert _device.cuda_fp8(DEVICE) == ((props.major, props.minor) >= (8, 9))
        return
    assert not _device.cuda_fp8(DEVICE)
    monkeypatch.setattr(_device, "backend", lambda: "cuda")
    for major, minor, expected in ((8, 0, False), (8, 9, True), (9, 0, True)):
        monkeypatch.setattr(_device, "_properties", lambda kind, index, m=(major, minor): types.SimpleNamespace(
            major=m[0], minor=m[1]))
        assert _device.cuda_fp8(0) is expected


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="compiled kernels only")
def test_resident_programs_of_a_compiled_paged_kernel():
    """On CUDA, the automatic split of a paged-attention call records the split kernel's
    occupancy, once: a positive multiple of the SM count (the per-SM arithmetic is tested above)."""
    if _device.backend() != "cuda":
        pytest.skip("occupancy is known on CUDA only")
    import triton_xpu_attn as ops
    from triton_xpu_attn.ops import paged_launch as pa

    pa._RESIDENT_PROGRAMS.clear()
    B, Hq, Hkv, D, P, L = 2, 8, 1, 128, 16, 2048
    k = torch.randn(B * L // P, P, Hkv, D, device=DEVICE, dtype=torch.bfloat16)
    table = torch.arange(B * L // P, device=DEVICE, dtype=torch.int32).view(B, L // P)
    q = torch.randn(B, 1, Hq, D, device=DEVICE, dtype=torch.bfloat16)
    ops.flash_attn_with_kvcache(q, k, k, cache_seqlens=L, page_table=table)
    values = list(pa._RESIDENT_PROGRAMS.values())
    assert len(values) == 1
    sms = _device.compute_units(DEVICE)
    assert values[0] is not None and values[0] > 0 and values[0] % sms == 0
