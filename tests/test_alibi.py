"""ALiBi slopes (``alibi_slopes``) in flash_attn_with_kvcache and flash_attn_varlen_func.

FlashAttention's meaning: ``[Hq]`` or ``[B, Hq]`` float32 slopes; the logit of query position ``i``
(bottom-right aligned) and key ``j`` gets ``-slope * |i - j|`` after the scale and the softcap,
masks and windows still applied, the LSE including the bias. Property tests against the float64
reference over GQA groups, page sizes (1 to 64), decode and prefill lengths, causal / windows /
softcap / sinks, the slope layouts (``[Hq]``, ``[B, Hq]``, an expanded and a strided view), split
counts and key tiles (masked and whole tiles, every K/V load); the contiguous K/V of
``flash_attn_varlen_func`` with ``seqused_k`` / ``seqused_q``; zero slopes give the call without
ALiBi bit for bit; bad slopes raise naming ``alibi_slopes``; the sgl_kernel / vllm_xpu_kernels
calls and the custom ops pass the slopes through; a bf16 GPU test at prefill sizes.
"""
import contextlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import DEVICE, FLOAT_DTYPES, INTERPRET, KV_LOADS, assert_close, kv_load_config, poison
from test_paged_attention import check_lse, make_paged_cache
from test_varlen_attention import make_kv
from triton_xpu_attn import custom_ops as C
from triton_xpu_attn import flash_attn_varlen_func, flash_attn_with_kvcache, tune
from triton_xpu_attn import reference as ref

SLOPE_LAYOUTS = ["heads", "batch", "expanded", "strided"]


def make_slopes(layout: str, batch: int, heads: int, gen) -> torch.Tensor:
    """Slopes as an engine may hand them: ALiBi's geometric ``[Hq]`` series (``heads``), random
    ``[B, Hq]`` ones (``batch``), one ``[Hq]`` row expanded to ``[B, Hq]`` (stride 0) or a strided
    ``[Hq]`` view (copied by the launcher)."""
    geometric = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])
    if layout == "batch":
        return torch.rand(batch, heads, generator=gen) * 0.8
    if layout == "expanded":
        return geometric[None].expand(batch, heads)
    if layout == "strided":
        return torch.stack([geometric, torch.rand(heads, generator=gen)], 1)[:, 0]
    return geometric


@st.composite
def paged_problems(draw):
    decode = draw(st.booleans())
    batch = draw(st.integers(1, 3))
    q_lens = [1 if decode else draw(st.integers(0, 6)) for _ in range(batch)]
    causal = draw(st.booleans())
    return dict(
        dtype=draw(st.sampled_from(FLOAT_DTYPES)), batch=batch, group=draw(st.sampled_from([1, 2, 3, 4, 8])),
        num_kv_heads=draw(st.integers(1, 2)), dims=draw(st.sampled_from([(32, 32), (64, 64), (40, 24)])),
        page_size=draw(st.sampled_from([1, 4, 16, 64])), q_lens=q_lens,
        kv_lens=[q + draw(st.integers(0, 40)) for q in q_lens], causal=causal,
        window=(draw(st.sampled_from([-1, -1, 0, 3, 17])),
                draw(st.sampled_from([-1, 0])) if causal else draw(st.sampled_from([-1, -1, 0, 2]))),
        softcap=draw(st.sampled_from([0.0, 0.0, 5.0])), sinks=draw(st.booleans()),
        slopes=draw(st.sampled_from(SLOPE_LAYOUTS)), num_splits=draw(st.sampled_from([0, 1, 3])),
        four_d=decode and draw(st.booleans()), max_q=draw(st.booleans()),
        tiles=draw(st.sampled_from([None, None, 16, 32])), kv_load=draw(st.sampled_from(KV_LOADS)),
        seed=draw(st.integers(0, 2**16)),
    )


