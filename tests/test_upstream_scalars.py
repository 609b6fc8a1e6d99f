"""Scalar arguments in the forms upstream's wrappers hand on to their ops (the argument contract,
``triton_xpu_attn._common``): Intel's tests build ``window_size = torch.randint(0, seqlen_k, (2,))``
and sgl-kernel-xpu's ``flash_attn.py`` passes ``window_size[0]``, ``window_size[1]`` (0-dim
tensors) on to its op, which takes them, as it takes numpy scalars and one-element tensors for
every int / float argument. Each form must give bitwise the result of the same call with Python
numbers, through the package root and the ``sgl_kernel`` / ``vllm_xpu_kernels`` compat entry
points; bools, floats where an int is meant, larger tensors and non-finite values still raise,
naming the argument."""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import triton_xpu_attn
from conftest import DEVICE, INTERPRET

sgl_kernel = importlib.import_module("triton_xpu_attn.compat.sgl_kernel")
sgl_flash_attn = importlib.import_module("triton_xpu_attn.compat.sgl_kernel.flash_attn")
vllm_flash_attn = importlib.import_module("triton_xpu_attn.compat.vllm_xpu_kernels.flash_attn_interface")

SEQLEN_K = 10  # the longest request: windows are drawn below it, as Intel's tests do
#: Intel's window: a 1-D int64 tensor of two entries on the CPU
WINDOW = torch.randint(0, SEQLEN_K, (2,), generator=torch.Generator().manual_seed(7))
LEFT, RIGHT = WINDOW.tolist()
MLA_R, MLA_DR = (32, 16) if INTERPRET else (512, 64)


