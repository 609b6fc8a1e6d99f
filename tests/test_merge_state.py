import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import DEVICE, FLOAT_DTYPES, assert_close, poison
from triton_xpu_attn import merge_state, merge_state_v2
from triton_xpu_attn import reference as ref
from triton_xpu_attn.ops.merge_state import combine_splits


def test_reference_hand_example():
    # equal LSEs average the values; the merged LSE is log(2 e^0) = log 2
    v, s = ref.merge_state_v2(torch.tensor([[[1.0, 3.0]]]), torch.tensor([[0.0]]), torch.tensor([[[3.0, 5.0]]]), torch.tensor([[0.0]]))
    assert v.tolist() == [[[2.0, 4.0]]] and s.item() == pytest.approx(math.log(2))
    # an empty state (LSE -inf or +inf or NaN) contributes nothing, whatever its value holds
    for empty in (-math.inf, math.inf, math.nan):
        for value in (1.0, math.nan, math.inf):
            v, s = ref.merge_state_v2(torch.tensor([[[value]]]), torch.tensor([[empty]]), torch.tensor([[[7.0]]]),
                                      torch.tensor([[1.5]]))
            assert v.item() == 7.0 and s.item() == 1.5
    v, s = ref.merge_state_v2(torch.tensor([[[1.0]]]), torch.tensor([[-math.inf]]), torch.tensor([[[7.0]]]), torch.tensor([[-math.inf]]))
    assert v.item() == 0.0 and s.item() == -math.inf
    # merge_state (v1) is base 2: LSEs 0 and 1 weigh 1 : 2, and the merged LSE is log2(1 + 2)
    v, s = ref.merge_state(torch.tensor([[[3.0]]]), torch.tensor([[0.0]]), torch.tensor([[[6.0]]]), torch.tensor([[1.0]]))
    assert v.item() == pytest.approx(5.0) and s.item() == pytest.approx(math.log2(3))


@given(
    n=st.integers(0, 5), h=st.integers(1, 4), dv=st.sampled_from([8, 64, 80]), dtype=st.sampled_from(FLOAT_DTYPES),
    seed=st.integers(0, 2**16), transposed_lse=st.booleans(), empties=st.booleans(), base2=st.booleans(),
)
def test_merge_state_matches_reference(n, h, dv, dtype, seed, transposed_lse, empties, base2):
    """merge_state_v2 (natural-log LSEs) and merge_state (v1, base 2: sgl-kernel's FlashInfer
    cascade merge) against the float64 references."""
    op, reference = (merge_state, ref.merge_state) if base2 else (merge_state_v2, ref.merge_state_v2)
    gen = torch.Generator().manual_seed(seed)
    v_a, v_b = (torch.randn(n, h, dv, generator=gen).to(dtype) for _ in range(2))
    s_a, s_b = (torch.randn(n, h, generator=gen) * 3 for _ in range(2))
    if empties and n:
        s_a[0] = -math.inf
        s_b[0, 0] = -math.inf
        s_b[-1] = math.inf
        # an empty state is ignored whatever its value holds (a freed buffer may hold NaN / inf)
        v_a[0] = math.nan
        v_b[0, 0] = math.inf
        v_b[-1] = math.nan
    if transposed_lse:  # sglang passes lse.T of an [H, N] tensor
        s_a, s_b = s_a.T.contiguous().T, s_b.T.contiguous().T
    v_ref, s_ref = reference(v_a, s_a, v_b, s_b)
    v_out = poison(torch.empty(n, h, dv, dtype=dtype, device=DEVICE))
    s_out = poison(torch.empty(n, h, device=DEVICE))
    v, s = op(v_a.to(DEVICE), s_a.to(DEVICE), v_b.to(DEVICE), s_b.to(DEVICE), v_out, s_out)
    assert v is v_out and s is s_out
    assert not torch.isnan(v).any() and not torch.isnan(s).any()
    if n:
        assert_close(v, v_ref, dtype)
        finite = torch.isfinite(s_ref)
        assert torch.equal(torch.isfinite(s.cpu()), finite)
        assert torch.allclose(s.cpu().double()[finite], s_ref[finite], rtol=1e-5, atol=1e-5)


