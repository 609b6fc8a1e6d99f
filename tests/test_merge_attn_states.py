"""``merge_attn_states`` (vLLM's chunked-prefill / cascade merge: LSEs heads first, in place) and
vllm-xpu-kernels' ``torch.ops._C.merge_attn_states`` over it, against the float64 reference:
+inf LSEs (vLLM's empty state) in either input, the suffix-only tail past
``prefill_tokens_with_context``, no ``output_lse``, fp8 outputs with ``output_scale``, strided
LSEs; outputs poisoned first."""
from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import DEVICE, FLOAT_DTYPES, assert_close
from triton_xpu_attn import merge_attn_states
from triton_xpu_attn import reference as ref

FP8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


def _inputs(gen, t, h, d, dtype, inf_fraction=0.1, strided=False):
    p_lse = torch.randn(h, t, generator=gen)
    s_lse = torch.randn(h, t, generator=gen)
    mask_p = torch.rand(h, t, generator=gen) < inf_fraction
    mask_s = (torch.rand(h, t, generator=gen) < inf_fraction) & ~mask_p
    p_lse[mask_p] = float("inf")
    s_lse[mask_s] = float("inf")
    p_out = torch.randn(t, h, d, generator=gen).to(dtype)
    s_out = torch.randn(t, h, d, generator=gen).to(dtype)
    p_out[mask_p.T] = float("nan")  # an empty state's output is never read
    if strided:  # [H, T] views of [T, H] buffers (the layout's other common source)
        p_lse, s_lse = p_lse.T.contiguous().T, s_lse.T.contiguous().T
    return p_out, p_lse, s_out, s_lse


@given(t=st.integers(0, 9), h=st.sampled_from([1, 3, 4]), d=st.sampled_from([8, 32, 48]),
       dtype=st.sampled_from(FLOAT_DTYPES), tail=st.one_of(st.none(), st.integers(0, 9)),
       with_lse=st.booleans(), strided=st.booleans(), seed=st.integers(0, 2**16))
def test_matches_reference(t, h, d, dtype, tail, with_lse, strided, seed):
    gen = torch.Generator().manual_seed(seed)
    tail = None if tail is None else min(tail, t)
    p_out, p_lse, s_out, s_lse = _inputs(gen, t, h, d, dtype, strided=strided)
    out = torch.full((t, h, d), float("nan"), dtype=dtype, device=DEVICE)
    out_lse = torch.full((h, t), float("nan"), device=DEVICE) if with_lse else None
    merge_attn_states(out, p_out.to(DEVICE), p_lse.to(DEVICE), s_out.to(DEVICE), s_lse.to(DEVICE), out_lse,
                      prefill_tokens_with_context=tail)
    exp_out, exp_lse = ref.merge_attn_states(p_out, p_lse, s_out, s_lse, tail)
    if t and h:
        assert_close(out.cpu(), exp_out, dtype)
        if with_lse:
            got = out_lse.cpu().double()
            assert torch.equal(torch.isfinite(got), torch.isfinite(exp_lse))
            fin = torch.isfinite(exp_lse)
            assert torch.allclose(got[fin], exp_lse[fin], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("out_dtype", FP8)
def test_fp8_output_with_scale(out_dtype):
    gen = torch.Generator().manual_seed(2)
    p_out, p_lse, s_out, s_lse = _inputs(gen, 6, 2, 16, torch.bfloat16)
    p_out, s_out = p_out * 40, s_out * 40  # some values past the fp8 range after the scale: saturate
    scale = torch.tensor([0.05], device=DEVICE)
    out = torch.zeros(6, 2, 16, dtype=out_dtype, device=DEVICE)
    merge_attn_states(out, p_out.to(DEVICE), p_lse.to(DEVICE), s_out.to(DEVICE), s_lse.to(DEVICE), None,
                      prefill_tokens_with_context=4, output_scale=scale)
    exp, _ = ref.merge_attn_states(p_out, p_lse, s_out, s_lse, 4)
    top = torch.finfo(out_dtype).max
    want = (exp / 0.05).clamp(-top, top).to(out_dtype).double()
    got = out.cpu().double()
    assert torch.isfinite(got).all()
    assert torch.allclose(got, want, rtol=0.13, atol=1e-2)  # one fp8 step (e5m2: 2 mantissa bits)


def test_both_states_empty_give_zero_and_minus_inf():
    h, t, d = 2, 3, 8
    lse = torch.full((h, t), float("inf"), device=DEVICE)
    nan = torch.full((t, h, d), float("nan"), device=DEVICE)
    out = torch.full((t, h, d), 7.0, device=DEVICE)
    out_lse = torch.zeros(h, t, device=DEVICE)
    merge_attn_states(out, nan, lse, nan, -lse, out_lse)
    assert torch.all(out == 0) and torch.all(out_lse == float("-inf"))


@pytest.mark.parametrize("change, error, match", [
    (dict(prefill_tokens_with_context=9), ValueError, "prefill_tokens_with_context"),
    (dict(prefill_tokens_with_context=-1), ValueError, "prefill_tokens_with_context"),
    (dict(prefix_lse=torch.zeros(3, 2)), ValueError, "prefix_lse"),
    (dict(output=torch.zeros(4, 2, 8, dtype=torch.float16)), TypeError, "output"),
    (dict(output_lse=torch.zeros(2, 4, dtype=torch.float16)), TypeError, "output_lse"),
    (dict(output_scale=torch.ones(2)), ValueError, "output_scale"),
    (dict(suffix_output=torch.zeros(4, 2, 4)), ValueError, "suffix_output"),
])
def test_bad_input_names_the_argument(change, error, match):
    args = dict(output=torch.zeros(4, 2, 8), prefix_output=torch.zeros(4, 2, 8), prefix_lse=torch.zeros(2, 4),
                suffix_output=torch.zeros(4, 2, 8), suffix_lse=torch.zeros(2, 4), output_lse=None)
    args.update(change)
    args = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    with pytest.raises(error, match=match):
        merge_attn_states(**args)


def test_vllm_c_op_and_package_custom_op():
    importlib.import_module("triton_xpu_attn.compat.vllm_xpu_kernels._C")
    gen = torch.Generator().manual_seed(4)
    p_out, p_lse, s_out, s_lse = (x.to(DEVICE) for x in _inputs(gen, 5, 2, 16, torch.float32))
    outs = []
    for call in (lambda o, l: torch.ops._C.merge_attn_states(o, l, p_out, p_lse, s_out, s_lse, 3, None),
                 lambda o, l: torch.ops.triton_xpu_attn.merge_attn_states(o, p_out, p_lse, s_out, s_lse, l, 3, None)):
        out, lse = torch.full_like(p_out, float("nan")), torch.full_like(p_lse, float("nan"))
        call(out, lse)
        outs.append((out.cpu(), lse.cpu()))
    exp_out, _ = ref.merge_attn_states(p_out.cpu(), p_lse.cpu(), s_out.cpu(), s_lse.cpu(), 3)
    for out, lse in outs:
        assert_close(out, exp_out, torch.float32)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