def _inputs():
    """Two requests (2 and 3 queries over 7 and 10 keys), 2 query heads on 1 KV head, D = 32: a
    paged cache (page size 4) and the same keys as contiguous rows."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(5, 2, 32, generator=g)
    k_cache, v_cache = (torch.randn(6, 4, 1, 32, generator=g) for _ in range(2))
    page_table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    lens = torch.tensor([7, SEQLEN_K], dtype=torch.int32)
    rows = [cache[page_table[b]].flatten(0, 1)[: lens[b]] for cache in (k_cache, v_cache) for b in range(2)]
    t = dict(q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table, lens=lens,
             cu_q=torch.tensor([0, 2, 5], dtype=torch.int32), cu_k=torch.tensor([0, 7, 17], dtype=torch.int32),
             k=torch.cat(rows[:2]), v=torch.cat(rows[2:]))
    return {name: x.to(DEVICE) for name, x in t.items()}


T = _inputs()
#: the scalars of a call, as Python numbers (each case below replaces one of them)
BASE = dict(window_size=(-1, -1), softmax_scale=0.25, softcap=0.0, num_splits=0, max_seqlen_q=3,
            max_seqlen_k=SEQLEN_K, causal=False)


def _call(path: str, s: dict):
    """One attention call through ``path`` with the scalars ``s`` (BASE's names)."""
    common = dict(softmax_scale=s["softmax_scale"], causal=s["causal"], window_size=s["window_size"],
                  softcap=s["softcap"])
    # the package root and sgl_kernel.flash_attn share a signature: one call each, by module
    module = {"root": triton_xpu_attn, "sgl": sgl_flash_attn}.get(path.split("-")[0])
    if module is not None and path.endswith("-paged"):
        return module.flash_attn_with_kvcache(
            T["q"], T["k_cache"], T["v_cache"], cache_seqlens=T["lens"], page_table=T["page_table"],
            cu_seqlens_q=T["cu_q"], max_seqlen_q=s["max_seqlen_q"], max_seqlen_k=s["max_seqlen_k"],
            num_splits=s["num_splits"], **common)
    if module is not None:
        return module.flash_attn_varlen_func(
            T["q"], T["k"], T["v"], T["cu_q"], T["cu_k"], s["max_seqlen_q"], s["max_seqlen_k"],
            num_splits=s["num_splits"], **common)
    if path == "vllm-paged":
        return vllm_flash_attn.flash_attn_varlen_func(
            T["q"], T["k_cache"], T["v_cache"], s["max_seqlen_q"], T["cu_q"], s["max_seqlen_k"], seqused_k=T["lens"],
            block_table=T["page_table"], num_splits_kv=s["num_splits"], **common)
    assert path == "vllm-varlen"
    return vllm_flash_attn.flash_attn_varlen_func(
        T["q"], T["k"], T["v"], s["max_seqlen_q"], T["cu_q"], s["max_seqlen_k"], cu_seqlens_k=T["cu_k"],
        num_splits_kv=s["num_splits"], **common)


PATHS = ["root-paged", "root-varlen", "sgl-paged", "sgl-varlen", "vllm-paged", "vllm-varlen"]

#: (argument, id, the upstream form, the Python value it stands for)
FORMS = [
    ("window_size", "randint-pair", WINDOW, (LEFT, RIGHT)),
    ("window_size", "randint-pair-on-device", WINDOW.to(DEVICE), (LEFT, RIGHT)),
    ("window_size", "int32-pair", WINDOW.to(torch.int32), (LEFT, RIGHT)),
    ("window_size", "0-dim-entries", (WINDOW[0], WINDOW[1]), (LEFT, RIGHT)),  # what sgl-kernel-xpu's wrapper passes on
    ("window_size", "one-element-entries", [WINDOW[:1].to(DEVICE), WINDOW[1:]], (LEFT, RIGHT)),
    ("window_size", "numpy-entries", (np.int64(LEFT), np.int32(RIGHT)), (LEFT, RIGHT)),
    ("window_size", "numpy-array", WINDOW.numpy(), (LEFT, RIGHT)),
    ("window_size", "0-dim-unbounded", (torch.tensor(-1), torch.tensor(0)), (-1, 0)),
    ("softmax_scale", "0-dim-float32", torch.tensor(0.125), 0.125),
    ("softmax_scale", "one-element-fp16-on-device", torch.tensor([0.125], dtype=torch.float16, device=DEVICE), 0.125),
    ("softmax_scale", "0-dim-int", torch.tensor(1), 1.0),
    ("softmax_scale", "numpy-float32", np.float32(0.125), 0.125),
    ("softcap", "0-dim-float32", torch.tensor(2.0), 2.0),
    ("softcap", "0-dim-int", torch.tensor(2), 2.0),
    ("softcap", "numpy-float32", np.float32(2.0), 2.0),
    ("num_splits", "0-dim-int", torch.tensor(2), 2),
    ("num_splits", "numpy-int64", np.int64(2), 2),
    ("max_seqlen_q", "0-dim-int", torch.tensor(3), 3),
    ("max_seqlen_q", "one-element-int32-on-device", torch.tensor([3], dtype=torch.int32, device=DEVICE), 3),
    ("max_seqlen_q", "numpy-int64", np.int64(3), 3),
    ("max_seqlen_k", "0-dim-int", torch.tensor(SEQLEN_K), SEQLEN_K),
    ("max_seqlen_k", "numpy-int32", np.int32(SEQLEN_K), SEQLEN_K),
    ("causal", "0-dim-bool", torch.tensor(True), True),
    ("causal", "numpy-bool", np.bool_(True), True),
]

_expected: dict = {}


def _expected_result(path: str, name: str, value):
    """The call with Python numbers only (cached: several forms stand for one value)."""
    key = (path, name, value)
    if key not in _expected:
        _expected[key] = _call(path, dict(BASE, **{name: value}))
    return _expected[key]


def test_intel_window_masks_keys():
    """The window drawn as Intel's tests draw it changes the result (else a window read as
    unbounded would pass the comparisons below), on both kernels' layouts."""
    assert WINDOW.dtype == torch.int64 and WINDOW.shape == (2,)
    for path in ("root-paged", "root-varlen"):
        windowed = _expected_result(path, "window_size", (LEFT, RIGHT))
        assert not torch.equal(windowed, _expected_result(path, "window_size", (-1, -1))), path


#: every form through every path, but max_seqlen_k only where it is read (the paged calls take it
#: as an unused hint)
_FORM_CASES = [pytest.param(path, name, form, value, id=f"{name}-{form_id}-{path}") for name, form_id, form, value in FORMS
               for path in PATHS if name != "max_seqlen_k" or path.endswith("varlen")]


@pytest.mark.parametrize("path, name, form, value", _FORM_CASES)
def test_upstream_scalar_forms_equal_python_numbers(path, name, form, value):
    out = _call(path, dict(BASE, **{name: form}))
    assert torch.equal(out, _expected_result(path, name, value)), f"{path}: {name}={form!r}"


def _mla_inputs():
    g = torch.Generator().manual_seed(1)
    t = dict(q_nope=torch.randn(2, 2, MLA_R, generator=g), q_pe=torch.randn(2, 2, MLA_DR, generator=g),
             cache=torch.randn(6, 4, MLA_R + MLA_DR, generator=g), lens=torch.tensor([5, 11], dtype=torch.int32),
             page_table=torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32),
             cu_q=torch.tensor([0, 1, 2], dtype=torch.int32))
    return {name: x.to(DEVICE) for name, x in t.items()}