@given(n=st.integers(1, 3), h=st.integers(1, 3), splits=st.integers(1, 6), seed=st.integers(0, 2**16), sinks=st.booleans())
def test_combine_splits_equals_repeated_merges(n, h, splits, seed, sinks):
    gen = torch.Generator().manual_seed(seed)
    dv = 16
    po = torch.randn(n, h, splits, dv, generator=gen)
    pl = torch.randn(n, h, splits, generator=gen)
    pl[..., -1] = -math.inf  # an empty split
    sink = torch.randn(h, generator=gen) if sinks else None
    # reference: fold the merge rule over splits; a sink is one more state with value 0
    v, s = torch.zeros(n, h, dv, dtype=torch.float64), torch.full((n, h), -math.inf, dtype=torch.float64)
    for i in range(splits):
        v, s = ref.merge_state_v2(v, s, po[:, :, i], pl[:, :, i])
    if sink is not None:
        has_key = torch.isfinite(s)
        v2, s2 = ref.merge_state_v2(v, s, torch.zeros_like(v), sink.double()[None].expand(n, h))
        v = torch.where(has_key[..., None], v2, v)
        s = torch.where(has_key, s2, s)
    out = poison(torch.empty(n, h, dv, device=DEVICE))
    lse = poison(torch.empty(h, n, device=DEVICE))
    combine_splits(po.to(DEVICE), pl.to(DEVICE), out, lse.T, None if sink is None else sink.to(DEVICE))
    assert_close(out, v, torch.float32)
    finite = torch.isfinite(s)
    assert torch.equal(torch.isfinite(lse.T.cpu()), finite)
    assert torch.allclose(lse.T.cpu().double()[finite], s[finite], rtol=1e-5, atol=1e-5)


def test_merge_state_v2_rejects_bad_input():
    v = torch.zeros(2, 2, 8, device=DEVICE)
    s = torch.zeros(2, 2, device=DEVICE)
    with pytest.raises(TypeError, match="v_b"):
        merge_state_v2(v, s, v.half(), s)
    with pytest.raises(ValueError, match="s_b"):
        merge_state_v2(v, s, v, torch.zeros(2, 3, device=DEVICE))
    with pytest.raises(ValueError, match="v_a"):
        merge_state_v2(torch.zeros(2, 8, device=DEVICE), s, v, s)
    with pytest.raises(ValueError, match="v_merged"):
        merge_state_v2(v, s, v, s, v_merged=torch.zeros(2, 2, 4, device=DEVICE))


def test_combine_tiling_spreads_a_tile_over_warps_on_xpu(monkeypatch):
    """The split combine runs one warp a program on CUDA (latency-bound) and a warp per 512 floats
    of its tile on XPU: one sub-group holding 64 x 64 floats spills there (native code,
    bench/results/xpu_codegen.md)."""
    from triton_xpu_attn import device as _device
    from triton_xpu_attn.ops.merge_state import combine_tiling

    for backend, warps in (("cuda", 1), ("xpu", 8)):
        monkeypatch.setattr(_device, "backend", lambda b=backend: b)
        block_dv, split_block, num_warps = combine_tiling(rows=16, num_splits=64, head_dim_v=64, compute_units=64)
        assert (block_dv, split_block, num_warps) == (64, 64, warps)
    assert combine_tiling(rows=16, num_splits=4, head_dim_v=64, compute_units=64)[2] == 1  # 256 floats: one warp