def run_paged(pb, alibi=True):
    """``pb`` (``paged_problems``) through flash_attn_with_kvcache: ``(out, lse, out_ref, lse_ref)``."""
    gen = torch.Generator().manual_seed(pb["seed"])
    dtype, page, (d, dv) = pb["dtype"], pb["page_size"], pb["dims"]
    heads = pb["group"] * pb["num_kv_heads"]
    pages = [-(-n // page) for n in pb["kv_lens"]]
    num_pages = sum(pages) + 1
    k_cache, v_cache = make_paged_cache(num_pages, page, pb["num_kv_heads"], d, dv, dtype, "contiguous", gen)
    order = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    table = torch.zeros(pb["batch"], max(pages + [1]), dtype=torch.int32)
    for b, n in enumerate(pages):
        table[b, :n] = torch.tensor(order[sum(pages[:b]) : sum(pages[:b]) + n], dtype=torch.int32)
    cu = torch.tensor([0] + torch.tensor(pb["q_lens"]).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), heads, d, generator=gen).to(dtype)
    lens = torch.tensor(pb["kv_lens"], dtype=torch.int32)
    sinks = torch.randn(heads, generator=gen) if pb["sinks"] else None
    slopes = make_slopes(pb["slopes"], pb["batch"], heads, gen) if alibi else None
    options = dict(causal=pb["causal"], window_size=pb["window"], softcap=pb["softcap"])
    out_ref, lse_ref = ref.paged_attention(q, k_cache, v_cache, lens, table, cu, sinks=sinks, alibi_slopes=slopes,
                                           **options)
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    out = poison(torch.empty(q.shape[0], heads, dv, dtype=dtype, device=DEVICE))
    call = dict(cache_seqlens=to(lens), page_table=to(table), sinks=to(sinks), alibi_slopes=to(slopes), out=out,
                num_splits=pb["num_splits"], return_softmax_lse=True, **options)
    if pb["four_d"]:
        q_in = q.reshape(pb["batch"], 1, heads, d)
    else:
        q_in = q
        call.update(cu_seqlens_q=to(cu), max_seqlen_q=max(pb["q_lens"]) if pb["max_q"] else None)
    config = dict(BLOCK_N=pb["tiles"], BLOCK_M=16, min_split_tokens=16, **kv_load_config(pb["kv_load"]))
    with tune.override("paged_attention", config) if pb["tiles"] else contextlib.nullcontext():
        got, lse = flash_attn_with_kvcache(to(q_in), to(k_cache), to(v_cache), **call)
    assert got is out
    return got, lse, out_ref, lse_ref


def check(result, dtype):
    """``(out, lse, out_ref, lse_ref)``: every element written, both close to the reference."""
    got, lse, out_ref, lse_ref = result
    assert not torch.isnan(got).any(), "unwritten (poisoned) or NaN output"
    assert_close(got, out_ref, dtype)
    check_lse(lse, lse_ref, dtype)


@given(pb=paged_problems())
def test_paged_matches_reference(pb):
    check(run_paged(pb), pb["dtype"])


def _paged(**overrides):
    pb = dict(dtype=torch.float32, batch=2, group=4, num_kv_heads=2, dims=(64, 64), page_size=4, q_lens=[1, 1],
              kv_lens=[150, 97], causal=True, window=(-1, -1), softcap=0.0, sinks=False, slopes="batch",
              num_splits=4, four_d=False, max_q=True, tiles=16, kv_load="pointer", seed=5)
    pb.update(overrides)
    return pb


@pytest.mark.parametrize("options", [dict(), dict(softcap=5.0, sinks=True), dict(window=(40, 0), q_lens=[6, 3])])
def test_splits_merge_the_biased_partials(options):
    """Decode and short prefill over 97-150 keys cut into up to 4 splits of 16-key tiles: each
    split's LSE carries the bias, the merge gives the reference (and the one-split result)."""
    pb = _paged(**options)
    pb["kv_lens"] = [max(n, q) for n, q in zip(pb["kv_lens"], pb["q_lens"])]
    got, lse, out_ref, lse_ref = result = run_paged(pb)
    check(result, torch.float32)
    one, one_lse, _, _ = run_paged({**pb, "num_splits": 1})
    assert_close(got, one.double(), torch.float32, what="split vs one split")
    check_lse(lse, one_lse.double().cpu(), torch.float32)


def test_zero_slopes_are_the_call_without_alibi():
    """``-0 * |i - j|`` adds nothing: zero slopes give the output and LSE of the call without ALiBi,
    bit for bit (scale inside the exponent or not: softcap moves it out)."""
    for softcap in (0.0, 5.0):
        gen = torch.Generator().manual_seed(1)
        heads, d = 8, 64
        k_cache = torch.randn(80, 4, 2, d, generator=gen).to(DEVICE)
        v_cache = torch.randn(80, 4, 2, d, generator=gen).to(DEVICE)
        table = torch.randperm(80, generator=gen)[:76].view(2, 38).to(torch.int32).to(DEVICE)
        q = torch.randn(5, heads, d, generator=gen).to(DEVICE)
        call = dict(cache_seqlens=torch.tensor([150, 97], dtype=torch.int32, device=DEVICE), page_table=table,
                    cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32, device=DEVICE), causal=True,
                    softcap=softcap, return_softmax_lse=True, num_splits=3)
        plain, plain_lse = flash_attn_with_kvcache(q, k_cache, v_cache, **call)
        zero, zero_lse = flash_attn_with_kvcache(q, k_cache, v_cache, alibi_slopes=torch.zeros(heads, device=DEVICE),
                                                 **call)
        assert torch.equal(zero.cpu(), plain.cpu()) and torch.equal(zero_lse.cpu(), plain_lse.cpu())


