import contextlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import DEVICE, FLOAT_DTYPES, KV_LOADS, assert_close, head_dim_pairs, invisible_slots, kv_load_config, poison
from triton_xpu_attn import flash_attn_varlen_func, flash_attn_with_kvcache
from triton_xpu_attn import reference as ref
from triton_xpu_attn import device as _device
from triton_xpu_attn import tune
from triton_xpu_attn._common import whole_wave_splits

PAGE_SIZES = [2**i for i in range(12)]  # 1 to 2048
GROUPS = [1, 2, 3, 4, 5, 6, 7, 8, 12]


def make_paged_cache(num_pages, page_size, num_kv_heads, head_dim, head_dim_v, dtype, layout, gen):
    """K and V caches with the layout a serving engine may hand us.

    contiguous: two separate buffers; combined: K and V as slices of one [pages, P, 2, H, D]
    buffer (vllm-xpu-kernels PR 165); layered: one layer of a [layers, pages, P, H, D] pool;
    padded: head stride wider than D.
    """
    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    if layout == "combined" and head_dim == head_dim_v:
        buf = randn(num_pages, page_size, 2, num_kv_heads, head_dim)
        return buf[:, :, 0], buf[:, :, 1]
    if layout == "layered":
        k = randn(3, num_pages, page_size, num_kv_heads, head_dim)[1]
        v = randn(3, num_pages, page_size, num_kv_heads, head_dim_v)[2]
        return k, v
    if layout == "padded":
        k = randn(num_pages, page_size, num_kv_heads, head_dim + 16)[..., :head_dim]
        v = randn(num_pages, page_size, num_kv_heads, head_dim_v + 8)[..., 8:]
        return k, v
    return randn(num_pages, page_size, num_kv_heads, head_dim), randn(num_pages, page_size, num_kv_heads, head_dim_v)


@st.composite
def attention_problems(draw, max_batch=3, max_q=6, max_ctx=40):
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    batch = draw(st.integers(1, max_batch))
    group = draw(st.sampled_from(GROUPS))
    num_kv_heads = draw(st.integers(1, 2))
    head_dim, head_dim_v = draw(head_dim_pairs())
    page_size = draw(st.sampled_from(PAGE_SIZES))
    decode = draw(st.booleans())
    q_lens = [1 if decode else draw(st.integers(0, max_q)) for _ in range(batch)]
    ctx = [draw(st.integers(0, max_ctx)) for _ in range(batch)]
    kv_lens = [c + q for c, q in zip(ctx, q_lens)]
    if not decode and draw(st.booleans()):
        kv_lens[0] = q_lens[0] = 0  # an empty request
    causal = draw(st.booleans())
    left = draw(st.sampled_from([-1, -1, 0, 3, 17]))
    right = draw(st.sampled_from([-1, -1, 0, 2])) if not causal else draw(st.sampled_from([-1, 0]))
    return dict(
        dtype=dtype, batch=batch, group=group, num_kv_heads=num_kv_heads, head_dim=head_dim, head_dim_v=head_dim_v,
        page_size=page_size, q_lens=q_lens, kv_lens=kv_lens, causal=causal, window=(left, right),
        softcap=draw(st.sampled_from([0.0, 0.0, 5.0])),
        sinks=draw(st.booleans()),
        layout=draw(st.sampled_from(["contiguous", "combined", "layered", "padded"])),
        num_splits=draw(st.sampled_from([0, 0, 1, 2, 5])),
        four_d=decode and draw(st.booleans()),
        give_max_seqlen_q=draw(st.booleans()),
        extra_pages=draw(st.integers(0, 3)),
        seed=draw(st.integers(0, 2**16)),
    )