def test_merge_state_v1_is_the_base2_merge():
    """sgl-kernel's merge_state test compares with FlashInfer's Triton cascade merge (exp2 / log2):
    the same numbers from the formula written out, and v1 equals v2 on LSEs times ln 2."""
    gen = torch.Generator().manual_seed(3)
    v_a, v_b = (torch.randn(7, 4, 64, generator=gen).half() for _ in range(2))
    s_a, s_b = (torch.randn(7, 4, generator=gen) * 4 for _ in range(2))
    m = torch.maximum(s_a, s_b)
    w_a, w_b = torch.exp2(s_a - m), torch.exp2(s_b - m)
    v_expected = (v_a.float() * w_a[..., None] + v_b.float() * w_b[..., None]) / (w_a + w_b)[..., None]
    s_expected = m + torch.log2(w_a + w_b)
    v, s = merge_state(v_a.to(DEVICE), s_a.to(DEVICE), v_b.to(DEVICE), s_b.to(DEVICE))
    assert v.dtype == torch.float16 and s.dtype == torch.float32
    assert torch.allclose(v.float().cpu(), v_expected, atol=1e-2) and torch.allclose(s.cpu(), s_expected, atol=1e-4)
    v2, s2 = merge_state_v2(v_a.to(DEVICE), (s_a * math.log(2)).to(DEVICE), v_b.to(DEVICE), (s_b * math.log(2)).to(DEVICE))
    assert torch.allclose(v.float(), v2.float(), atol=1e-3) and torch.allclose(s * math.log(2), s2, atol=1e-5)


def test_programmatic_launch_only_on_cuda_sm90():
    """The combine starts early (programmatic dependent launch) only where CUDA has it: compute
    capability >= 9 and a Triton with grid dependency control; never on XPU or the interpreter,
    whose kernels would not compile the wait."""
    from triton_xpu_attn import device as _device

    if DEVICE.type != "cuda":
        assert not _device.programmatic_launch(DEVICE)
    else:
        sm90 = torch.cuda.get_device_capability(DEVICE)[0] >= 9
        assert _device.programmatic_launch(DEVICE) == (sm90 and _device._grid_dependency_control())


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
def test_split_combine_launched_early_waits_for_the_partials(graph, monkeypatch):
    """With programmatic launch the combine is resident while the attention kernel still writes
    the partials. Each call here leaves the previous call's partials in the buffer, from another
    query. A combine that read before its wait would merge those stale values. Outputs must be
    bitwise those of the ordinary launch, eager and replayed from a CUDA graph after new queries
    are written into the captured input."""
    import triton_xpu_attn as ours
    from triton_xpu_attn import device as _device

    if not _device.programmatic_launch(DEVICE):
        pytest.skip("no programmatic dependent launch on this device")
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    # a main kernel of ~100 us, longer than the host's gap between the two launches: eager calls
    # start the combine early too (at 16k keys, 4 requests only the graph replays did)
    B, Hq, Hkv, D, P, L = 8, 8, 2, 128, 16, 32768
    pages = torch.randperm(B * L // P, device=DEVICE, generator=gen).view(B, L // P).to(torch.int32)
    k = torch.randn(B * L // P, P, Hkv, D, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    lens = torch.full((B,), L, device=DEVICE, dtype=torch.int32)
    queries = [torch.randn(B, 1, Hq, D, device=DEVICE, dtype=torch.bfloat16, generator=gen) for _ in range(3)]
    q = queries[0].clone()

    def call():
        return ours.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, page_table=pages, num_splits=32,
                                           return_softmax_lse=True)

    def ordinary(query):
        with monkeypatch.context() as m:
            m.setattr(_device, "programmatic_launch", lambda device=None: False)
            return ours.flash_attn_with_kvcache(query, k, v, cache_seqlens=lens, page_table=pages, num_splits=32,
                                               return_softmax_lse=True)

    expected = [tuple(t.clone() for t in ordinary(query)) for query in queries]
    if graph:
        api = torch.cuda
        stream = api.Stream()
        stream.wait_stream(api.current_stream())
        with api.stream(stream):
            call()
        api.current_stream().wait_stream(stream)
        g = api.CUDAGraph()
        with api.graph(g):
            captured = call()
    for _ in range(2):
        for query, (out_ref, lse_ref) in zip(queries, expected):
            q.copy_(query)
            if graph:
                g.replay()
                out, lse = captured
            else:
                out, lse = call()
            torch.cuda.synchronize(DEVICE)
            assert torch.equal(out, out_ref) and torch.equal(lse, lse_ref)