@st.composite
def varlen_problems(draw):
    batch = draw(st.integers(1, 3))
    q_lens = [draw(st.integers(0, 6)) for _ in range(batch)]
    k_lens = [draw(st.integers(0, 14)) for _ in range(batch)]
    causal = draw(st.booleans())
    return dict(
        dtype=draw(st.sampled_from(FLOAT_DTYPES)), batch=batch, group=draw(st.sampled_from([1, 2, 4, 6])),
        num_kv_heads=draw(st.integers(1, 2)), dims=draw(st.sampled_from([(32, 32), (64, 32)])), q_lens=q_lens,
        k_lens=k_lens, seqused_k=[draw(st.integers(0, n)) for n in k_lens] if draw(st.booleans()) else None,
        seqused_q=[draw(st.integers(0, n)) for n in q_lens] if draw(st.booleans()) else None, causal=causal,
        window=(draw(st.sampled_from([-1, -1, 0, 4])),
                draw(st.sampled_from([-1, 0])) if causal else draw(st.sampled_from([-1, 0, 3]))),
        softcap=draw(st.sampled_from([0.0, 0.0, 5.0])), slopes=draw(st.sampled_from(SLOPE_LAYOUTS)),
        layout=draw(st.sampled_from(["separate", "packed", "token_strided"])),
        num_splits=draw(st.sampled_from([0, 1, 2])), max_q=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
    )


@given(pb=varlen_problems())
def test_varlen_matches_reference(pb):
    gen = torch.Generator().manual_seed(pb["seed"])
    dtype, (d, dv) = pb["dtype"], pb["dims"]
    heads = pb["group"] * pb["num_kv_heads"]
    cu_q = torch.tensor([0] + torch.tensor(pb["q_lens"]).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(pb["k_lens"]).cumsum(0).tolist(), dtype=torch.int32)
    k, v = make_kv(int(cu_k[-1]) + 1, pb["num_kv_heads"], d, dv, dtype, pb["layout"], gen)
    q = torch.randn(int(cu_q[-1]), heads, d, generator=gen).to(dtype)
    slopes = make_slopes(pb["slopes"], pb["batch"], heads, gen)
    used_k, used_q = (None if pb[n] is None else torch.tensor(pb[n], dtype=torch.int32) for n in ("seqused_k",
                                                                                                  "seqused_q"))
    options = dict(causal=pb["causal"], window_size=pb["window"], softcap=pb["softcap"])
    out_ref, lse_ref = ref.varlen_attention(q, k, v, cu_q, cu_k, used_k, seqused_q=used_q, alibi_slopes=slopes,
                                            **options)
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    out = poison(torch.empty(q.shape[0], heads, dv, dtype=dtype, device=DEVICE))
    got, lse = flash_attn_varlen_func(
        to(q), to(k), to(v), to(cu_q), to(cu_k), max(pb["q_lens"]) if pb["max_q"] else None, max(pb["k_lens"]),
        seqused_q=to(used_q), seqused_k=to(used_k), num_splits=pb["num_splits"], return_softmax_lse=True, out=out,
        alibi_slopes=to(slopes), **options,
    )
    assert got is out
    check((got, lse, out_ref, lse_ref), dtype)