def run_problem(pb, device=DEVICE, invisible=None):
    """Build the problem ``pb`` (see ``attention_problems``), run it, and return ``(got, lse, out,
    out_ref, lse_ref)``. ``invisible``: a value (NaN, inf) written, after the reference is
    computed, into every cache slot no query may see."""
    gen = torch.Generator().manual_seed(pb["seed"])
    dtype, page_size = pb["dtype"], pb["page_size"]
    num_q_heads = pb["group"] * pb["num_kv_heads"]
    pages_per_req = [-(-n // page_size) for n in pb["kv_lens"]]
    max_pages = max(pages_per_req + [1]) + pb["extra_pages"]
    num_pages = sum(pages_per_req) + 2
    k_cache, v_cache = make_paged_cache(
        num_pages, page_size, pb["num_kv_heads"], pb["head_dim"], pb["head_dim_v"], dtype, pb["layout"], gen
    )
    # a random permutation of physical pages; unused table entries point at page 0 (sglang's dummy)
    perm = torch.randperm(num_pages - 1, generator=gen) + 1
    page_table = torch.zeros(pb["batch"], max_pages, dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages_per_req):
        page_table[b, :n] = perm[used : used + n]
        used += n
    cu = torch.tensor([0] + torch.tensor(pb["q_lens"]).cumsum(0).tolist(), dtype=torch.int32)
    total_q = int(cu[-1])
    q = torch.randn(total_q, num_q_heads, pb["head_dim"], generator=gen).to(dtype)
    sinks = torch.randn(num_q_heads, generator=gen) if pb["sinks"] else None
    seqlens = torch.tensor(pb["kv_lens"], dtype=torch.int32)
    kwargs = dict(causal=pb["causal"], window_size=pb["window"], softcap=pb["softcap"], sinks=sinks)
    out_ref, lse_ref = ref.paged_attention(q, k_cache, v_cache, seqlens, page_table, cu, **kwargs)
    if invisible is not None:
        slots = invisible_slots(num_pages, page_size, page_table, pb["q_lens"], pb["kv_lens"], pb["causal"], pb["window"])
        k_cache[slots] = invisible
        v_cache[slots] = invisible

    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    out = poison(torch.empty(total_q, num_q_heads, pb["head_dim_v"], dtype=dtype, device=device))
    call = dict(
        cache_seqlens=to(seqlens), page_table=to(page_table), return_softmax_lse=True, out=out,
        num_splits=pb["num_splits"], **{**kwargs, "sinks": to(sinks)},
    )
    if pb["four_d"]:
        q_in = q.reshape(pb["batch"], 1, num_q_heads, pb["head_dim"])
    else:
        q_in = q
        call["cu_seqlens_q"] = to(cu)
        if pb["give_max_seqlen_q"]:
            call["max_seqlen_q"] = max(pb["q_lens"])
    got, lse = flash_attn_with_kvcache(to(q_in), to(k_cache), to(v_cache), **call)
    return got, lse, out, out_ref, lse_ref


def check_lse(lse, lse_ref, dtype):
    lse = lse.cpu().double()
    assert not torch.isnan(lse).any()
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite), "LSE must be -inf exactly where a row sees no key"
    if finite.any():
        err = (lse[finite] - lse_ref[finite]).abs().max().item()
        assert err < (1e-4 if dtype == torch.float32 else 2e-2), f"LSE error {err}"


@given(pb=attention_problems())
def test_matches_reference(pb):
    got, lse, out, out_ref, lse_ref = run_problem(pb)
    assert got is out
    assert not torch.isnan(got).any(), "unwritten (poisoned) or NaN output"
    assert_close(got, out_ref, pb["dtype"])
    check_lse(lse, lse_ref, pb["dtype"])


@st.composite
def short_tile_problems(draw):
    """Several query rows per program over many short key tiles: windows, causal limits and splits
    put masked tiles before and after the tiles every row sees whole."""
    batch = draw(st.integers(1, 2))
    q_lens = [draw(st.integers(2, 12)) for _ in range(batch)]
    # lengths just past a multiple of 32 (so of 16 too): a tile boundary falls among the last
    # query rows' positions, where the first row's causal / right-window limit cuts a tile
    kv_lens = [max(q, 32 * draw(st.integers(1, 3)) + draw(st.integers(0, q))) for q in q_lens]
    limits = draw(st.sampled_from(["causal", "causal+left", "right", "left+right", "left", "none"]))
    causal = limits.startswith("causal")
    left = draw(st.sampled_from([0, 5, 17, 33])) if "left" in limits else -1
    right = draw(st.sampled_from([0, 2, 9])) if "right" in limits else -1
    return dict(
        dtype=draw(st.sampled_from([torch.float32, torch.float16])), batch=batch,
        group=draw(st.sampled_from([1, 2, 4])), num_kv_heads=1, head_dim=64, head_dim_v=64,
        page_size=draw(st.sampled_from([1, 4, 16, 32, 64])), q_lens=q_lens, kv_lens=kv_lens,
        causal=causal, window=(left, right),
        softcap=draw(st.sampled_from([0.0, 5.0])), sinks=draw(st.booleans()),
        layout=draw(st.sampled_from(["contiguous", "combined"])), num_splits=draw(st.sampled_from([0, 1, 3])),
        four_d=False, give_max_seqlen_q=draw(st.booleans()), extra_pages=0, seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=max(60, settings().max_examples))  # cheap examples; each mask boundary needs its own draw
@given(pb=short_tile_problems(), block_n=st.sampled_from([16, 32, 64]), kv_load=st.sampled_from(KV_LOADS))
def test_short_key_tiles_mask_exactly_the_tiles_a_row_does_not_see_whole(pb, block_n, kv_load):
    """Key tiles that every query row of a program sees whole skip the element mask; 16- and
    32-key tiles make such tiles at test lengths (the built-in 64+-key tiles leave none). With
    descriptors, pages of whole tiles load K/V through tensor descriptors (the prefill path on
    Hopper), edge tiles through masked pointers; with block pointers (the XPU path) every tile
    inside a page does (pages shorter than the tile keep the gathers)."""
    with tune.override("paged_attention", dict(BLOCK_N=block_n, BLOCK_M=16, **kv_load_config(kv_load))):
        got, lse, out, out_ref, lse_ref = run_problem(pb)
    assert not torch.isnan(got).any(), "unwritten (poisoned) or NaN output"
    assert_close(got, out_ref, pb["dtype"])
    check_lse(lse, lse_ref, pb["dtype"])


@pytest.mark.parametrize("resident, expected", [(None, 8), (64, 8), (4, 8), (6, 6), (7, 7)])
def test_automatic_splits_fill_whole_waves(monkeypatch, resident, expected):
    """The automatic split count drops a partial last wave of the programs the device runs at
    once (``device.resident_programs``, stubbed here: the interpreter has no occupancy), and the
    output is the same attention."""
    from triton_xpu_attn import device as _device
    from triton_xpu_attn.ops import paged_launch as pa

    used = []
    real_combine = pa.combine_splits
    monkeypatch.setattr(pa, "combine_splits", lambda po, *a, **k: (used.append(po.shape[2]), real_combine(po, *a, **k)))
    monkeypatch.setattr(_device, "resident_programs", lambda compile_kernel, device=None: resident)
    # 4 compute units everywhere (the interpreter's count; a GPU's would change the split count)
    monkeypatch.setattr(_device, "compute_units", lambda device=None: 4)
    monkeypatch.setattr(pa, "_RESIDENT_PROGRAMS", {})
    pb = dict(
        dtype=torch.float32, batch=2, group=2, num_kv_heads=1, head_dim=64, head_dim_v=64, page_size=4,
        q_lens=[1, 1], kv_lens=[160, 131], causal=True, window=(-1, -1), softcap=0.0, sinks=False,
        layout="contiguous", num_splits=0, four_d=True, give_max_seqlen_q=False, extra_pages=0, seed=3,
    )
    # 2 programs a split (2 requests x 1 KV head); 16-key splits and tiles, 4 waves of 4
    # compute units: 8 splits before the cut
    with tune.override("paged_attention", dict(BLOCK_N=16, min_split_tokens=16, waves=4)):
        got, lse, _, out_ref, lse_ref = run_problem(pb)
    # 16 programs: unknown occupancy or one wave of 64 keep 8 splits, as do 4 whole waves of 4;
    # of 6 at once, 2 whole waves hold 12 programs = 6 splits; of 7, 14 programs = 7 splits
    assert expected == whole_wave_splits(8, 2, resident)
    assert used == [expected]
    assert_close(got, out_ref, torch.float32)
    check_lse(lse, lse_ref, torch.float32)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_every_page_size_decode_and_prefill(page_size):
    for decode in (True, False):
        pb = dict(
            dtype=torch.float32, batch=2, group=4, num_kv_heads=2, head_dim=64, head_dim_v=64, page_size=page_size,
            q_lens=[1, 1] if decode else [5, 2], kv_lens=[37, 9], causal=True, window=(-1, -1), softcap=0.0,
            sinks=False, layout="contiguous", num_splits=0 if decode else 1, four_d=False, give_max_seqlen_q=True,
            extra_pages=1, seed=page_size,
        )
        got, lse, _, out_ref, lse_ref = run_problem(pb)
        assert_close(got, out_ref, torch.float32)
        check_lse(lse, lse_ref, torch.float32)


def test_window_with_sinks_and_softcap_with_window():
    # the two bugs of the vllm-xpu-kernels reference: NaN with window + sinks, softcap after the mask
    for softcap, sinks in ((0.0, True), (2.0, False), (2.0, True)):
        pb = dict(
            dtype=torch.float32, batch=2, group=2, num_kv_heads=1, head_dim=64, head_dim_v=64, page_size=4,
            q_lens=[3, 1], kv_lens=[30, 22], causal=True, window=(4, 0), softcap=softcap, sinks=sinks,
            layout="contiguous", num_splits=3, four_d=False, give_max_seqlen_q=False, extra_pages=0, seed=1,
        )
        got, lse, _, out_ref, lse_ref = run_problem(pb)
        assert_close(got, out_ref, torch.float32)
        check_lse(lse, lse_ref, torch.float32)


def test_reference_hand_example():
    # one query, two keys with logits 0 and log(3) (scale 1): weights 1/4 and 3/4
    q = torch.tensor([[[1.0, 0.0]]])
    k = torch.tensor([[[[0.0, 0.0]], [[math.log(3), 0.0]]]])  # [1 page, 2 tokens, 1 head, 2]
    v = torch.tensor([[[[4.0, 0.0]], [[8.0, 4.0]]]])
    out, lse = ref.paged_attention(
        q, k, v, torch.tensor([2]), torch.tensor([[0]]), torch.tensor([0, 1]), softmax_scale=1.0
    )
    assert torch.allclose(out, torch.tensor([[[7.0, 3.0]]], dtype=torch.float64))
    assert lse.item() == pytest.approx(math.log(4))
    # a sink with logit log(4) joins the denominator only: weights 1/8 and 3/8
    out, lse = ref.paged_attention(
        q, k, v, torch.tensor([2]), torch.tensor([[0]]), torch.tensor([0, 1]), softmax_scale=1.0,
        sinks=torch.tensor([math.log(4)]),
    )
    assert torch.allclose(out, torch.tensor([[[3.5, 1.5]]], dtype=torch.float64))
    assert lse.item() == pytest.approx(math.log(8))
    # window (0, 0) with causal: the last query sees only itself; the first of 2 queries sees key 0
    out, _ = ref.paged_attention(
        torch.ones(2, 1, 2), k, v, torch.tensor([2]), torch.tensor([[0]]), torch.tensor([0, 2]), causal=True,
        window_size=(0, 0),
    )
    assert torch.allclose(out[:, 0], torch.tensor([[4.0, 0.0], [8.0, 4.0]], dtype=torch.float64))
    # softcap before masking: a capped logit still loses to a masked one (-inf), never becomes -cap
    mask = ref.visible_keys(2, 5, causal=True, window_size=(1, 0))
    assert mask.tolist() == [[False, False, True, True, False], [False, False, False, True, True]]


def test_zero_length_and_padding_rows_are_defined():
    # request 1 has no keys; rows 3..4 of q lie past cu_seqlens_q[-1] (padding of a ragged batch)
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(4, 16, 1, 64, generator=gen)
    v = torch.randn(4, 16, 1, 64, generator=gen)
    q = torch.randn(5, 2, 64, generator=gen)
    cu = torch.tensor([0, 2, 3], dtype=torch.int32)
    seqlens = torch.tensor([20, 0], dtype=torch.int32)
    table = torch.tensor([[1, 2], [0, 0]], dtype=torch.int32)
    for splits in (1, 3):
        out = poison(torch.empty(5, 2, 64, device=DEVICE))
        got, lse = flash_attn_with_kvcache(
            q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cache_seqlens=seqlens.to(DEVICE), page_table=table.to(DEVICE),
            cu_seqlens_q=cu.to(DEVICE), return_softmax_lse=True, out=out, num_splits=splits,
            sinks=torch.ones(2, device=DEVICE),
        )
        got, lse = got.cpu(), lse.cpu()
        assert torch.equal(got[2:], torch.zeros(3, 2, 64))
        assert torch.isneginf(lse[:, 2:]).all()
        out_ref, _ = ref.paged_attention(q[:3], k, v, seqlens, table, cu, sinks=torch.ones(2))
        assert_close(got[:3], out_ref, torch.float32)


def test_default_output_allocation_and_4d_q():
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(6, 8, 2, 64, generator=gen).half()
    v = torch.randn(6, 8, 2, 64, generator=gen).half()
    q = torch.randn(2, 3, 4, 64, generator=gen).half()  # [B, S, Hq, D]: 3 draft tokens per request
    seqlens = torch.tensor([12, 20], dtype=torch.int32)
    table = torch.tensor([[5, 1, 0], [2, 3, 4]], dtype=torch.int32)
    got = flash_attn_with_kvcache(
        q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cache_seqlens=seqlens.to(DEVICE), page_table=table.to(DEVICE),
        causal=True,
    )
    assert got.shape == (6, 4, 64) and got.dtype == torch.float16
    out_ref, _ = ref.paged_attention(q, k, v, seqlens, table, causal=True)
    assert_close(got, out_ref, torch.float16)


def test_int_cache_seqlens_and_scalar_descale():
    gen = torch.Generator().manual_seed(4)
    k = torch.randn(3, 16, 1, 64, generator=gen)
    v = torch.randn(3, 16, 1, 64, generator=gen)
    q = torch.randn(2, 1, 2, 64, generator=gen)
    table = torch.tensor([[1], [2]], dtype=torch.int32)
    got = flash_attn_with_kvcache(
        q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cache_seqlens=16, page_table=table.to(DEVICE), k_descale=0.5,
        v_descale=torch.tensor(2.0, device=DEVICE),
    )
    out_ref, _ = ref.paged_attention(q, k, v, torch.tensor([16, 16]), table, k_descale=0.5, v_descale=2.0)
    assert_close(got, out_ref, torch.float32)


@pytest.mark.skipif(not _device.block_pointers(), reason="block pointers need Triton < 3.9 (compiled runs)")
@settings(max_examples=max(30, settings().max_examples))
@given(pb=attention_problems(), chunk=st.sampled_from([16, 32, 64]), pack_gqa=st.booleans(),
       block_n=st.sampled_from([16, 32]))
def test_xpu_tile_options_match_reference(pb, chunk, pack_gqa, block_n):
    """The options XPU configs use beside block-pointer K/V, over every head dim and page size:
    the score dot in head-dim chunks (``score_chunk``, q re-read a chunk at a time: padded head
    dims such as 80 and 192 end inside or before a chunk) and one head's tokens per program
    (``pack_gqa`` off: q and out as 2D blocks)."""
    config = dict(BLOCK_N=block_n, BLOCK_M=16, kv_block_ptr=True, score_chunk=chunk, pack_gqa=pack_gqa)
    with tune.override("paged_attention", config):
        got, lse, out, out_ref, lse_ref = run_problem(pb)
    assert not torch.isnan(got).any(), "unwritten (poisoned) or NaN output"
    assert_close(got, out_ref, pb["dtype"])
    check_lse(lse, lse_ref, pb["dtype"])


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("per_head_scale", [False, True])
@pytest.mark.parametrize("tiles", [None, "score chunks"])
def test_fp8_cache(fp8, per_head_scale, tiles):
    fp8 = getattr(torch, fp8)
    gen = torch.Generator().manual_seed(5)
    batch, hkv, hq = 2, 2, 4
    k = (torch.randn(5, 16, hkv, 64, generator=gen) * 4).to(fp8)
    v = (torch.randn(5, 16, hkv, 64, generator=gen) * 4).to(fp8)
    q = torch.randn(batch, hq, 64, generator=gen).half()
    table = torch.tensor([[1, 3], [2, 4]], dtype=torch.int32)
    seqlens = torch.tensor([30, 17], dtype=torch.int32)
    cu = torch.arange(batch + 1, dtype=torch.int32)
    if per_head_scale:
        k_scale, v_scale = torch.rand(batch, hkv, generator=gen) + 0.1, torch.rand(batch, hkv, generator=gen) + 0.1
    else:
        k_scale, v_scale = torch.tensor(0.25), torch.tensor(0.5)
    out = poison(torch.empty(batch, hq, 64, dtype=torch.float16, device=DEVICE))
    if tiles and not _device.block_pointers():
        pytest.skip("block pointers need Triton < 3.9 (compiled runs)")
    # XPU's fp8 tiles: block-pointer V, the 8-bit K^T read in head-dim chunks beside q's chunks
    config = dict(BLOCK_N=16, BLOCK_M=16, kv_block_ptr=True, score_chunk=16)
    with tune.override("paged_attention", config) if tiles else contextlib.nullcontext():
        got = flash_attn_with_kvcache(
            q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cache_seqlens=seqlens.to(DEVICE), page_table=table.to(DEVICE),
            cu_seqlens_q=cu.to(DEVICE), k_descale=k_scale.to(DEVICE), v_descale=v_scale.to(DEVICE), out=out,
            num_splits=2,
        )
    out_ref, _ = ref.paged_attention(q, k, v, seqlens, table, cu, k_descale=k_scale, v_descale=v_scale)
    assert_close(got, out_ref, torch.float16)


@pytest.mark.parametrize("shape", ["per sequence [B]", "[B, 1]", "[1, H_kv]", "expanded to 3 heads", "expanded [1] to [B, 5]"])
def test_descale_shapes_engines_pass(shape):
    """Descales as vLLM passes them: per sequence, size-1 dims, and one value expanded to
    a head count that is not the KV heads' (Intel's kernel reads its first element); each equals
    the same call with the scale written out as [B, H_kv]. An ambiguous shape raises naming it."""
    gen = torch.Generator().manual_seed(7)
    batch, hkv, hq = 2, 2, 4
    fp8 = torch.float8_e4m3fn
    k = (torch.randn(5, 16, hkv, 64, generator=gen) * 4).to(fp8)
    v = (torch.randn(5, 16, hkv, 64, generator=gen) * 4).to(fp8)
    q = torch.randn(batch, 1, hq, 64, generator=gen).half()
    table = torch.tensor([[1, 3], [2, 4]], dtype=torch.int32)
    seqlens = torch.tensor([30, 17], dtype=torch.int32)
    # expanded on the device, as vLLM does (.to(device) of an expanded CPU tensor would copy it dense)
    per_seq = torch.tensor([0.25, 0.5], device=DEVICE)
    per_head = torch.tensor([[0.3, 0.6]], device=DEVICE)
    given, full = {
        "per sequence [B]": (per_seq, per_seq[:, None].expand(batch, hkv)),
        "[B, 1]": (per_seq[:, None], per_seq[:, None].expand(batch, hkv)),
        "[1, H_kv]": (per_head, per_head.expand(batch, hkv)),
        "expanded to 3 heads": (per_seq[:, None].expand(batch, 3), per_seq[:, None].expand(batch, hkv)),
        "expanded [1] to [B, 5]": (torch.tensor([0.4], device=DEVICE).expand(batch, 5),
                                   torch.full((batch, hkv), 0.4, device=DEVICE)),
    }[shape]
    call = dict(cache_seqlens=seqlens.to(DEVICE), page_table=table.to(DEVICE))
    got = flash_attn_with_kvcache(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), k_descale=given, v_descale=given, **call)
    want = flash_attn_with_kvcache(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), k_descale=full.contiguous(),
                                   v_descale=full.contiguous(), **call)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match=r"k_descale must be a scalar.*got \[2, 3\].*ambiguous"):
        flash_attn_with_kvcache(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), k_descale=torch.ones(2, 3, device=DEVICE), **call)


