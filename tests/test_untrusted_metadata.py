"""Index metadata no engine should pass, with ``validate=False`` (the default):
the ops never read or write outside the tensors they were given, and give the documented result
(docs/robustness.md, "Untrusted index metadata"):

* a page id outside ``[0, num_pages)`` is never followed: the keys it names read the pool's last
  page in its place (pointer and block-pointer loads: decode, drafts, gathered prefill, XPU);
* ``cu_seqlens_q`` offsets outside q / out: rows outside q / out are neither read nor written;
* a request longer than ``max_seqlen_q``: its rows past the grid's tiles are NaN;
* (descriptor loads, TMA prefill) a page id outside the pool reads zeros: in bounds, deterministic;
* a ``cu_seqlens_k`` slice outside k: the request has no keys (output 0, LSE -inf);
* a pool index outside ``req_to_token``: that row of ``normalize_page_table`` is -1.

q and out live inside larger buffers whose guard rows must come back untouched. The GPU proof is
``bench/experiments/memcheck_fuzz.py`` (compute-sanitizer); these run anywhere."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triton_xpu_attn as ours
from helpers import assert_close
from triton_xpu_attn import reference

H_Q, H_KV, D = 4, 2, 64
GUARD = 2  # guard rows on each side of q and out
SENTINEL = 7.0


def _clamped(table: torch.Tensor, num_pages: int) -> torch.Tensor:
    """The page table the ops read: ids outside the pool replaced by the last page."""
    return torch.where((table >= 0) & (table < num_pages), table, num_pages - 1)


def _guarded(rows: int, *shape, device, fill=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): ``rows`` rows between GUARD sentinel rows on each side."""
    buf = torch.full((rows + 2 * GUARD, *shape), SENTINEL, device=device)
    view = buf[GUARD:GUARD + rows]
    if fill is not None:
        view.copy_(fill)
    return buf, view


def _guards_intact(buf: torch.Tensor) -> bool:
    return bool((buf[:GUARD] == SENTINEL).all() and (buf[-GUARD:] == SENTINEL).all())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    page_size=st.sampled_from([1, 4, 16]),
    num_splits=st.sampled_from([0, 1, 3]),
    bad=st.sampled_from([-1, "num_pages", 2**30, -2**31, 2**31 - 1]),
    where=st.integers(0, 100),
    q_len=st.sampled_from([1, 3]),
)
def test_page_id_outside_pool_reads_last_page(device, page_size, num_splits, bad, where, q_len):
    torch.manual_seed(where)
    batch, kv_len = 2, 24
    cols = math.ceil(kv_len / page_size)
    num_pages = batch * cols + 1
    k = torch.randn(num_pages, page_size, H_KV, D, device=device)
    v = torch.randn(num_pages, page_size, H_KV, D, device=device)
    table = torch.randperm(num_pages, device=device)[: batch * cols].view(batch, cols).to(torch.int32)
    table.view(-1)[where % table.numel()] = num_pages if bad == "num_pages" else bad
    lens = torch.tensor([kv_len, kv_len - 5], dtype=torch.int32, device=device)
    q = torch.randn(batch, q_len, H_Q, D, device=device)
    out, lse = ours.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, page_table=table, causal=True,
                                           num_splits=num_splits, return_softmax_lse=True)
    ref, ref_lse = reference.paged_attention(q.reshape(-1, H_Q, D), k, v, lens, _clamped(table, num_pages),
                                             torch.arange(0, batch + 1, device=device, dtype=torch.int32) * q_len,
                                             causal=True)
    assert_close(out.reshape(-1, H_Q, D), ref, torch.float32)
    assert_close(lse, ref_lse.to(lse.dtype), torch.float32, "lse")


