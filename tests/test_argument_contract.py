"""The argument contract: every op checks its scalars and tensors through the helpers
of ``triton_xpu_attn._common`` (``check_int``, ``check_real``, ``check_bool``, ``check_window``,
``check_tensor``). A hypothesis property draws one malformed argument for one op at a time and
asserts a ``TypeError``/``ValueError`` that names the argument, raised on the host before any
launch; the "Bad input" table of docs/robustness.md shows one row of each kind (``tests/test_hardening.py``)."""
from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test_hardening import (
    _LOCAL,
    _MERGE,
    _MLA,
    _MLA_PREFILL,
    _PA,
    _SWA,
    _VARLEN,
    _call,
    _local_args,
    _merge_args,
    _mla_args,
    _mla_prefill_args,
    _paged_args,
    _swa_args,
    _varlen_args,
)
from triton_xpu_attn._common import check_bool, check_int, check_real, check_window

NAN, INF = float("nan"), float("inf")

#: malformed values of each kind of argument: wrong types (bool is not a number here, a float is
#: not an int, a tensor of more than one element is not a scalar; a one-element tensor of the right
#: kind is accepted, tests/test_upstream_scalars.py) and out-of-range or non-finite values
BAD = {
    "real": [NAN, INF, -INF, "abc", None, [1.0], torch.tensor([0.5, 0.5]), torch.tensor(NAN), torch.tensor(True), True],
    "real_or_none": [NAN, INF, -INF, "abc", [1.0], torch.tensor([0.5, 0.5]), torch.tensor(1j), True],
    "real_nonneg": [NAN, INF, -1.0, None, "0", True, torch.tensor([1.0, 1.0]), torch.tensor(-1.0)],
    "bool": ["no", 1, 0, None, 1.0, torch.tensor(1), torch.tensor([True, False])],
    "window": [(1, 2, 3), None, (1.7, 0), (0, 2.0), (-2, 0), (0, -5), "ab", (0,), (None, 0), (True, 0),
               torch.tensor([1, 2, 3]), torch.tensor(3), torch.tensor([1.0, 0.0]), (torch.tensor(1.5), 0)],
    "int_nonneg": [-1, 2.5, "3", torch.tensor(3.0), torch.tensor([3, 3]), torch.tensor(-1), True, None],
    "int_or_none_nonneg": [-1, 2.5, "3", torch.tensor(3.0), torch.tensor([3, 3]), True],
    "int_positive": [0, -3, 2.5, "4", None, torch.tensor(4.0), torch.tensor(0), True],
    "int_any": [2.5, "3", torch.tensor(3.0), torch.tensor([1, 1]), True, None],  # flash_mla_decode's num_kv_splits: < 1 is automatic
    "splits_prefill": [2, 2.5, "1", True, None],
    "tensor": ["list", 3.5, "x"],
}

#: op -> (function, valid arguments, {argument: kind})
OPS = {
    "flash_attn_with_kvcache": (_PA, _paged_args, {
        "softmax_scale": "real_or_none", "softcap": "real_nonneg", "causal": "bool", "window_size": "window",
        "max_seqlen_q": "int_or_none_nonneg", "num_splits": "int_nonneg", "return_softmax_lse": "bool",
        "validate": "bool", "q": "tensor", "k_cache": "tensor", "v_cache": "tensor", "page_table": "tensor",
        "cu_seqlens_q": "tensor", "cache_seqlens": "tensor", "sinks": "tensor"}),
    "flash_attn_varlen_func": (_VARLEN, _varlen_args, {
        "softmax_scale": "real_or_none", "softcap": "real_nonneg", "causal": "bool", "window_size": "window",
        "max_seqlen_q": "int_or_none_nonneg", "max_seqlen_k": "int_or_none_nonneg", "num_splits": "int_nonneg",
        "return_softmax_lse": "bool", "validate": "bool", "q": "tensor", "k": "tensor", "v": "tensor",
        "cu_seqlens_q": "tensor", "cu_seqlens_k": "tensor", "seqused_k": "tensor", "sinks": "tensor"}),
    "flash_mla_decode": (_MLA, _mla_args, {
        "sm_scale": "real", "num_kv_splits": "int_any", "return_lse": "bool", "validate": "bool",
        "q_nope": "tensor", "kv_c_and_k_pe_cache": "tensor", "seq_lens": "tensor", "page_table": "tensor"}),
    "flash_mla_prefill": (_MLA_PREFILL, _mla_prefill_args, {
        "sm_scale": "real", "causal": "bool", "max_seqlen_q": "int_or_none_nonneg", "num_kv_splits": "splits_prefill",
        "return_lse": "bool", "validate": "bool", "q_nope": "tensor", "cu_seqlens_q": "tensor",
        "seq_lens_k": "tensor", "page_table": "tensor"}),
    "merge_state_v2": (_MERGE, _merge_args, {"v_a": "tensor", "s_a": "tensor", "v_b": "tensor", "s_b": "tensor"}),
    "make_local_attention_virtual_batches": (_LOCAL, _local_args, {
        "attn_chunk_size": "int_positive", "page_size": "int_positive", "validate": "bool", "block_table": "tensor"}),
    "prepare_swa_spec_page_table": (_SWA, _swa_args, {
        "num_draft_tokens": "int_positive", "validate": "bool", "page_table_dst": "tensor", "seq_len_a": "tensor"}),
}


