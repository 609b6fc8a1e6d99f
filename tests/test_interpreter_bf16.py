"""bf16 inputs give right answers under the Triton interpreter too.

The interpreter computes bf16 arithmetic wrongly upstream (values around 1e9); the launchers of
paged attention, varlen attention, MLA decode and prefill and the merge run
bf16 in fp32 there (``_common.interpreter_float32``) and hand back bf16, into the caller's
``out=`` / ``v_merged=`` where given. On a compiled backend these are the ordinary bf16 runs.
"""
import pytest
import torch

from helpers import DEVICE, assert_close, poison
from test_mla_decode import SHAPES, _make_case, _run_and_check
from test_mla_prefill import SHAPES as PREFILL_SHAPES
from test_mla_prefill import _make_case as _make_prefill_case
from test_mla_prefill import _run_and_check as _run_prefill_and_check
from test_paged_attention import check_lse, run_problem
from test_varlen_attention import _problem as _varlen_problem
from test_varlen_attention import run_problem as run_varlen_problem
from triton_xpu_attn import merge_state_v2
from triton_xpu_attn import reference as ref
from triton_xpu_attn._common import interpreter_float32

BF16 = torch.bfloat16


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("q_lens", [[1, 1], [4, 2]])
def test_paged_attention_bf16(num_splits, q_lens):
    pb = dict(
        dtype=BF16, batch=2, group=4, num_kv_heads=1, head_dim=64, head_dim_v=64, page_size=4, q_lens=q_lens,
        kv_lens=[37, 12], causal=True, window=(-1, -1), softcap=0.0, sinks=num_splits == 3, layout="contiguous",
        num_splits=num_splits, four_d=False, give_max_seqlen_q=True, extra_pages=0, seed=num_splits,
    )
    got, lse, out, out_ref, lse_ref = run_problem(pb)  # out= is a poisoned bf16 tensor
    assert got is out and got.dtype == BF16
    assert_close(got, out_ref, BF16)
    check_lse(lse, lse_ref, BF16)


@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("q_len", [1, 2])
def test_mla_decode_bf16(splits, q_len):
    R, Dr = SHAPES[0]
    case = _make_case(torch.Generator().manual_seed(q_len), 2, q_len, 4, R, Dr, 8, 30, BF16, None, True, False)
    got = _run_and_check(*case, BF16, splits, sm_scale=(R + Dr) ** -0.5)
    assert got[0].dtype == BF16


@pytest.mark.parametrize("num_splits", [1, 3])
def test_varlen_attention_bf16(num_splits):
    pb = _varlen_problem(dtype=BF16, sinks=num_splits == 3, num_splits=num_splits, seed=num_splits)
    got, lse, out_ref, lse_ref = run_varlen_problem(pb)  # out= is a poisoned bf16 tensor
    assert got.dtype == BF16
    assert_close(got, out_ref, BF16)
    check_lse(lse, lse_ref, BF16)


@pytest.mark.parametrize("causal", [True, False])
def test_mla_prefill_bf16(causal):
    R, Dr = PREFILL_SHAPES[0]
    case = _make_prefill_case(torch.Generator().manual_seed(int(causal)), [3, 2], [5, 2], 4, R, Dr, 4, BF16)
    got = _run_prefill_and_check(case, BF16, (R + Dr) ** -0.5, causal=causal)
    assert got[0].dtype == BF16


def test_merge_state_bf16():
    gen = torch.Generator().manual_seed(0)
    v_a, v_b = (torch.randn(5, 3, 64, generator=gen).to(BF16) for _ in range(2))
    s_a, s_b = (torch.randn(5, 3, generator=gen) for _ in range(2))
    v_merged = poison(torch.empty(5, 3, 64, dtype=BF16, device=DEVICE))
    got, _ = merge_state_v2(v_a.to(DEVICE), s_a.to(DEVICE), v_b.to(DEVICE), s_b.to(DEVICE), v_merged=v_merged)
    v_ref, _ = ref.merge_state_v2(v_a, s_a, v_b, s_b)
    assert got is v_merged
    assert_close(got, v_ref, BF16)


def test_interpreter_float32_copies_only_bf16_and_only_under_the_interpreter(monkeypatch):
    from triton_xpu_attn import device as _device

    tensors = (torch.zeros(2, dtype=BF16), torch.zeros(2, dtype=torch.float16), None, torch.zeros(2, dtype=torch.int32))
    monkeypatch.setattr(_device, "is_interpreter", lambda: True)
    got = interpreter_float32(*tensors)
    assert got[0].dtype == torch.float32 and all(g is t for g, t in zip(got[1:], tensors[1:]))
    monkeypatch.setattr(_device, "is_interpreter", lambda: False)
    assert all(g is t for g, t in zip(interpreter_float32(*tensors), tensors))  # compiled: no copy