def test_sgl_mla_decode_scalar_forms():
    """sgl-kernel-xpu's ``flash_mla_get_workspace_size`` / ``flash_mla_decode``: 0-dim tensors and
    numpy scalars for the sizes, ``sm_scale`` and ``num_kv_splits``."""
    t = _mla_inputs()
    size = sgl_kernel.flash_mla_get_workspace_size(12, 2, 2, 4, 2, head_dim_v=MLA_R, device=DEVICE)
    tensor_size = sgl_kernel.flash_mla_get_workspace_size(
        torch.tensor(12), torch.tensor(2), np.int64(2), torch.tensor(4, dtype=torch.int32), torch.tensor(2),
        head_dim_v=torch.tensor(MLA_R), device=DEVICE)
    assert size > 0 and type(tensor_size) is int and tensor_size == size

    def decode(sm_scale, splits):
        workspace = torch.zeros(size, dtype=torch.uint8, device=DEVICE)
        return sgl_kernel.flash_mla_decode(t["q_nope"], t["q_pe"], t["cache"], t["lens"], t["page_table"], workspace,
                                           sm_scale, splits)

    expected = decode(0.125, 2)
    for sm_scale, splits in [(torch.tensor(0.125), torch.tensor(2)), (np.float32(0.125), np.int64(2)),
                             (torch.tensor([0.125], device=DEVICE), torch.tensor([2], dtype=torch.int32))]:
        assert torch.equal(decode(sm_scale, splits), expected), (sm_scale, splits)


def test_sgl_mla_prefill_scalar_forms():
    """sgl-kernel-xpu's ``flash_mla_prefill``: ``max_seqlen_q``, ``sm_scale``, ``causal`` and
    ``num_kv_splits`` as tensors and numpy scalars."""
    t = _mla_inputs()
    q_nope, q_pe = t["q_nope"].repeat(2, 1, 1), t["q_pe"].repeat(2, 1, 1)  # 2 queries per request
    cu_q = torch.tensor([0, 2, 4], dtype=torch.int32, device=DEVICE)
    assert sgl_kernel.flash_mla_prefill_get_workspace_size(torch.tensor(12), np.int64(2), torch.tensor(2)) == 0

    def prefill(max_q, sm_scale, causal, splits):
        return sgl_kernel.flash_mla_prefill(q_nope, q_pe, t["cache"], cu_q, t["lens"], max_q, t["page_table"], None,
                                            sm_scale, causal, splits)

    expected = prefill(2, 0.125, True, -1)
    for form in [(torch.tensor(2), torch.tensor(0.125), torch.tensor(True), torch.tensor(-1)),
                 (np.int64(2), np.float32(0.125), np.bool_(True), np.int64(1))]:
        assert torch.equal(prefill(*form), expected), form


def test_vllm_mla_latent_scalar_forms():
    """vllm-xpu-kernels' MLA call (latent cache) with a tensor ``max_seqlen_q``, ``softmax_scale``
    and windows as tensor pairs (unbounded, and a bounded one)."""
    t = _mla_inputs()
    cache = t["cache"][:, :, None]
    q = torch.cat([t["q_nope"], t["q_pe"]], dim=-1)

    def call(max_q, scale, window):
        return vllm_flash_attn.flash_attn_varlen_func(q, cache, cache[..., :MLA_R], max_q, t["cu_q"], 11,
                                                      seqused_k=t["lens"], block_table=t["page_table"],
                                                      softmax_scale=scale, window_size=window)

    expected = call(1, 0.125, None)
    assert torch.equal(call(torch.tensor(1), torch.tensor(0.125), torch.tensor([-1, -1])), expected)
    assert torch.equal(call(np.int64(1), np.float32(0.125), (torch.tensor(-1), torch.tensor(-1))), expected)
    # a window keeps the latent layout on the paged kernel (the MLA kernels have none): a tensor
    # pair gives the result of the same window as ints, over a copy of V
    windowed = call(1, 0.125, WINDOW)
    copy = vllm_flash_attn.flash_attn_varlen_func(q, cache, cache[..., :MLA_R].clone(), 1, t["cu_q"], 11,
                                                  seqused_k=t["lens"], block_table=t["page_table"],
                                                  softmax_scale=0.125, window_size=(LEFT, RIGHT))
    torch.testing.assert_close(windowed, copy, rtol=1e-5, atol=1e-5)  # V read through other strides