@pytest.mark.parametrize("q_len", [1, 4, 37])
def test_head_dim_512(q_len):
    """Gemma 4's global layers (D = Dv = 512, 8 query heads a KV head): decode, a draft and a
    chunk of prefill over 16-token pages with a window, against the float64 reference (the
    heuristic's 16-key whole-head tiles)."""
    gen = torch.Generator().manual_seed(11)
    batch, hkv, hq, page = 2, 1, 8, 16
    lens = [53, 40]
    k = torch.randn(9, page, hkv, 512, generator=gen)
    v = torch.randn(9, page, hkv, 512, generator=gen)
    table = torch.tensor([[3, 1, 5, 7], [2, 8, 4, 0]], dtype=torch.int32)
    cu = torch.tensor([0, q_len, 2 * q_len], dtype=torch.int32)
    q = torch.randn(2 * q_len, hq, 512, generator=gen)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    out = poison(torch.empty(2 * q_len, hq, 512, device=DEVICE))
    got, lse = flash_attn_with_kvcache(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cache_seqlens=seqlens.to(DEVICE),
                                       page_table=table.to(DEVICE), cu_seqlens_q=cu.to(DEVICE), max_seqlen_q=q_len,
                                       causal=True, window_size=(30, 0), return_softmax_lse=True, out=out)
    out_ref, lse_ref = ref.paged_attention(q, k, v, seqlens, table, cu, causal=True, window_size=(30, 0))
    assert_close(got, out_ref, torch.float32)
    check_lse(lse, lse_ref, torch.float32)