@pytest.mark.parametrize("cu, max_q", [
    ((0, 1, -2), None), ((0, 3, 7), None), ((0, 3, 7), 4), ((-3, 1, 3), None), ((0, 5, 2), None),
    ((0, 2, 3), 1),  # max_seqlen_q shorter than request 0
])
@pytest.mark.parametrize("page_size", [1, 16])
def test_query_offsets_outside_q_stay_inside(device, cu, max_q, page_size):
    torch.manual_seed(1)
    total_q, num_pages = 3, 6
    k = torch.randn(num_pages, page_size, H_KV, D, device=device)
    v = torch.randn(num_pages, page_size, H_KV, D, device=device)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=device)
    lens = torch.tensor([min(9, 2 * page_size), min(7, 2 * page_size)], dtype=torch.int32, device=device)
    q_buf, q = _guarded(total_q, H_Q, D, device=device, fill=torch.randn(total_q, H_Q, D, device=device))
    q_buf[:GUARD] = float("nan")  # a read of a guard row would show as NaN in the output
    q_buf[-GUARD:] = float("nan")
    out_buf, out = _guarded(total_q, H_Q, D, device=device)
    cu_q = torch.tensor(cu, dtype=torch.int32, device=device)
    ours.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, page_table=table, cu_seqlens_q=cu_q, max_seqlen_q=max_q,
                                 causal=True, out=out)
    assert _guards_intact(out_buf), "a write outside out"
    # rows of a well-formed request that no other request claims are exact; the rest is defined
    # (not left as whatever out held) unless two requests claim the row
    for b in range(2):
        start, end = cu[b], cu[b + 1]
        if start < 0 or end > total_q or end < start or any(cu[j + 1] < cu[j] for j in range(2)):
            continue
        one = torch.tensor([0, end - start], dtype=torch.int32, device=device)
        ref, _ = reference.paged_attention(q[start:end], k, v, lens[b:b + 1], table[b:b + 1], one, causal=True)
        got = out[start:end]
        if max_q is not None and end - start > max_q:
            # the grid's tiles own at least max_seqlen_q rows (exact); the rows past them are NaN
            owned = int((~torch.isnan(got).all(dim=(1, 2))).sum())
            assert owned >= max_q and torch.isnan(got[owned:]).all()
            got, ref = got[:owned], ref[:owned]
        assert_close(got, ref, torch.float32)


def test_request_longer_than_max_seqlen_q_gets_nan(device):
    torch.manual_seed(2)
    page_size, q_len, max_q = 16, 40, 8
    k = torch.randn(4, page_size, H_KV, D, device=device)
    table = torch.tensor([[0, 1, 2, 3]], dtype=torch.int32, device=device)
    q = torch.randn(q_len, H_Q, D, device=device)
    out = torch.zeros(q_len, H_Q, D, device=device)
    cu = torch.tensor([0, q_len], dtype=torch.int32, device=device)
    lens = torch.tensor([64], dtype=torch.int32, device=device)
    _, lse = ours.flash_attn_with_kvcache(q, k, k, cache_seqlens=lens, page_table=table, cu_seqlens_q=cu,
                                         max_seqlen_q=max_q, causal=True, out=out, return_softmax_lse=True)
    ref, _ = reference.paged_attention(q, k, k, lens, table, cu, causal=True)
    rows = torch.isnan(out).all(dim=(1, 2))
    written = (~rows).nonzero().flatten()
    # the grid's tiles own the first rows (at least max_seqlen_q of them): exact; every later row NaN
    assert len(written) >= max_q and rows[len(written):].all() and not rows[:len(written)].any()
    assert_close(out[: len(written)], ref[: len(written)], torch.float32)
    assert not torch.isnan(lse[:, : len(written)]).any()


@pytest.mark.parametrize("num_splits", [1, 3])
def test_long_requests_past_the_first_128_get_nan(device, num_splits):
    """The padding program finds the requests longer than max_seqlen_q 128 at a time: one in the
    second chunk (request 129 of 131) gets NaN past the grid's rows, its neighbours stay exact,
    with and without KV splits (NaN partials combine to NaN)."""
    torch.manual_seed(4)
    page_size, max_q, batch, long_request = 16, 2, 131, 129
    q_lens = [1] * batch
    q_lens[long_request] = 9
    cu = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32, device=device)
    total_q = int(cu[-1])
    k = torch.randn(3, page_size, H_KV, D, device=device)
    table = torch.tensor([[0, 1]] * batch, dtype=torch.int32, device=device)
    lens = torch.full((batch,), 20, dtype=torch.int32, device=device)
    q = torch.randn(total_q, H_Q, D, device=device)
    out = torch.zeros(total_q, H_Q, D, device=device)
    _, lse = ours.flash_attn_with_kvcache(q, k, k, cache_seqlens=lens, page_table=table, cu_seqlens_q=cu,
                                         max_seqlen_q=max_q, causal=True, out=out, return_softmax_lse=True,
                                         num_splits=num_splits)
    ref, _ = reference.paged_attention(q, k, k, lens, table, cu, causal=True)
    nan_rows = torch.isnan(out).all(dim=(1, 2))
    start = int(cu[long_request])
    owned = int((~nan_rows[start:start + 9]).sum())
    assert owned >= max_q and nan_rows[start + owned:start + 9].all()
    assert torch.isnan(lse[:, start + owned:start + 9]).all()
    exact = torch.ones(total_q, dtype=torch.bool)
    exact[start + owned:start + 9] = False
    assert not nan_rows[exact].any()
    assert_close(out[exact], ref[exact], torch.float32)