#: (argument, a form that is still refused, exception, the message's start)
REFUSED = [
    ("window_size", torch.tensor([1, 2, 3]), ValueError, "window_size must be a (left, right) pair of ints"),
    ("window_size", torch.tensor([[1, 2]]), ValueError, "window_size must be a (left, right) pair of ints"),
    ("window_size", torch.tensor(3), ValueError, "window_size must be a (left, right) pair of ints"),
    ("window_size", torch.tensor([1.0, 2.0]), TypeError, "window_size[0] must be an int, got Tensor of dtype float32"),
    ("window_size", torch.tensor([True, False]), TypeError, "window_size[0] must be an int, got Tensor of dtype bool"),
    ("window_size", (torch.tensor([1, 2]), 0), ValueError, "window_size[0] must be a scalar or a one-element tensor"),
    ("window_size", (torch.tensor(1), torch.tensor(2.5)), TypeError, "window_size[1] must be an int"),
    ("window_size", (torch.tensor(-2), 0), ValueError, "window_size[0] must be >= -1, got -2"),
    ("window_size", (np.float32(1.0), 0), TypeError, "window_size[0] must be an int, got float32"),
    ("softmax_scale", torch.tensor([0.5, 0.5]), ValueError, "softmax_scale must be a scalar or a one-element tensor"),
    ("softmax_scale", torch.tensor(float("nan")), ValueError, "softmax_scale must be finite, got nan"),
    ("softmax_scale", np.float32("inf"), ValueError, "softmax_scale must be finite, got inf"),
    ("softmax_scale", torch.tensor(True), TypeError, "softmax_scale must be a real number or None, got Tensor of dtype bool"),
    ("softmax_scale", np.bool_(True), TypeError, "softmax_scale must be a real number or None, got bool"),
    ("softmax_scale", torch.tensor(0.5j), TypeError, "softmax_scale must be a real number or None, got Tensor of dtype complex64"),
    ("softcap", torch.tensor(float("inf")), ValueError, "softcap must be finite, got inf"),
    ("softcap", torch.tensor(-1.0), ValueError, "softcap must be >= 0.0, got -1.0"),
    ("num_splits", torch.tensor(2.0), TypeError, "num_splits must be an int, got Tensor of dtype float32"),
    ("num_splits", np.float64(2.0), TypeError, "num_splits must be an int, got float"),
    ("num_splits", 2.0, TypeError, "num_splits must be an int, got float"),
    ("num_splits", torch.tensor(True), TypeError, "num_splits must be an int, got Tensor of dtype bool"),
    ("num_splits", torch.tensor([], dtype=torch.int64), ValueError, "num_splits must be a scalar or a one-element tensor"),
    ("max_seqlen_q", torch.tensor([3, 3]), ValueError, "max_seqlen_q must be a scalar or a one-element tensor"),
    ("max_seqlen_q", torch.tensor(-1), ValueError, "max_seqlen_q must be >= 0, got -1"),
    ("causal", torch.tensor(1), TypeError, "causal must be a bool, got Tensor of dtype int64"),
    ("causal", np.int64(1), TypeError, "causal must be a bool, got int64"),
]


@pytest.mark.parametrize("path", ["root-paged", "sgl-varlen", "vllm-paged"])
@pytest.mark.parametrize("name, form, error, message", REFUSED, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSED)])
def test_still_refused_forms_name_the_argument(path, name, form, error, message):
    with pytest.raises(error) as info:
        _call(path, dict(BASE, **{name: form}))
    assert str(info.value).startswith(message), str(info.value)


def test_refused_mla_scalars_name_the_argument():
    t = _mla_inputs()
    workspace = torch.zeros(0, dtype=torch.uint8, device=DEVICE)
    args = (t["q_nope"], t["q_pe"], t["cache"], t["lens"], t["page_table"], workspace)
    with pytest.raises(TypeError, match=r"^num_kv_splits must be an int, got Tensor of dtype float32"):
        sgl_kernel.flash_mla_decode(*args, 0.125, torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"^sm_scale must be a scalar or a one-element tensor"):
        sgl_kernel.flash_mla_decode(*args, torch.tensor([0.125, 0.125]), 1)
    with pytest.raises(TypeError, match=r"^max_seq_len must be an int, got Tensor of dtype float32"):
        sgl_kernel.flash_mla_get_workspace_size(torch.tensor(12.0), 2)