def _small_paged_call():
    """A 2-request, 4-head paged decode call (and its arguments) for argument checks."""
    gen = torch.Generator().manual_seed(2)
    k_cache = torch.randn(6, 4, 2, 32, generator=gen).to(DEVICE)
    q = torch.randn(2, 1, 4, 32, generator=gen).to(DEVICE)
    table = torch.tensor([[2, 0], [1, 4]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([3, 5], dtype=torch.int32, device=DEVICE)
    return lambda **kw: flash_attn_with_kvcache(q, k_cache, k_cache, cache_seqlens=lens, page_table=table, **kw)


@pytest.mark.parametrize("slopes, error, match", [
    (torch.ones(4, dtype=torch.float16), TypeError, "alibi_slopes must have dtype"),
    (torch.ones(4, dtype=torch.float64), TypeError, "alibi_slopes must have dtype"),
    ([0.5, 0.25, 0.125, 0.0625], TypeError, "alibi_slopes must be a torch.Tensor"),
    (torch.ones(5), ValueError, r"alibi_slopes must have shape \[4\] \(Hq\) or \[2, 4\]"),
    (torch.ones(3, 4), ValueError, "alibi_slopes must have shape"),
    (torch.ones(2, 4, 1), ValueError, "alibi_slopes must have shape"),
    (torch.ones(2, 2), ValueError, "alibi_slopes must have shape"),
])
def test_bad_slopes_raise_naming_the_argument(slopes, error, match):
    call = _small_paged_call()
    slopes = slopes.to(DEVICE) if isinstance(slopes, torch.Tensor) else slopes
    with pytest.raises(error, match=match):
        call(alibi_slopes=slopes)


def test_varlen_bad_slopes_raise():
    q = torch.randn(3, 4, 32, device=DEVICE)
    cu = torch.tensor([0, 3], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="alibi_slopes must have shape"):
        flash_attn_varlen_func(q, q[:, :2], q[:, :2], cu, cu, 3, 3, alibi_slopes=torch.ones(2, device=DEVICE))


@pytest.mark.skipif(torch.device(DEVICE).type == "cpu", reason="slopes on the host against a GPU call")
def test_slopes_on_another_device_raise():
    call = _small_paged_call()
    with pytest.raises(ValueError, match="alibi_slopes"):
        call(alibi_slopes=torch.ones(4))


# ---- the engines' calls and the custom ops ----


def _paged_case(seed=0):
    """Two requests (q_len 1 and 3 over 6 and 11 keys) on a 4-token-page cache, 4 query heads over
    2 KV heads, [B, Hq] slopes, and the float64 reference (causal)."""
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache = (torch.randn(7, 4, 2, 32, generator=gen) for _ in range(2))
    table = torch.tensor([[3, 1, 0], [2, 6, 4]], dtype=torch.int32)
    lens = torch.tensor([6, 11], dtype=torch.int32)
    cu = torch.tensor([0, 1, 4], dtype=torch.int32)
    q = torch.randn(4, 4, 32, generator=gen)
    slopes = torch.rand(2, 4, generator=gen)
    expected = ref.paged_attention(q, k_cache, v_cache, lens, table, cu, causal=True, alibi_slopes=slopes)
    args = [t.to(DEVICE) for t in (q, k_cache, v_cache, table, lens, cu, slopes)]
    return args, expected


def test_sgl_kernel_calls_pass_the_slopes():
    from triton_xpu_attn.compat.sgl_kernel import flash_attn as sgl

    (q, k_cache, v_cache, table, lens, cu, slopes), (out_ref, lse_ref) = _paged_case(1)
    out, lse, *_ = sgl.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, page_table=table,
                                               cu_seqlens_q=cu, max_seqlen_q=3, causal=True,
                                               return_softmax_lse=True, alibi_slopes=slopes)
    assert_close(out, out_ref, torch.float32)
    check_lse(lse, lse_ref, torch.float32)
    # the same keys as contiguous rows: flash_attn_varlen_func
    rows = [ref.gather_paged(k_cache.cpu(), table.cpu()[b], int(lens[b])) for b in range(2)]
    vrows = [ref.gather_paged(v_cache.cpu(), table.cpu()[b], int(lens[b])) for b in range(2)]
    cu_k = torch.tensor([0, 6, 17], dtype=torch.int32, device=DEVICE)
    out, lse, *_ = sgl.flash_attn_varlen_func(q, torch.cat(rows).to(DEVICE), torch.cat(vrows).to(DEVICE), cu, cu_k,
                                              3, 11, causal=True, return_softmax_lse=True, alibi_slopes=slopes)
    assert_close(out, out_ref, torch.float32)
    check_lse(lse, lse_ref, torch.float32)


def test_vllm_call_passes_the_slopes_paged_and_contiguous():
    from triton_xpu_attn.compat.vllm_xpu_kernels.flash_attn_interface import flash_attn_varlen_func as vllm

    (q, k_cache, v_cache, table, lens, cu, slopes), (out_ref, lse_ref) = _paged_case(2)
    out, lse = vllm(q, k_cache, v_cache, 3, cu, 11, seqused_k=lens, causal=True, block_table=table,
                    alibi_slopes=slopes, return_softmax_lse=True)
    assert_close(out, out_ref, torch.float32)
    check_lse(lse, lse_ref, torch.float32)
    rows = [ref.gather_paged(c.cpu(), table.cpu()[b], int(lens[b])) for c in (k_cache, v_cache) for b in range(2)]
    cu_k = torch.tensor([0, 6, 17], dtype=torch.int32, device=DEVICE)
    out = vllm(q, torch.cat(rows[:2]).to(DEVICE), torch.cat(rows[2:]).to(DEVICE), 3, cu, 11, cu_seqlens_k=cu_k,
               causal=True, alibi_slopes=slopes)
    assert_close(out, out_ref, torch.float32)


def test_vllm_latent_cache_with_slopes_stays_on_the_paged_kernel():
    """vLLM's MLA layout (V a view of K's first 512 channels) with slopes: the MLA kernels have no
    ALiBi, so the call stays on the paged kernel and equals the same call over a copy of V."""
    from triton_xpu_attn.compat.vllm_xpu_kernels.flash_attn_interface import flash_attn_varlen_func as vllm

    gen = torch.Generator().manual_seed(5)
    cache = torch.randn(4, 4, 1, 576, generator=gen).to(DEVICE)
    q = torch.randn(2, 4, 576, generator=gen).to(DEVICE)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([5, 7], dtype=torch.int32, device=DEVICE)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    out = vllm(q, cache, cache[..., :512], 1, cu, 7, seqused_k=lens, block_table=table, causal=True,
               alibi_slopes=slopes)
    expected = flash_attn_with_kvcache(q, cache, cache[..., :512].clone(), cache_seqlens=lens, page_table=table,
                                          cu_seqlens_q=cu, max_seqlen_q=1, causal=True, alibi_slopes=slopes)
    plain = flash_attn_with_kvcache(q, cache, cache[..., :512].clone(), cache_seqlens=lens, page_table=table,
                                       cu_seqlens_q=cu, max_seqlen_q=1, causal=True)
    assert_close(out, expected, torch.float32)
    assert not torch.allclose(out, plain, atol=1e-3)  # the slopes changed the result


def test_custom_ops_pass_the_slopes():
    (q, k_cache, v_cache, table, lens, cu, slopes), (out_ref, lse_ref) = _paged_case(3)
    out, lse = C.flash_attn_with_kvcache(q, k_cache, v_cache, lens, table, cu, 3, causal=True, return_softmax_lse=True,
                                         alibi_slopes=slopes)
    assert_close(out, out_ref, torch.float32)
    check_lse(lse, lse_ref, torch.float32)
    into = poison(torch.empty_like(out))
    lse = C.flash_attn_with_kvcache_out(q, k_cache, v_cache, lens, table, into, cu, 3, causal=True,
                                        return_softmax_lse=True, alibi_slopes=slopes)
    assert_close(into, out_ref, torch.float32)
    rows = [ref.gather_paged(c.cpu(), table.cpu()[b], int(lens[b])) for c in (k_cache, v_cache) for b in range(2)]
    cu_k = torch.tensor([0, 6, 17], dtype=torch.int32, device=DEVICE)
    out, _ = C.flash_attn_varlen_func(q, torch.cat(rows[:2]).to(DEVICE), torch.cat(rows[2:]).to(DEVICE), cu, cu_k, 3,
                                      11, causal=True, alibi_slopes=slopes)
    assert_close(out, out_ref, torch.float32)
    torch.library.opcheck(torch.ops.triton_xpu_attn.flash_attn_with_kvcache.default,
                          (q, k_cache, v_cache, lens, table, cu, 3), dict(causal=True, alibi_slopes=slopes))


@pytest.mark.skipif(INTERPRET, reason="GPU sizes: compiled kernels only")
@pytest.mark.parametrize("paged", [True, False])
def test_gpu_bf16_prefill_sizes(paged):
    """bf16 at prefill sizes (2 requests of 300 and 1 queries over 1000 and 517 keys, 16 query heads
    over 2 KV heads, D = 128), causal with BLOOM-style slopes, paged (16-token pages) and
    contiguous; the tuned tiles and splits of the device."""
    gen = torch.Generator().manual_seed(7)
    heads, d = 16, 128
    kv_lens = [1000, 517]
    cu = torch.tensor([0, 300, 301], dtype=torch.int32)  # 300 and 1 queries
    q = torch.randn(301, heads, d, generator=gen).to(torch.bfloat16)
    slopes = make_slopes("heads", 2, heads, gen)
    pages = [-(-n // 16) for n in kv_lens]
    k_cache, v_cache = (torch.randn(sum(pages) + 1, 16, 2, d, generator=gen).to(torch.bfloat16) for _ in range(2))
    table = torch.zeros(2, max(pages), dtype=torch.int32)
    table[0, : pages[0]] = torch.arange(1, pages[0] + 1)
    table[1, : pages[1]] = torch.arange(pages[0] + 1, sum(pages) + 1)
    lens = torch.tensor(kv_lens, dtype=torch.int32)
    out_ref, lse_ref = ref.paged_attention(q, k_cache, v_cache, lens, table, cu, causal=True, alibi_slopes=slopes,
                                           dtype=torch.float32)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    if paged:
        out, lse = flash_attn_with_kvcache(to(q), to(k_cache), to(v_cache), cache_seqlens=to(lens),
                                           page_table=to(table), cu_seqlens_q=to(cu), max_seqlen_q=300, causal=True,
                                           alibi_slopes=to(slopes), return_softmax_lse=True)
    else:
        rows = [ref.gather_paged(c, table[b], kv_lens[b]) for c in (k_cache, v_cache) for b in range(2)]
        cu_k = torch.tensor([0, 1000, 1517], dtype=torch.int32)
        out, lse = flash_attn_varlen_func(to(q), to(torch.cat(rows[:2])), to(torch.cat(rows[2:])), to(cu), to(cu_k),
                                          300, 1000, causal=True, alibi_slopes=to(slopes), return_softmax_lse=True)
    assert_close(out, out_ref, torch.bfloat16)
    check_lse(lse, lse_ref.double(), torch.bfloat16)


def test_vllm_host_slopes_are_copied_once_per_version():
    """vLLM keeps its slopes as a host tensor: the compat call copies them to q's device once per
    tensor and version (a graph replay must not copy from host memory), a changed tensor again."""
    from triton_xpu_attn.compat.vllm_xpu_kernels import flash_attn_interface as vllm_compat

    slopes = torch.tensor([0.5, 0.25])
    first = vllm_compat._slopes_on(slopes, DEVICE)
    assert first.device.type == torch.device(DEVICE).type and torch.equal(first.cpu(), slopes)
    assert vllm_compat._slopes_on(slopes, DEVICE) is first
    slopes.mul_(2)
    again = vllm_compat._slopes_on(slopes, DEVICE)
    assert torch.equal(again.cpu(), torch.tensor([1.0, 0.5]))
