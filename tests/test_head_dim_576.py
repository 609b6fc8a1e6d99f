"""Head dims past 512 (D in (512, 576], Dv <= 512: MLA's 512 latent + 64 rope channels with V the
first 512): the paged kernel's tail chunk of the score dot (``D_TAIL``), the latent-cache route of
``flash_attn_with_kvcache`` onto the MLA kernels, and vLLM's MLA call through
``flash_attn_varlen_func``; all against the float64 reference."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import DEVICE, FLOAT_DTYPES, INTERPRET, assert_close, poison
from triton_xpu_attn import flash_attn_varlen_func, flash_attn_with_kvcache
from triton_xpu_attn import reference as ref
from triton_xpu_attn import tune
from triton_xpu_attn.ops import paged_latent

#: the head dims past 512 the paged kernel takes
WIDE_DIMS = list(range(520, 577, 8))
#: K/V loads a config may ask for under every Triton here: pointers (the CUDA default), device-side
#: tensor descriptors whole or in head-dim chunks (the XPU path; the interpreter runs them)
KV_CONFIGS = {
    "pointer": {},
    "device_desc": dict(kv_device_desc=True),
    "device_desc_chunks": dict(kv_device_desc=True, score_chunk=32),
    "device_desc_chunks_one_head": dict(kv_device_desc=True, score_chunk=64, pack_gqa=False, BLOCK_DV=256),
}


def check_lse(lse, lse_ref):
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse.cpu()), finite), "LSE: -inf where the reference is finite or back"
    assert (lse.cpu().double()[finite] - lse_ref[finite]).abs().max().item() < 1e-2, "LSE differs"


def _cache(num_pages, page_size, hkv, d, dv, dtype, v_view, gen):
    """K ``[pages, P, H_kv, D]`` and V: a narrowed, non-contiguous view of K's first Dv channels
    (``v_view``: one storage, vLLM's MLA layout) or a cache of its own."""
    k = torch.randn(num_pages, page_size, hkv, d, generator=gen).to(dtype)
    v = k[..., :dv] if v_view else torch.randn(num_pages, page_size, hkv, dv, generator=gen).to(dtype)
    return k, v


@st.composite
def wide_problems(draw):
    batch = draw(st.integers(1, 2))
    hkv = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2, 3]))
    d = draw(st.sampled_from(WIDE_DIMS))
    dv = draw(st.sampled_from([8, 64, 136, 512]))
    page_size = draw(st.sampled_from([1, 4, 16]))
    q_lens = [draw(st.integers(1, 4)) for _ in range(batch)]
    kv_lens = [q + draw(st.integers(0, 30)) for q in q_lens]
    return dict(batch=batch, hkv=hkv, hq=hkv * group, d=d, dv=min(dv, d), page_size=page_size, q_lens=q_lens,
                kv_lens=kv_lens, causal=draw(st.booleans()), v_view=draw(st.booleans()),
                dtype=draw(st.sampled_from(FLOAT_DTYPES)), kv=draw(st.sampled_from(sorted(KV_CONFIGS))),
                window=draw(st.sampled_from([(-1, -1), (7, 0)])), splits=draw(st.sampled_from([0, 1, 3])),
                seed=draw(st.integers(0, 2**16)))