@pytest.mark.parametrize("kv_load", KV_LOADS)
@pytest.mark.parametrize("q_len,num_splits,page", [(1, 1, 16), (1, 3, 4), (3, 0, 16), (6, 1, 0)])
def test_v_split_across_programs(kv_load, q_len, num_splits, page):
    """A config's ``BLOCK_DV`` below the V width splits the output channels across programs (Intel
    GPUs at Dv = 512): Dv = 40 in 16-channel slices (the last one 8 wide), with and without KV
    splits, over pages and contiguous K/V (``page`` 0), sinks and LSE, against the float64 reference."""
    gen = torch.Generator().manual_seed(31)
    hkv, hq, d, dv = 2, 4, 32, 40
    lens = [21, 9]
    cu = torch.tensor([0, q_len, 2 * q_len], dtype=torch.int32)
    q = torch.randn(2 * q_len, hq, d, generator=gen)
    sinks = torch.randn(hq, generator=gen)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    if page:
        k = torch.randn(12, page, hkv, d, generator=gen)
        v = torch.randn(12, page, hkv, dv, generator=gen)
        table = torch.randperm(12, generator=gen)[:12].view(2, 6).to(torch.int32)[:, : -(-max(lens) // page)]
        out_ref, lse_ref = ref.paged_attention(q, k, v, seqlens, table, cu, causal=True, sinks=sinks)
        call = dict(cache_seqlens=seqlens.to(DEVICE), page_table=table.to(DEVICE), num_splits=num_splits)
    else:
        kc, vc = torch.randn(sum(lens), hkv, d, generator=gen), torch.randn(sum(lens), hkv, dv, generator=gen)
        cu_k = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32)
        out_ref, lse_ref = ref.varlen_attention(q, kc, vc, cu, cu_k, causal=True, sinks=sinks)
    out = poison(torch.empty(2 * q_len, hq, dv, device=DEVICE))
    with tune.override("paged_attention", dict(BLOCK_N=16, BLOCK_M=16, BLOCK_DV=16, **kv_load_config(kv_load))):
        if page:
            got, lse = flash_attn_with_kvcache(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cu_seqlens_q=cu.to(DEVICE),
                                               max_seqlen_q=q_len, causal=True, sinks=sinks.to(DEVICE), out=out,
                                               return_softmax_lse=True, **call)
        else:
            got, lse = flash_attn_varlen_func(q.to(DEVICE), kc.to(DEVICE), vc.to(DEVICE), cu.to(DEVICE), cu_k.to(DEVICE),
                                              q_len, max(lens), causal=True, sinks=sinks.to(DEVICE), out=out,
                                              return_softmax_lse=True)
    assert_close(got, out_ref, torch.float32)
    check_lse(lse, lse_ref, torch.float32)


@pytest.mark.parametrize("group,block_dv,num_splits,padding", [(4, 0, 0, 0), (12, 16, 3, 0), (3, 0, 1, 2), (12, 0, 2, 1)])
def test_heads_first_grid_order(group, block_dv, num_splits, padding):
    """``heads_first`` (one-query decode on CUDA: the grid's KV heads on its first axis) changes
    which program computes what, never the result: bitwise the output and LSE of the shipped order,
    and the float64 reference's, with several head blocks (group 12 on 16-row tiles), a V split
    (Dv = 40 in 16-channel slices), KV splits and padding rows past cu_seqlens_q[B]."""
    gen = torch.Generator().manual_seed(group * 100 + num_splits)
    hkv, d, dv, page, batch = 2, 32, 40, 4, 3
    hq = group * hkv
    lens = [21, 1, 14]
    table = torch.randperm(18, generator=gen).view(batch, 6).to(torch.int32)
    k = torch.randn(18, page, hkv, d, generator=gen)
    v = torch.randn(18, page, hkv, dv, generator=gen)
    q = torch.randn(batch + padding, hq, d, generator=gen)
    cu = torch.arange(batch + 1, dtype=torch.int32)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    out_ref, lse_ref = ref.paged_attention(q[:batch], k, v, seqlens, table, cu, causal=True)
    results = []
    for heads_first in (0, 1):
        config = dict(BLOCK_N=16, BLOCK_M=16, heads_first=heads_first, **({"BLOCK_DV": block_dv} if block_dv else {}))
        out = poison(torch.empty(batch + padding, hq, dv, device=DEVICE))
        with tune.override("paged_attention", config):
            got, lse = flash_attn_with_kvcache(
                q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cache_seqlens=seqlens.to(DEVICE), page_table=table.to(DEVICE),
                cu_seqlens_q=cu.to(DEVICE), max_seqlen_q=1, causal=True, num_splits=num_splits, out=out,
                return_softmax_lse=True)
        assert_close(got[:batch], out_ref, torch.float32)
        check_lse(lse[:, :batch], lse_ref, torch.float32)
        if padding:  # rows past cu_seqlens_q[B]: output 0, LSE -inf
            assert torch.equal(got[batch:].cpu(), torch.zeros(padding, hq, dv))
            assert torch.isneginf(lse[:, batch:]).all()
        results.append((got.cpu(), lse.cpu()))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_large_gqa_group_uses_several_head_blocks():
    # 128 query heads on one KV head: more heads than one tile holds
    gen = torch.Generator().manual_seed(6)
    k = torch.randn(3, 16, 1, 64, generator=gen)
    v = torch.randn(3, 16, 1, 64, generator=gen)
    q = torch.randn(1, 128, 64, generator=gen)
    table = torch.tensor([[2, 1]], dtype=torch.int32)
    seqlens = torch.tensor([25], dtype=torch.int32)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    got = flash_attn_with_kvcache(
        q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cache_seqlens=seqlens.to(DEVICE), page_table=table.to(DEVICE),
        cu_seqlens_q=cu.to(DEVICE), max_seqlen_q=1,
    )
    out_ref, _ = ref.paged_attention(q, k, v, seqlens, table, cu)
    assert_close(got, out_ref, torch.float32)


def _valid_args():
    return dict(
        q=torch.zeros(2, 4, 64, device=DEVICE),
        k_cache=torch.zeros(3, 16, 2, 64, device=DEVICE),
        v_cache=torch.zeros(3, 16, 2, 64, device=DEVICE),
        cache_seqlens=torch.ones(2, dtype=torch.int32, device=DEVICE),
        page_table=torch.ones(2, 1, dtype=torch.int32, device=DEVICE),
        cu_seqlens_q=torch.arange(3, dtype=torch.int32, device=DEVICE),
    )


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(q=torch.zeros(2, 4, 64, dtype=torch.int32)), TypeError, "q must have dtype"),
        (dict(k_cache=torch.zeros(3, 16, 2, 64, dtype=torch.float16)), TypeError, "k_cache"),
        (dict(v_cache=torch.zeros(3, 16, 2, 64, dtype=torch.float16)), TypeError, "v_cache"),
        (dict(page_table=torch.ones(2, 1, dtype=torch.int64)), TypeError, "page_table"),
        (dict(cache_seqlens=torch.ones(2, dtype=torch.int64)), TypeError, "cache_seqlens"),
        (dict(q=torch.zeros(2, 4, 128, device=DEVICE)[..., ::2]), ValueError, "stride"),
        (dict(k_cache=torch.zeros(3, 16, 2, 128, device=DEVICE)[..., ::2]), ValueError, "stride"),
        (dict(v_cache=torch.zeros(3, 16, 2, 128, device=DEVICE)[..., ::2]), ValueError, "stride"),
        (dict(q=torch.zeros(2, 3, 64)), ValueError, "multiple of the KV heads"),
        (dict(k_cache=torch.zeros(3, 12, 2, 64), v_cache=torch.zeros(3, 12, 2, 64)), ValueError, "page_size"),
        (dict(cu_seqlens_q=torch.arange(4, dtype=torch.int32)), ValueError, "cu_seqlens_q"),
        (dict(cu_seqlens_q=None), ValueError, "cu_seqlens_q"),
        (dict(q=torch.zeros(2, 4, 44), k_cache=torch.zeros(3, 16, 2, 44), v_cache=torch.zeros(3, 16, 2, 44)), ValueError, "head dim"),
        (dict(q=torch.zeros(2, 4, 36)), ValueError, "head dim"),
        (dict(q=torch.zeros(2, 4, 520), k_cache=torch.zeros(3, 16, 2, 520), v_cache=torch.zeros(3, 16, 2, 520)),
         ValueError, "multiple of 8 from 8 to 512"),
        (dict(v_cache=torch.zeros(3, 8, 2, 64)), ValueError, "v_cache must have shape"),
        (dict(cache_seqlens=torch.ones(3, dtype=torch.int32)), ValueError, "cache_seqlens"),
        (dict(page_table=torch.ones(2, 1, dtype=torch.int32, device="meta")), ValueError, "on one device"),
        (dict(k=torch.zeros(2, 2, 64)), ValueError, "v: the new keys k and values v"),
        (dict(v=torch.zeros(2, 2, 64)), ValueError, "k: the new keys k and values v"),
        (dict(qv=torch.zeros(2, 4, 64)), ValueError, "qv"),
        (dict(window_size=(-2, 0)), ValueError, "window_size"),
        (dict(softcap=-1.0), ValueError, "softcap"),
        (dict(sinks=torch.zeros(3)), ValueError, "sinks"),
        (dict(k_descale=torch.ones(2, 3)), ValueError, "k_descale"),
        (dict(out=torch.zeros(2, 4, 32)), ValueError, "out"),
        (dict(num_splits=-1), ValueError, "num_splits"),
    ],
)
def test_rejects_bad_input(change, error, match):
    args = _valid_args()
    args.update({k: (v.to(DEVICE) if isinstance(v, torch.Tensor) and v.device.type != "meta" else v) for k, v in change.items()})
    q, k_cache, v_cache = args.pop("q"), args.pop("k_cache"), args.pop("v_cache")
    with pytest.raises(error, match=match):
        flash_attn_with_kvcache(q, k_cache, v_cache, **args)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_larger_problems(dtype):
    """Compiled only: longer sequences, bf16, all options, against the float64 reference."""
    for seed in range(6):
        pb = dict(
            dtype=dtype, batch=4, group=[1, 4, 6, 8][seed % 4], num_kv_heads=2, head_dim=128, head_dim_v=128,
            page_size=[1, 16, 64, 256][seed % 4], q_lens=[1, 7, 33, 1], kv_lens=[700, 300, 1200, 1], causal=True,
            window=[(-1, -1), (127, 0)][seed % 2], softcap=[0.0, 30.0][seed % 2 == 1 and seed > 2],
            sinks=seed % 3 == 0, layout=["contiguous", "combined", "layered", "padded"][seed % 4],
            num_splits=[0, 1, 4][seed % 3], four_d=False, give_max_seqlen_q=seed % 2 == 0, extra_pages=2, seed=seed,
        )
        got, lse, _, out_ref, lse_ref = run_problem(pb)
        assert_close(got, out_ref, dtype)
        check_lse(lse, lse_ref, dtype)