def _malformed(value, valid):
    """``value`` of BAD, with "list" standing for the valid tensor as nested Python lists."""
    if isinstance(value, str) and value == "list":
        return valid.tolist() if isinstance(valid, torch.Tensor) else [0.0]
    return value


def _expect_named_error(op: str, name: str, value) -> None:
    fn, make_args, _ = OPS[op]
    args = make_args()
    args[name] = _malformed(value, args.get(name))
    with pytest.raises((TypeError, ValueError)) as info:
        _call(fn, args)
    message = str(info.value)
    # the message starts with the argument's name ("window_size[0] must be ..."): not merely any
    # error that mentions it (short names such as q appear in many messages)
    assert re.match(rf"{re.escape(name)}\b", message), f"{op}({name}={value!r}): {message!r} does not start with {name}"


_CASES = [(op, name, kind) for op, (_, _, kinds) in OPS.items() for name, kind in kinds.items()]


@settings(max_examples=max(200, settings().max_examples))
@given(case=st.sampled_from(_CASES), data=st.data())
def test_a_malformed_argument_raises_an_error_naming_it(case, data):
    """One malformed argument of one op: ``TypeError``/``ValueError`` naming it, never a Triton
    error, an ``AttributeError`` or a silent coercion (``causal="no"``, ``window_size=(1.7, 0)``)."""
    op, name, kind = case
    _expect_named_error(op, name, data.draw(st.sampled_from(BAD[kind])))


@pytest.mark.parametrize("op, name, kind", _CASES, ids=[f"{op}-{name}" for op, name, _ in _CASES])
def test_every_malformed_value_of_every_argument(op, name, kind):
    """The property above, exhaustively (each value of the argument's kind)."""
    for value in BAD[kind]:
        _expect_named_error(op, name, value)


@pytest.mark.parametrize("op", ["flash_attn_with_kvcache", "flash_attn_varlen_func", "flash_mla_prefill"])
def test_validate_checks_max_seqlen_q_and_the_first_offset(op):
    """``validate=True`` checks, for every op that takes them, that ``max_seqlen_q`` covers every
    request and ``cu_seqlens_q[0] == 0`` (docs/robustness.md's promise); without ``validate`` the call
    never syncs with the host to check them."""
    fn, make_args, _ = OPS[op]
    offsets = torch.tensor([1, 2, 3] if op != "flash_mla_prefill" else [1, 2, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[0\] must be 0, got 1"):
        _call(fn, make_args(cu_seqlens_q=offsets, validate=True))
    with pytest.raises(ValueError, match="max_seqlen_q = 1 but request 1 has"):
        _call(fn, make_args(max_seqlen_q=1, validate=True))


def test_contract_helpers():
    """The helpers themselves: numpy scalars and one-element tensors of the right kind pass, bools
    (as numbers), floats (as ints) and larger tensors do not, ranges are inclusive."""
    np = pytest.importorskip("numpy")
    assert check_int(np.int64(3), "n", minimum=3) == 3 and check_int(None, "n", allow_none=True) is None
    assert check_real(np.float32(0.5), "x") == 0.5 and check_real(0, "x", minimum=0.0) == 0.0
    assert check_bool(False, "b") is False and check_window([-1, 0]) == (-1, 0)
    assert check_int(torch.tensor(1), "n") == 1 and check_bool(np.bool_(True), "b") is True
    for call, error in [(lambda: check_int(True, "n"), TypeError), (lambda: check_real(True, "x"), TypeError),
                        (lambda: check_real(math.nan, "x"), ValueError), (lambda: check_bool(np.int64(1), "b"), TypeError),
                        (lambda: check_window((-1, -2)), ValueError), (lambda: check_int(torch.tensor(1.0), "n"), TypeError)]:
        with pytest.raises(error):
            call()