@settings(max_examples=max(20, settings().max_examples))
@given(pb=wide_problems())
def test_paged_matches_reference(pb):
    """Decode, drafts and chunked prefill at D in 520..576 over any Dv <= 512 (V a narrowed view
    of K's storage or a cache of its own), GQA, page sizes, windows, KV splits and every K/V load,
    against the float64 reference; output poisoned first."""
    gen = torch.Generator().manual_seed(pb["seed"])
    dtype, page = pb["dtype"], pb["page_size"]
    pages_per = -(-max(pb["kv_lens"]) // page)
    num_pages = pb["batch"] * pages_per + 1
    k, v = _cache(num_pages, page, pb["hkv"], pb["d"], pb["dv"], dtype, pb["v_view"], gen)
    table = torch.randperm(num_pages, generator=gen)[: pb["batch"] * pages_per].view(pb["batch"], pages_per).int()
    cu = torch.tensor([0] + pb["q_lens"], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    q = torch.randn(int(cu[-1]), pb["hq"], pb["d"], generator=gen).to(dtype)
    seqlens = torch.tensor(pb["kv_lens"], dtype=torch.int32)
    out = poison(torch.empty(q.shape[0], pb["hq"], pb["dv"], dtype=dtype, device=DEVICE))
    config = dict(BLOCK_N=16, BLOCK_M=16, **KV_CONFIGS[pb["kv"]])
    with tune.override("paged_attention", config):
        got, lse = flash_attn_with_kvcache(
            q.to(DEVICE), k.to(DEVICE), v.to(DEVICE) if not pb["v_view"] else k.to(DEVICE)[..., : pb["dv"]],
            cache_seqlens=seqlens.to(DEVICE), page_table=table.to(DEVICE), cu_seqlens_q=cu.to(DEVICE),
            max_seqlen_q=max(pb["q_lens"]), causal=pb["causal"], window_size=pb["window"], num_splits=pb["splits"],
            return_softmax_lse=True, out=out)
    out_ref, lse_ref = ref.paged_attention(q, k, v, seqlens, table, cu, causal=pb["causal"], window_size=pb["window"])
    assert got is out
    assert_close(got, out_ref, dtype)
    check_lse(lse, lse_ref)


@pytest.mark.parametrize("kv", sorted(KV_CONFIGS))
@pytest.mark.parametrize("d,dv", [(576, 512), (520, 264)])
def test_varlen_contiguous_kv(kv, d, dv):
    """``flash_attn_varlen_func`` (contiguous K/V) at D past 512, V a narrowed view of K's rows."""
    gen = torch.Generator().manual_seed(d + dv)
    lens_q, lens_k = [3, 5], [9, 6]
    kv_rows = torch.randn(sum(lens_k), 2, d, generator=gen)
    k, v = kv_rows, kv_rows[..., :dv]
    q = torch.randn(sum(lens_q), 4, d, generator=gen)
    cu_q = torch.tensor([0, lens_q[0], sum(lens_q)], dtype=torch.int32)
    cu_k = torch.tensor([0, lens_k[0], sum(lens_k)], dtype=torch.int32)
    sinks = torch.randn(4, generator=gen)
    with tune.override("paged_attention", dict(BLOCK_N=16, BLOCK_M=16, **KV_CONFIGS[kv])):
        got, lse = flash_attn_varlen_func(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cu_q.to(DEVICE), cu_k.to(DEVICE),
                                          max(lens_q), max(lens_k), causal=True, sinks=sinks.to(DEVICE),
                                          return_softmax_lse=True)
    out_ref, lse_ref = ref.varlen_attention(q, k, v, cu_q, cu_k, causal=True, sinks=sinks)
    assert_close(got, out_ref, torch.float32)
    check_lse(lse, lse_ref)


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("v_view", [True, False])
def test_fp8_cache(fp8, v_view):
    """An fp8 cache at D = 576, Dv = 512 with K / V descales (per request and KV head): the paged
    kernel (the latent route takes caches in q's dtype only)."""
    fp8 = getattr(torch, fp8)
    gen = torch.Generator().manual_seed(5)
    k, v = _cache(5, 16, 1, 576, 512, torch.float32, v_view, gen)
    k = (k * 4).to(fp8)
    v = k[..., :512] if v_view else (v * 4).to(fp8)
    q = torch.randn(2, 1, 3, 576, generator=gen).half()
    table = torch.tensor([[1, 3], [2, 4]], dtype=torch.int32)
    seqlens = torch.tensor([30, 17], dtype=torch.int32)
    k_scale, v_scale = torch.rand(2, 1, generator=gen) + 0.1, torch.rand(2, 1, generator=gen) + 0.1
    got = flash_attn_with_kvcache(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cache_seqlens=seqlens.to(DEVICE),
                                  page_table=table.to(DEVICE), k_descale=k_scale.to(DEVICE),
                                  v_descale=v_scale.to(DEVICE), num_splits=2)
    out_ref, _ = ref.paged_attention(q, k, v, seqlens, table, k_descale=k_scale, v_descale=v_scale)
    assert_close(got, out_ref, torch.float16)


def _latent_case(gen, q_lens, kv_lens, heads=4, page_size=4, dtype=torch.float32):
    """vLLM's MLA inputs: q = [q_nope, q_pe] (576 channels), the latent cache ``[pages, P, 1, 576]``
    and V its non-contiguous narrow view ``cache[..., :512]``."""
    pages_per = -(-max(kv_lens) // page_size)
    num_pages = len(kv_lens) * pages_per + 2
    cache = torch.randn(num_pages, page_size, 576, generator=gen).to(dtype).unsqueeze(-2)
    table = torch.randperm(num_pages, generator=gen)[: len(kv_lens) * pages_per].view(len(kv_lens), pages_per).int()
    q = torch.cat([torch.randn(sum(q_lens), heads, 512, generator=gen), torch.randn(sum(q_lens), heads, 64, generator=gen)],
                  dim=-1).to(dtype)
    cu = torch.tensor([0] + list(q_lens), dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return q, cache, table, cu, torch.tensor(kv_lens, dtype=torch.int32)


@pytest.fixture
def mla_calls(monkeypatch):
    """Counts of the MLA kernels the latent route called."""
    calls = {"decode": 0, "prefill": 0}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(paged_latent, "flash_mla_decode", spy("decode", paged_latent.flash_mla_decode))
    monkeypatch.setattr(paged_latent, "flash_mla_prefill", spy("prefill", paged_latent.flash_mla_prefill))
    return calls


@pytest.mark.parametrize("q_lens,causal,four_d,splits", [
    ((1, 1), False, False, 0), ((1, 1), False, True, 3), ((3, 3), True, True, 1), ((3, 3), False, True, 0),
    ((1, 4), True, False, 0), ((2, 5), False, False, 1),
])
def test_latent_cache_takes_the_mla_kernels(mla_calls, q_lens, causal, four_d, splits):
    """The latent layout (one KV head, V = K's first 512 channels) runs on flash_mla_decode (one
    query a request; 4-D causal drafts) or flash_mla_prefill (ragged, non-causal drafts), with
    the paged kernel's results, LSE layout and ``out``."""
    gen = torch.Generator().manual_seed(sum(q_lens) + causal)
    q, cache, table, cu, seqlens = _latent_case(gen, q_lens, (9, 13))
    if four_d and len(set(q_lens)) == 1:
        q_in, call = q.view(2, q_lens[0], 4, 576), {}
    else:
        q_in, call = q, dict(cu_seqlens_q=cu.to(DEVICE), max_seqlen_q=max(q_lens))
    out = poison(torch.empty(q.shape[0], 4, 512, device=DEVICE))
    cache_d = cache.to(DEVICE)  # one device copy: V must be a view of K's storage
    got, lse = flash_attn_with_kvcache(q_in.to(DEVICE), cache_d, cache_d[..., :512],
                                       cache_seqlens=seqlens.to(DEVICE), page_table=table.to(DEVICE), causal=causal,
                                       num_splits=splits, return_softmax_lse=True, out=out, **call)
    out_ref, lse_ref = ref.paged_attention(q, cache, cache[..., :512], seqlens, table, cu, causal=causal)
    assert got is out
    assert_close(got, out_ref, torch.float32)
    check_lse(lse, lse_ref)
    assert lse.shape == (4, q.shape[0])
    assert mla_calls["decode"] + mla_calls["prefill"] == 1
    assert mla_calls["decode"] == int(max(q_lens) == 1 or (four_d and causal))


@pytest.mark.parametrize("option", ["window_size", "softcap", "sinks", "page_512", "two_heads", "other_storage"])
def test_latent_options_the_mla_kernels_lack_stay_on_the_paged_kernel(mla_calls, option):
    """Windows, soft-capping, sinks, pages past 256 tokens, two KV heads or a V of its own storage:
    the paged kernel (D = 576 with its tail chunk), never the MLA kernels."""
    gen = torch.Generator().manual_seed(17)
    page = 512 if option == "page_512" else 4
    q, cache, table, cu, seqlens = _latent_case(gen, (1, 2), (9, 13), page_size=page)
    if option == "two_heads":
        cache = torch.cat([cache, torch.randn(cache.shape, generator=gen)], dim=2)
    v = cache.clone()[..., :512] if option == "other_storage" else cache[..., :512]
    kwargs = dict(window_size=(5, 0)) if option == "window_size" else dict(softcap=3.0) if option == "softcap" else {}
    sinks = torch.randn(4, generator=gen) if option == "sinks" else None
    got = flash_attn_with_kvcache(q.to(DEVICE), cache.to(DEVICE), v.to(DEVICE), cache_seqlens=seqlens.to(DEVICE),
                                  page_table=table.to(DEVICE), cu_seqlens_q=cu.to(DEVICE), max_seqlen_q=2, causal=True,
                                  sinks=sinks.to(DEVICE) if sinks is not None else None, **kwargs)
    out_ref, _ = ref.paged_attention(q, cache, v, seqlens, table, cu, causal=True, sinks=sinks, **kwargs)
    assert_close(got, out_ref, torch.float32)
    assert mla_calls == {"decode": 0, "prefill": 0}


@pytest.mark.parametrize("query_lens,kv_lens", [((1, 1, 1), (5, 12, 16)), ((1,), (9,)), ((1, 3), (7, 12))])
def test_vllm_mla_call_through_varlen(mla_calls, query_lens, kv_lens):
    """vLLM's XPU MLA backend call (vllm-xpu-kernels' test_mla_decode layout): q = [q_nope, q_pe],
    k the ``[blocks, block_size, 1, 576]`` latent cache, v its narrow view (non-contiguous rows),
    block_table + seqused_k, not causal, softmax scale 576 ** -0.5."""
    from triton_xpu_attn.compat.vllm_xpu_kernels.flash_attn_interface import flash_attn_varlen_func as vllm_varlen

    gen = torch.Generator().manual_seed(len(query_lens))
    q, cache, table, cu, seqlens = _latent_case(gen, query_lens, kv_lens, heads=8, page_size=4)
    cache_d = cache.to(DEVICE)  # one device copy: V must be a view of K's storage
    v = cache_d.narrow(-1, 0, 512)
    assert v.stride(-1) == 1 and v.stride(-2) == 576 and not v.is_contiguous()
    got = vllm_varlen(q.to(DEVICE), cache_d, v, max_seqlen_q=max(query_lens), cu_seqlens_q=cu.to(DEVICE),
                      max_seqlen_k=max(kv_lens), seqused_k=seqlens.to(DEVICE), block_table=table.to(DEVICE),
                      softmax_scale=576**-0.5, causal=False, fa_version=2)
    out_ref, _ = ref.paged_attention(q, cache, cache[..., :512], seqlens, table, cu, softmax_scale=576**-0.5)
    assert_close(got, out_ref, torch.float32)
    assert mla_calls["decode" if max(query_lens) == 1 else "prefill"] == 1


@pytest.mark.parametrize("d,dv,match", [(584, 512, "head dim D must be a multiple of 8 from 8 to 576"),
                                        (576, 520, "value head dim Dv must be a multiple of 8 from 8 to 512"),
                                        (572, 512, "head dim D must be a multiple of 8")])
def test_rejects_head_dims_past_the_limits(d, dv, match):
    q = torch.zeros(2, 2, d, device=DEVICE)
    k = torch.zeros(3, 16, 1, d, device=DEVICE)
    v = torch.zeros(3, 16, 1, dv, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        flash_attn_with_kvcache(q, k, v, cache_seqlens=torch.ones(2, dtype=torch.int32, device=DEVICE),
                                page_table=torch.zeros(2, 1, dtype=torch.int32, device=DEVICE),
                                cu_seqlens_q=torch.arange(3, dtype=torch.int32, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="compiled shapes")
@pytest.mark.parametrize("heads,page_size", [(16, 64), (128, 1), (16, 16)])
@pytest.mark.parametrize("latent", [True, False])
def test_gpu_mla_decode_shapes(heads, page_size, latent):
    """DeepSeek's decode shapes in bf16 (vLLM TP8 and TP1 head counts): the latent route and the
    paged kernel's D = 576 tiles (V a copy of K's first 512 channels), against float64."""
    gen = torch.Generator().manual_seed(heads + page_size)
    kv_lens = (37, 1024, 333, 129)
    q, cache, table, cu, seqlens = _latent_case(gen, (1,) * 4, kv_lens, heads=heads, page_size=page_size,
                                                dtype=torch.bfloat16)
    v = cache[..., :512] if latent else cache[..., :512].contiguous()
    c = cache.to(DEVICE)
    vd = c[..., :512] if latent else v.to(DEVICE)
    got = flash_attn_with_kvcache(q.to(DEVICE), c, vd, cache_seqlens=seqlens.to(DEVICE), page_table=table.to(DEVICE),
                                  cu_seqlens_q=cu.to(DEVICE), max_seqlen_q=1, softmax_scale=576**-0.5)
    out_ref, _ = ref.paged_attention(q, cache, v, seqlens, table, cu, softmax_scale=576**-0.5)
    assert_close(got, out_ref, torch.bfloat16)