def test_validate_reports_lengths_beyond_the_table_and_pages_outside_the_pool():
    args = _valid_args()
    q, k_cache, v_cache = args.pop("q"), args.pop("k_cache"), args.pop("v_cache")
    flash_attn_with_kvcache(q, k_cache, v_cache, validate=True, **args)  # valid: no error
    too_long = dict(args, cache_seqlens=torch.tensor([1, 17], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 17 exceeds the page table"):
        flash_attn_with_kvcache(q, k_cache, v_cache, validate=True, **too_long)
    outside = dict(args, page_table=torch.tensor([[1], [3]], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=r"page id 3 outside the pool \[0, 3\)"):
        flash_attn_with_kvcache(q, k_cache, v_cache, validate=True, **outside)
    more_queries = dict(args, cu_seqlens_q=torch.tensor([0, 2, 2], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="queries but only"):
        flash_attn_with_kvcache(q, k_cache, v_cache, validate=True, **more_queries)


def test_length_beyond_the_table_is_clamped_not_read_past():
    gen = torch.Generator().manual_seed(9)
    k = torch.randn(4, 8, 1, 64, generator=gen)
    v = torch.randn(4, 8, 1, 64, generator=gen)
    q = torch.randn(1, 2, 64, generator=gen)
    table = torch.tensor([[3, 1]], dtype=torch.int32)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    got = flash_attn_with_kvcache(
        q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cache_seqlens=torch.tensor([40], dtype=torch.int32, device=DEVICE),
        page_table=table.to(DEVICE), cu_seqlens_q=cu.to(DEVICE),
    )
    expected, _ = ref.paged_attention(q, k, v, torch.tensor([16]), table, cu)
    assert_close(got, expected, torch.float32)


@pytest.mark.parametrize("case, expected", [
    # (decode_like, D, page_size, max_q) -> (kv_desc, BLOCK_M, num_warps, num_stages) on CUDA, as measured on the H100
    ((False, 128, 64, 8192), (True, 64, 4, 3)),  # whole-tile pages: descriptors, 3 stages
    ((False, 128, 256, 512), (True, 64, 4, 3)),
    ((False, 128, 32, 8192), (True, 64, 4, 3)),  # two 32-token pages a tile, one descriptor load each
    ((False, 128, 16, 8192), (False, 128, 8, 2)),  # 16-token pages: row gathers on 128-row tiles
    ((False, 128, 1, 4096), (False, 128, 8, 2)),  # token-granular tables from 512 queries ...
    ((False, 128, 1, 256), (False, 64, 4, 2)),  # ... not below
    ((False, 128, 0, 4096), (True, 64, 4, 3)),  # contiguous K/V from 2k queries a request
    ((False, 128, 0, 1024), (False, 64, 4, 2)),
    ((False, 64, 64, 4096), (False, 128, 8, 3)),  # D = 64 at one-tile pages from 1k queries
    ((False, 64, 256, 4096), (False, 64, 4, 2)),
    ((False, 64, 64, 256), (False, 64, 4, 2)),
    ((True, 128, 64, 4), (False, 64, 4, 2)),  # drafts and decode: pointer loads
])
def test_prefill_heuristic_choices_on_cuda(monkeypatch, case, expected):
    """The built-in prefill configs where no tuned file covers a bucket (measurements behind each:
    bench/results/NVIDIA_H100_80GB_HBM3/experiments/prefill_pages.txt, prefill_desc.txt)."""
    from triton_xpu_attn import device as _device
    from triton_xpu_attn.ops import paged_attention as pa

    monkeypatch.setattr(_device, "backend", lambda: "cuda")
    decode_like, head_dim, page_size, max_q = case
    config = pa._heuristic_config(decode_like, head_dim, 32, page_size, max_q)
    assert (config["kv_desc"], config["BLOCK_M"], config["num_warps"], config["num_stages"]) == expected


@pytest.mark.parametrize("decode_like, head_dim, work, page_size, max_q, q_bytes, block_n, prefetch", [
    # D = 512 (experiments/wide_tiles.txt): 32-key tiles once the batch fills the device, 16 below ...
    (True, 512, 16, 16, 1, 2, 32, 1),  # (page ids a tile ahead: 16-token pages in 32-key tiles)
    (True, 512, 2, 16, 1, 2, 16, 0),
    (False, 512, 32, 64, 4096, 2, 32, 0),
    # ... and with float32 operands, whose 32-key tiles overflow the shared memory
    (False, 512, 32, 64, 4096, 4, 16, 0),
    (True, 512, 16, 16, 1, 4, 16, 0),
    # page ids a tile ahead: one-query decode at D = 128 over one-token pages (prefetch_pages_p1.txt) ...
    (True, 128, 16, 1, 1, 2, 64, 1),
    (True, 128, 16, 1, 4, 2, 64, 0),
    (True, 64, 16, 1, 1, 2, 128, 0),
    (True, 128, 16, 16, 1, 2, 64, 0),
    (True, 512, 16, 64, 1, 2, 32, 0),  # ... and at D = 512 over pages shorter than the 32-key tile
    (True, 512, 16, 16, 4, 2, 32, 0),
])
def test_wide_head_and_prefetch_heuristic_choices_on_cuda(monkeypatch, decode_like, head_dim, work, page_size, max_q,
                                                          q_bytes, block_n, prefetch):
    from triton_xpu_attn import device as _device
    from triton_xpu_attn.ops import paged_attention as pa

    monkeypatch.setattr(_device, "backend", lambda: "cuda")
    config = pa._heuristic_config(decode_like, head_dim, work, page_size, max_q, False, head_dim, q_bytes)
    assert (config["BLOCK_N"], config["PREFETCH_PAGES"]) == (block_n, prefetch)


@pytest.mark.parametrize("backend, decode_like, max_q, expected", [
    ("cuda", True, 1, 1), ("cuda", True, 4, 0), ("cuda", False, 512, 0), ("xpu", True, 1, 0)])
def test_heads_first_heuristic_choice(monkeypatch, backend, decode_like, max_q, expected):
    """The KV heads lead the grid for one-query decode on CUDA only (experiments/block_order.txt)."""
    from triton_xpu_attn import device as _device
    from triton_xpu_attn.ops import paged_attention as pa

    monkeypatch.setattr(_device, "backend", lambda: backend)
    assert pa._heuristic_config(decode_like, 128, 16, 1, max_q).get("heads_first", 0) == expected


@pytest.mark.parametrize("entry", ["paged", "varlen"])
def test_absurd_max_seqlen_q_and_num_splits_keep_the_grid_bounded(entry, monkeypatch):
    """max_seqlen_q = 2^31 - 1 (a user scalar nothing bounds) sizes the grid as total_q would: no
    request has more rows than q (before: B x 2^31 / BLOCK_Q programs, past CUDA's axis-0 limit
    from B = 64); num_splits past the grid's axis-2 limit is cut to it (MAX_GRID_DIM_1, 2 here).
    Results equal the reference."""
    from helpers import GridRecorder
    from triton_xpu_attn.ops import paged_launch as pa

    recorder = GridRecorder(pa._paged_attention_kernel, max_programs=4096)
    monkeypatch.setattr(pa, "_paged_attention_kernel", recorder)
    monkeypatch.setattr(pa, "MAX_GRID_DIM_1", 2)
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(5, 2, 64, generator=gen)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    if entry == "paged":
        k = torch.randn(6, 4, 1, 64, generator=gen)
        v = torch.randn(6, 4, 1, 64, generator=gen)
        seqlens = torch.tensor([9, 20], dtype=torch.int32)
        table = torch.zeros(2, 64, dtype=torch.int32)  # 256 keys wide: several key tiles to split
        table[:, :5] = torch.tensor([[5, 1, 3, 0, 0], [2, 4, 0, 1, 3]], dtype=torch.int32)
        expected, _ = ref.paged_attention(q, k, v, seqlens, table, cu, causal=True)
    else:
        k = torch.randn(260, 1, 64, generator=gen)
        v = torch.randn(260, 1, 64, generator=gen)
        cu_k = torch.tensor([0, 9, 260], dtype=torch.int32)
        expected, _ = ref.varlen_attention(q, k, v, cu, cu_k, causal=True)
    for max_q, splits in ((2**31 - 1, 1), (2**31 - 1, 10**9), (3, 10**9)):
        out = poison(torch.empty(5, 2, 64, device=DEVICE))
        if entry == "paged":
            flash_attn_with_kvcache(
                q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cache_seqlens=seqlens.to(DEVICE), page_table=table.to(DEVICE),
                cu_seqlens_q=cu.to(DEVICE), max_seqlen_q=max_q, num_splits=splits, causal=True, out=out,
            )
        else:
            out = flash_attn_varlen_func(
                q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cu.to(DEVICE), cu_k.to(DEVICE), max_q, 2**31 - 1,
                num_splits=splits, causal=True, out=out,
            )
        assert_close(out, expected, torch.float32)
        grid = recorder.grids[-1]
        assert grid[2] == (1 if splits == 1 else 2)
        assert max(grid[0], grid[1]) <= 2 * 5 + 1  # B x (tiles of total_q rows) + the padding program
