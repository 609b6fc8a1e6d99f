"""Index lists grouped by cache region (``ops/index_order.py``): the exact reordering against a
stable sort on the host, every element of a poisoned output checked, and when the sparse prefill
asks for it."""
from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import DEVICE
from triton_xpu_attn import device as _device
from triton_xpu_attn.ops import index_order

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
POISON = -12345


def expected_order(indices, num_rows, buckets, topk_length):
    """``order_by_bucket`` on the host: each list's counted entries (invalid ones as -1, in bucket
    0) stably sorted by ``index >> shift``, then -1 for the entries past its length."""
    tokens, heads, topk = indices.shape
    shift = max(0, (max(num_rows, 1) - 1).bit_length() - (buckets.bit_length() - 1))
    out = torch.full((tokens, heads, topk), -1, dtype=torch.int32)
    for t in range(tokens):
        n = topk if topk_length is None else min(max(int(topk_length[t]), 0), topk)
        for h in range(heads):
            row = indices[t, h, :n].long()
            valid = (row >= 0) & (row < num_rows)
            group = torch.where(valid, row >> shift, 0)
            order = torch.sort(group, stable=True).indices
            out[t, h, :n] = torch.where(valid, row, -1)[order].to(torch.int32)
    return out


def _draw_entry(draw, num_rows, wide):
    kind = draw(st.integers(0, 9))
    if kind < 6:
        return draw(st.integers(0, num_rows - 1))
    big = 2**40 if wide else I32_MAX
    return draw(st.sampled_from([-1, -7, num_rows, num_rows + 3, I32_MIN, I32_MAX, -big, big]))


@given(
    tokens=st.integers(1, 3),
    heads=st.integers(1, 3),
    topk=st.one_of(st.sampled_from([1, 2, 15, 16, 17, 64, 100, 600, 1100]), st.integers(1, 200)),
    num_rows=st.one_of(st.sampled_from([1, 2, 1000, 4096, 4097]), st.integers(1, 100000)),
    buckets=st.sampled_from([1, 2, 4, 8, 16]),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    with_length=st.booleans(),
    transposed=st.booleans(),
    chunk=st.sampled_from([index_order.DEFAULT_CHUNK, 16]),
    data=st.data(),
)
def test_order_matches_a_stable_sort(tokens, heads, topk, num_rows, buckets, index_dtype, with_length, transposed,
                                     chunk, data):
    """``chunk``: entries a step (16: lists of many steps at small sizes)."""
    wide = index_dtype == torch.int64
    values = [_draw_entry(data.draw, num_rows, wide) for _ in range(tokens * heads * topk)]
    indices = torch.tensor(values, dtype=torch.int64).view(tokens, heads, topk).to(index_dtype)
    if transposed:
        indices = indices.transpose(1, 2).contiguous().transpose(1, 2)
    topk_length = None
    if with_length:
        choices = [-3, 0, 1, topk // 2, topk - 1, topk, topk + 9, I32_MAX]
        topk_length = torch.tensor([data.draw(st.sampled_from(choices)) for _ in range(tokens)], dtype=torch.int32)
    out = torch.full((tokens, heads, topk), POISON, dtype=torch.int32, device=DEVICE)
    with mock.patch.object(index_order, "_chunk", lambda backend: chunk):
        got = index_order.order_by_bucket(indices.to(DEVICE), num_rows, buckets,
                                          topk_length.to(DEVICE) if topk_length is not None else None, out=out)
    assert got is out
    assert torch.equal(got.cpu(), expected_order(indices, num_rows, buckets, topk_length))


def test_order_by_hand():
    """Rows 0..99 in 4 buckets of 32 rows; an entry naming no row (-4, 100) keeps its place in
    bucket 0; the entries past the length come back as -1."""
    indices = torch.tensor([[[70, 5, -4, 40, 100, 33, 2, 99, 64]]], dtype=torch.int32)
    length = torch.tensor([8], dtype=torch.int32)
    got = index_order.order_by_bucket(indices.to(DEVICE), 100, 4, length.to(DEVICE)).cpu()
    assert got.tolist() == [[[5, -1, -1, 2, 40, 33, 70, 99, -1]]]


def test_buckets_follow_the_l2_cache(monkeypatch):
    """Which calls get reordered lists, and in how many buckets (the GPU's properties stubbed)."""
    if _device.backend() == "interpreter":
        assert index_order.locality_buckets(10**6, 1152, 10**4, 2048, DEVICE) == 0
    monkeypatch.setattr(_device, "backend", lambda: "cuda")
    monkeypatch.setattr(_device, "compute_units", lambda device=None: 132)
    monkeypatch.setattr(_device, "l2_cache_bytes", lambda device=None: 50 << 20)
    buckets = index_order.locality_buckets
    assert buckets(131072, 1152, 1024, 2048, None) == 8  # 144 MiB: 16 buckets of 9 MiB, at most 8
    assert buckets(65536, 1152, 1024, 2048, None) == 8
    assert buckets(32768, 1152, 1024, 2048, None) == 4  # 36 MiB: more than half the L2 cache
    assert buckets(16384, 1152, 1024, 2048, None) == 0  # 18 MiB
    assert buckets(131072, 1152, 100, 2048, None) == 0  # fewer lists than SMs
    assert buckets(131072, 1152, 1024, index_order.MAX_TOPK + 1, None) == 0
    assert buckets(131072, 1152, 1024, 1, None) == 0
    assert buckets(2**30, 1152, 1024, 2048, None) == index_order.CHOSEN_MAX_BUCKETS
    monkeypatch.setattr(_device, "l2_cache_bytes", lambda device=None: None)  # XPU: the default size
    assert buckets(32768, 1152, 1024, 2048, None) == 8


def test_empty_lists():
    got = index_order.order_by_bucket(torch.empty(3, 1, 0, dtype=torch.int32, device=DEVICE), 10, 4)
    assert got.shape == (3, 1, 0)


@pytest.mark.gpu
def test_order_of_deepseek_lists():
    """2048-entry lists over 128k rows in 16 buckets, compiled: a permutation of each list."""
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    indices = torch.randint(-10, 131072 + 10, (300, 1, 2048), generator=gen, device=DEVICE, dtype=torch.int32)
    length = torch.randint(0, 2100, (300,), generator=gen, device=DEVICE, dtype=torch.int32)
    got = index_order.order_by_bucket(indices, 131072, 16, length)
    assert torch.equal(got[:5].cpu(), expected_order(indices[:5].cpu(), 131072, 16, length[:5].cpu()))
    n = length.clamp(0, 2048).long()
    counted = torch.arange(2048, device=DEVICE)[None, :] < n[:, None]
    valid = counted & (indices[:, 0] >= 0) & (indices[:, 0] < 131072)
    want = torch.sort(torch.where(valid, indices[:, 0], -1), dim=1).values
    assert torch.equal(torch.sort(got[:, 0], dim=1).values, want)
    groups = torch.where(got[:, 0] >= 0, got[:, 0] >> 13, 0)
    assert bool(((groups[:, 1:] >= groups[:, :-1]) | ~counted[:, 1:]).all())