@pytest.mark.parametrize("cu_k", [(0, 2, 50), (0, -4, 6), (0, 6, 3)])
def test_key_slice_outside_k_is_empty(device, cu_k):
    torch.manual_seed(3)
    total_q, total_k = 3, 6
    q = torch.randn(total_q, H_Q, D, device=device)
    k = torch.randn(total_k, H_KV, D, device=device)
    cu_q = torch.tensor([0, 1, 3], dtype=torch.int32, device=device)
    out, lse = ours.flash_attn_varlen_func(q, k, k, cu_q, torch.tensor(cu_k, dtype=torch.int32, device=device), 2, 50,
                                           return_softmax_lse=True)
    for b in range(2):
        rows = slice(*cu_q[b:b + 2].tolist())
        start, end = cu_k[b], cu_k[b + 1]
        if 0 <= start <= end <= total_k:
            ref, _ = reference.varlen_attention(q[rows], k[start:end], k[start:end],
                                             torch.tensor([0, rows.stop - rows.start], dtype=torch.int32, device=device),
                                             torch.tensor([0, end - start], dtype=torch.int32, device=device))
            assert_close(out[rows], ref, torch.float32)
        else:
            assert (out[rows] == 0).all() and (lse[:, rows] == float("-inf")).all()


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("bad", [-1, "num_pages", 2**30])
def test_mla_page_id_outside_pool_reads_last_page(device, page_size, bad):
    torch.manual_seed(4)
    R, DR, H, batch, kv_len = 64, 16, 4, 2, 20
    cols = math.ceil(kv_len / page_size)
    num_pages = batch * cols + 1
    cache = torch.randn(num_pages, page_size, R + DR, device=device)
    table = torch.randperm(num_pages, device=device)[: batch * cols].view(batch, cols).to(torch.int32)
    table[1, -1] = num_pages if bad == "num_pages" else bad
    lens = torch.tensor([kv_len, kv_len - 3], dtype=torch.int32, device=device)
    q_nope, q_pe = torch.randn(batch, H, R, device=device), torch.randn(batch, H, DR, device=device)
    out = ours.flash_mla_decode(q_nope, q_pe, cache, lens, table, None, 0.125, 1)
    out = out[0] if isinstance(out, tuple) else out
    ref = reference.mla_decode(q_nope, q_pe, cache, lens, _clamped(table, num_pages), 0.125)
    ref = ref[0] if isinstance(ref, tuple) else ref
    assert_close(out.reshape(ref.shape), ref, torch.float32)


@pytest.mark.parametrize("cu", [(0, 2, -3), (0, 2, 9), (-2, 1, 5)])
def test_mla_prefill_offsets_outside_q_stay_inside(device, cu):
    torch.manual_seed(5)
    R, DR, H, total_q, page_size = 64, 16, 4, 5, 16
    cache = torch.randn(4, page_size, R + DR, device=device)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=device)
    q_buf, q_nope = _guarded(total_q, H, R, device=device, fill=torch.randn(total_q, H, R, device=device))
    q_pe = torch.randn(total_q, H, DR, device=device)
    out = ours.flash_mla_prefill(q_nope, q_pe, cache, torch.tensor(cu, dtype=torch.int32, device=device),
                                 torch.tensor([20, 30], dtype=torch.int32, device=device), 4, table, None, 0.125)
    out = out[0] if isinstance(out, tuple) else out
    assert out.shape[0] == total_q
    assert _guards_intact(q_buf)
    start, end = cu[0], cu[1]
    if 0 <= start <= end <= total_q and cu[2] >= end:
        one = torch.tensor([0, end - start], dtype=torch.int32, device=device)
        ref = reference.mla_prefill(q_nope[start:end], q_pe[start:end], cache, one,
                                    torch.tensor([20], dtype=torch.int32, device=device), table[:1], 0.125)
        ref = ref[0] if isinstance(ref, tuple) else ref
        assert_close(out[start:end], ref, torch.float32)


