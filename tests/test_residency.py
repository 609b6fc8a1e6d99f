"""The residency guard, on an NVIDIA GPU: every decode and draft case of the paged benchmark's grid,
and every prefill tile (head dims 64-512, pages 1/16/64, with and without a window), keeps as many
programs per SM as the committed records (bench/results/<device>/{decode,prefill}_residency.json)
say, with no more spills. A kernel change that grows registers across an occupancy step fails
here, naming the case, before anyone times it."""
import pytest

from triton_xpu_attn import device as _device


@pytest.mark.skipif(_device.backend() != "cuda", reason="reads compiled CUDA kernels")
@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_residency_not_worse_than_record(kind):
    from bench import residency

    what, worse = residency.check(kind)
    if what.startswith("no record") or " is for Triton " in what:
        pytest.skip(what)
    assert not worse, "\n".join([what] + worse)


def test_compare_names_a_case_that_lost_a_program():
    from bench import residency

    old = {"x": [dict(kernel="k", regs=128, spills=0, shared=38912, warps=4, resident=4)]}
    new = {"x": [dict(kernel="k", regs=164, spills=0, shared=38912, warps=4, resident=3)]}
    assert residency.compare(old, new) == ["x k: 128 -> 164 registers, 0 -> 0 spills, 38912 -> 38912 B shared, "
                                           "4 -> 3 programs per SM"]
    assert residency.compare(old, old) == []


def test_resident_programs_of_the_regressed_tile():
    """The 32/8/128 P = 16 decode tile (4 warps, 38 KB shared): 128 registers hold 4 programs an
    SM, 164 hold 3 (the regression's cause); shared memory and the warp limit bound the rest."""
    from bench.residency import H100_SM as H100, resident_programs

    assert resident_programs(128, 38912, 4, H100) == 4
    assert resident_programs(164, 38912, 4, H100) == 3
    assert resident_programs(64, 114744, 4, H100) == 2  # shared memory bound
    assert resident_programs(32, 0, 8, H100) == 8  # 64 warps an SM
