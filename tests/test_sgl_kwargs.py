"""``flash_attn_with_kvcache`` takes every keyword sgl-kernel-xpu's takes.

Arguments that change nothing on their own (``rotary_seqlens`` and ``rotary_interleaved`` without
``rotary_cos``; the hints ``max_seqlen_k``, ``scheduler_metadata``, ``pack_gqa``, ``sm_margin``) are
accepted and ignored: the output is bitwise the call without them. Arguments that would change the
result and are not implemented (``qv``, ``q_descale``), and AppendKV arguments without their partners
(``k`` without ``v``, rotary or ``cu_seqlens_k_new`` without ``k``), raise ``ValueError`` naming the
argument."""
from __future__ import annotations

import inspect

import pytest
import torch

from helpers import DEVICE
from triton_xpu_attn import flash_attn_with_kvcache

#: sgl-kernel-xpu's python/sgl_kernel/flash_attn.py signature (order as there)
SGL_KERNEL_XPU_PARAMETERS = (
    "q", "k_cache", "v_cache", "k", "v", "qv", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
    "cache_leftpad", "page_table", "cu_seqlens_q", "cu_seqlens_k_new", "max_seqlen_q", "max_seqlen_k",
    "rotary_seqlens", "q_descale", "k_descale", "v_descale", "softmax_scale", "sinks", "causal", "window_size",
    "softcap", "rotary_interleaved", "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin",
    "return_softmax_lse", "out",
)


def _problem(seed=0):
    """B = 2 decode queries, 4 query heads over 2 KV heads, D = 64, page size 4, lengths 3 and 5."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(6, 4, 2, 64, generator=gen)
    v = torch.randn(6, 4, 2, 64, generator=gen)
    q = torch.randn(2, 1, 4, 64, generator=gen)
    table = torch.tensor([[2, 0], [1, 4]], dtype=torch.int32)
    lens = torch.tensor([3, 5], dtype=torch.int32)
    return {name: t.to(DEVICE) for name, t in dict(q=q, k_cache=k, v_cache=v, page_table=table, cache_seqlens=lens).items()}


def test_signature_holds_every_sgl_kernel_xpu_keyword():
    ours = inspect.signature(flash_attn_with_kvcache).parameters
    missing = [p for p in SGL_KERNEL_XPU_PARAMETERS if p not in ours]
    assert not missing, f"flash_attn_with_kvcache lacks {missing}"


def test_arguments_without_effect_are_accepted_and_ignored():
    x = _problem()
    plain, plain_lse = flash_attn_with_kvcache(**x, causal=True, return_softmax_lse=True)
    # what sglang's XPU backend passes besides the essentials, and the remaining hints
    got, got_lse = flash_attn_with_kvcache(
        **x, causal=True, return_softmax_lse=True,
        rotary_seqlens=torch.tensor([2, 4], dtype=torch.int32, device=DEVICE), rotary_interleaved=False,
        max_seqlen_k=5, scheduler_metadata=torch.zeros(4, dtype=torch.int32, device=DEVICE), pack_gqa=False,
        sm_margin=8, max_seqlen_q=1,
    )
    assert torch.equal(got.cpu(), plain.cpu()) and torch.equal(got_lse.cpu(), plain_lse.cpu())


@pytest.mark.parametrize(
    "name, make",
    [
        ("qv", lambda: torch.zeros(2, 1, 4, 64)),
        ("q_descale", lambda: torch.ones(1)),
    ],
)
def test_arguments_that_change_the_result_raise_naming_themselves(name, make):
    x = _problem()
    with pytest.raises(ValueError) as info:
        flash_attn_with_kvcache(**x, **{name: make().to(DEVICE)})
    assert str(info.value).startswith(f"{name}: ")


@pytest.mark.parametrize(
    "given, named",
    [
        (dict(k=lambda: torch.zeros(2, 1, 2, 64)), "v"),
        (dict(v=lambda: torch.zeros(2, 1, 2, 64)), "k"),
        (dict(rotary_cos=lambda: torch.zeros(8, 16), rotary_sin=lambda: torch.zeros(8, 16)), "rotary_cos"),
        (dict(cu_seqlens_k_new=lambda: torch.zeros(3, dtype=torch.int32)), "cu_seqlens_k_new"),
    ],
)
def test_append_arguments_without_their_partner_raise_naming_it(given, named):
    """AppendKV arguments (k / v, rotary, cu_seqlens_k_new) only work together: one alone raises."""
    x = _problem()
    with pytest.raises(ValueError) as info:
        flash_attn_with_kvcache(**x, **{name: make().to(DEVICE) for name, make in given.items()})
    assert str(info.value).startswith(f"{named}: ")


def test_rotary_seqlens_with_rotary_cos_names_rotary_cos():
    x = _problem()
    with pytest.raises(ValueError, match=r"^rotary_cos: "):
        flash_attn_with_kvcache(
            **x, rotary_cos=torch.zeros(8, 16, device=DEVICE), rotary_sin=torch.zeros(8, 16, device=DEVICE),
            rotary_seqlens=torch.tensor([2, 4], dtype=torch.int32, device=DEVICE),
        )