def test_normalize_pool_index_outside_table_gives_minus_one(device):
    req_to_token = torch.arange(64, dtype=torch.int32, device=device).view(2, 32)
    idx = torch.tensor([-1, 1, 2, 2**30], dtype=torch.int32, device=device)
    out = ours.normalize_page_table(req_to_token, idx, torch.full((4,), 16, dtype=torch.int32, device=device), 4,
                                    max_pages=4)
    assert (out[0] == -1).all() and (out[2] == -1).all() and (out[3] == -1).all()
    assert out[1].tolist() == (req_to_token[1, ::4][:4] // 4).tolist()


@pytest.mark.parametrize("page_size", [16, 64])
def test_prefill_page_id_outside_pool_is_deterministic_and_contained(device, page_size):
    """Prefill tiles (on Hopper, P = 64 goes through TMA descriptors, which read zeros for an
    out-of-pool page): the other request is exact, the bad one finite and bitwise repeatable."""
    torch.manual_seed(6)
    batch, q_len, kv_len = 2, 32, 128
    cols = kv_len // page_size
    num_pages = batch * cols
    k = torch.randn(num_pages, page_size, H_KV, D, device=device)
    v = torch.randn(num_pages, page_size, H_KV, D, device=device)
    table = torch.arange(num_pages, device=device, dtype=torch.int32).view(batch, cols)
    table[1, 0] = -7
    q = torch.randn(batch * q_len, H_Q, D, device=device)
    cu = torch.tensor([0, q_len, 2 * q_len], dtype=torch.int32, device=device)
    lens = torch.full((batch,), kv_len, dtype=torch.int32, device=device)
    run = lambda: ours.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, page_table=table,  # noqa: E731
                                               cu_seqlens_q=cu, max_seqlen_q=q_len, causal=True)
    first, second = run(), run()
    assert torch.equal(first, second) and torch.isfinite(first).all()
    ref, _ = reference.paged_attention(q[:q_len], k, v, lens[:1], table[:1], cu[:2], causal=True)
    assert_close(first[:q_len], ref, torch.float32)


def test_mla_empty_cache_has_no_keys(device):
    """A cache of no pages (every length impossible): zeros and LSE -inf, nothing read."""
    R, DR, H = 64, 16, 4
    cache = torch.empty(0, 16, R + DR, device=device)
    table = torch.zeros(2, 2, dtype=torch.int32, device=device)
    lens = torch.tensor([20, 30], dtype=torch.int32, device=device)
    out, lse = ours.flash_mla_decode(torch.randn(2, H, R, device=device), torch.randn(2, H, DR, device=device), cache,
                                     lens, table, None, 0.125, 1, return_lse=True)
    assert (out == 0).all() and (lse == float("-inf")).all()
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    out, lse = ours.flash_mla_prefill(torch.randn(5, H, R, device=device), torch.randn(5, H, DR, device=device), cache,
                                      cu, lens, 3, table, None, 0.125, return_lse=True)
    assert (out == 0).all() and (lse == float("-inf")).all()


@pytest.mark.parametrize("page_size", [1, 16])
def test_intel_code_paths_give_the_same_results(device, monkeypatch, page_size):
    """The launcher's Intel-GPU code-generation choices (INTEL_GPU: 64-bit page clamp on gathers)
    give the same results, NaN rows past max_seqlen_q included."""
    from triton_xpu_attn import device as device_mod
    from triton_xpu_attn.ops import paged_launch

    if device_mod.backend() != "interpreter":
        pytest.skip("the Intel choices are forced through the interpreter's launcher")
    torch.manual_seed(7)
    q_len, kv_len, max_q = 96, 96, 20  # max_q > 16: prefill tiles
    num_pages = kv_len // page_size + 1
    k = torch.randn(num_pages, page_size, H_KV, D, device=device)
    table = torch.arange(kv_len // page_size, dtype=torch.int32, device=device).view(1, -1)
    table[0, 1] = -3
    q = torch.randn(q_len, H_Q, D, device=device)
    cu = torch.tensor([0, q_len], dtype=torch.int32, device=device)
    lens = torch.tensor([kv_len], dtype=torch.int32, device=device)
    call = lambda: ours.flash_attn_with_kvcache(q, k, k, cache_seqlens=lens, page_table=table, cu_seqlens_q=cu,  # noqa: E731
                                                max_seqlen_q=max_q, causal=True)
    plain = call()
    seen = []
    real = paged_launch._paged_attention_kernel

    class IntelChoices:  # the kernel, launched with INTEL_GPU=True whatever the launcher asked for
        def __getitem__(self, grid):
            return lambda *a, **kw: (seen.append(kw.get("INTEL_GPU")), real[grid](*a, **{**kw, "INTEL_GPU": True}))[1]

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(paged_launch, "_paged_attention_kernel", IntelChoices())
    intel = call()
    assert seen and seen[0] is False  # the interpreter's launcher asked for the NVIDIA choices; forced to Intel's
    nan_plain, nan_intel = torch.isnan(plain), torch.isnan(intel)
    assert torch.equal(nan_plain, nan_intel) and nan_plain.any()
    assert torch.equal(plain[~nan_plain], intel[~nan_intel])
