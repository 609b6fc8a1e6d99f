"""AppendKV of ``flash_attn_with_kvcache`` (FlashAttention-3's contract) against the float64
reference ``ref.flash_attn_with_kvcache_append``: new keys / values written at
``cache_seqlens[b] + i`` of their cache row (paged through a permuted page table, or a contiguous
``[B_cache, S, H_kv, D]`` cache, rows picked by ``cache_batch_idx``), keys and queries rotated
(interleaved / GPT-NeoX, partial ``rotary_dim``, ``rotary_seqlens``), attention over
``cache_leftpad .. cache_seqlens + new`` with causal / local / full masks and GQA, in one call.
The caches are compared after the call: every slot outside the written region keeps its bits
(NaN-poisoned where no query may look), ``cache_seqlens`` is not modified, and untrusted indices
(positions past the row, rows past the cache, page ids past the pool) write nothing."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import triton_xpu_attn as tx
from helpers import DEVICE, INTERPRET, TOLERANCE, assert_close
from triton_xpu_attn import reference as ref

FLOATS = [torch.float16, torch.bfloat16, torch.float32]
#: rotated keys in the cache: the kernel rotates in fp32 and rounds once (the interpreter's fp32 -> bf16
#: cast truncates: one more step)
CACHE_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _check_cache(out, expected, written, dtype):
    """Bitwise outside ``written`` (a bool mask over the cache's token slots); within it close to
    the reference (exact without rotation: ``dtype`` None)."""
    out, expected = out.cpu(), expected.cpu()
    keep = ~written
    assert torch.equal(_bits(out)[keep], _bits(expected)[keep]), "a slot outside the appended region changed"
    if dtype is None:
        assert torch.equal(_bits(out)[written], _bits(expected)[written])
    else:
        a, b = out[written].double(), expected[written].double()
        assert torch.allclose(a, b, rtol=CACHE_TOL[dtype], atol=CACHE_TOL[dtype]), (a - b).abs().max()


@st.composite
def problems(draw):
    dtype = draw(st.sampled_from(FLOATS))
    batch = draw(st.integers(1, 3))
    kv_heads = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2, 3]))
    head_dim = draw(st.sampled_from([16, 32]))
    head_dim_v = draw(st.sampled_from([head_dim, 16]))
    paged = draw(st.booleans())
    varlen = draw(st.booleans())
    if paged:
        page = draw(st.sampled_from([1, 2, 4, 8]))
        width = draw(st.integers(1, max(1, 12 // page)))
        capacity = width * page
    else:
        capacity = draw(st.integers(4, 13))
    slack = draw(st.sampled_from([0, 0, 3]))  # contiguous cache rows sliced out of longer ones
    append = draw(st.integers(0, 4)) > 0
    new_max = draw(st.integers(1, min(4, capacity)))
    new_lens = [draw(st.integers(0 if varlen else new_max, new_max)) for _ in range(batch)] if append else [0] * batch
    q_lens = [draw(st.integers(0 if varlen else 1, 3)) for _ in range(batch)]
    if not varlen:
        q_lens = [q_lens[0]] * batch
    use_idx = draw(st.booleans())
    cache_rows = batch + (draw(st.integers(0, 2)) if use_idx else 0)
    lens = [draw(st.integers(0, capacity - n)) for n in new_lens]
    leftpad = [draw(st.integers(0, n)) for n in lens] if draw(st.booleans()) else None
    rotary = None
    if append and draw(st.booleans()):
        rotary = dict(dim=draw(st.sampled_from([head_dim, head_dim // 2, 8])), interleaved=draw(st.booleans()),
                      shifted=draw(st.booleans()))
    mask = draw(st.sampled_from(["none", "causal", "local"]))
    window = (draw(st.integers(0, 5)), draw(st.integers(0, 3))) if mask == "local" else (-1, -1)
    return dict(dtype=dtype, batch=batch, kv_heads=kv_heads, group=group, head_dim=head_dim, head_dim_v=head_dim_v,
                paged=paged, varlen=varlen, append=append, new_lens=new_lens, new_max=new_max, q_lens=q_lens,
                use_idx=use_idx, cache_rows=cache_rows, page=page if paged else None,
                width=width if paged else None, capacity=capacity, slack=slack, lens=lens, leftpad=leftpad, rotary=rotary,
                causal=mask == "causal", window=window, seed=draw(st.integers(0, 2**16)))


def _build(p):
    gen = torch.Generator().manual_seed(p["seed"])
    dtype, B, hk, d, dv = p["dtype"], p["batch"], p["kv_heads"], p["head_dim"], p["head_dim_v"]
    hq = hk * p["group"]
    rows = p["cache_rows"]
    idx = torch.randperm(rows, generator=gen)[:B].to(torch.int32) if p["use_idx"] else None
    if p["paged"]:
        pages = rows * p["width"] + 3  # spare pages stay poisoned
        shape = (pages, p["page"])
        table = torch.randperm(pages, generator=gen)[: rows * p["width"]].reshape(rows, p["width"]).to(torch.int32)
    else:
        shape = (rows, p["capacity"])
        table = None
    slack = 0 if p["paged"] else p["slack"]
    k_cache = torch.randn(shape[0], shape[1] + slack, hk, d, generator=gen).to(dtype)[:, : shape[1]]
    v_cache = torch.randn(shape[0], shape[1] + slack, hk, dv, generator=gen).to(dtype)[:, : shape[1]]
    # slots no query may see hold NaN: past each request's keys and left of its leftpad
    for b in range(B):
        r = b if idx is None else int(idx[b])
        lp = p["leftpad"][b] if p["leftpad"] else 0
        for pos in list(range(lp)) + list(range(p["lens"][b] + p["new_lens"][b], p["capacity"])):
            where = (int(table[r, pos // p["page"]]), pos % p["page"]) if p["paged"] else (r, pos)
            k_cache[where], v_cache[where] = float("nan"), float("nan")
    if p["paged"]:
        used = table.flatten().long()
        spare = torch.ones(shape[0], dtype=torch.bool)
        spare[used] = False
        k_cache[spare], v_cache[spare] = float("nan"), float("nan")
    new = [torch.randn(n, hk, d + dv, generator=gen).to(dtype) for n in p["new_lens"]]
    if p["varlen"]:
        k = torch.cat([x[:, :, :d] for x in new]) if p["append"] else None
        v = torch.cat([x[:, :, d:] for x in new]) if p["append"] else None
        cu_k = torch.tensor([0] + p["new_lens"], dtype=torch.int32).cumsum(0).to(torch.int32) if p["append"] else None
        q = torch.randn(sum(p["q_lens"]), hq, d, generator=gen).to(dtype)
        cu_q = torch.tensor([0] + p["q_lens"], dtype=torch.int32).cumsum(0).to(torch.int32)
    else:
        k = torch.stack([x[:, :, :d] for x in new]) if p["append"] else None
        v = torch.stack([x[:, :, d:] for x in new]) if p["append"] else None
        cu_k = cu_q = None
        q = torch.randn(B, p["q_lens"][0], hq, d, generator=gen).to(dtype)
    cos = sin = rot_lens = None
    if p["rotary"]:
        seqlen_ro = p["capacity"] + 2
        angle = torch.rand(seqlen_ro, p["rotary"]["dim"] // 2, generator=gen, dtype=torch.float64) * 6.283
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
        if p["rotary"]["shifted"]:
            rot_lens = torch.tensor([n // 2 + 1 for n in p["lens"]], dtype=torch.int32)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, cache_seqlens=torch.tensor(p["lens"], dtype=torch.int32),
                page_table=table, cache_batch_idx=idx,
                cache_leftpad=torch.tensor(p["leftpad"], dtype=torch.int32) if p["leftpad"] else None,
                cu_seqlens_q=cu_q, cu_seqlens_k_new=cu_k, rotary_cos=cos, rotary_sin=sin, rotary_seqlens=rot_lens)


def _written(p, args):
    """Bool mask over the cache's token slots [entries, S] the append writes."""
    cache = args["k_cache"]
    mask = torch.zeros(cache.shape[:2], dtype=torch.bool)
    for b in range(p["batch"]):
        r = b if args["cache_batch_idx"] is None else int(args["cache_batch_idx"][b])
        for pos in range(p["lens"][b], p["lens"][b] + p["new_lens"][b]):
            mask[(int(args["page_table"][r, pos // p["page"]]), pos % p["page"]) if p["paged"] else (r, pos)] = True
    return mask


@given(problems())
def test_append_matches_reference(p):
    args = _build(p)
    rotary = p["rotary"] or {}
    opts = dict(causal=p["causal"], window_size=p["window"], rotary_interleaved=rotary.get("interleaved", True))
    expected_out, expected_lse, expected_k, expected_v = ref.flash_attn_with_kvcache_append(**args, **opts)
    dev = {name: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for name, t in args.items()}
    seqlens_before = dev["cache_seqlens"].clone()
    total_q = sum(p["q_lens"]) if p["varlen"] else p["batch"] * p["q_lens"][0]
    hq = p["kv_heads"] * p["group"]
    out = torch.full((total_q, hq, p["head_dim_v"]), float("nan"), dtype=p["dtype"], device=DEVICE)
    kwargs = {name: dev[name] for name in ("cache_seqlens", "page_table", "cache_batch_idx", "cache_leftpad",
                                           "cu_seqlens_q", "cu_seqlens_k_new", "rotary_seqlens")}
    got, lse = tx.flash_attn_with_kvcache(
        dev["q"], dev["k_cache"], dev["v_cache"], dev["k"], dev["v"], rotary_cos=dev["rotary_cos"],
        rotary_sin=dev["rotary_sin"], max_seqlen_q=max(p["q_lens"]) if p["varlen"] else None, out=out,
        return_softmax_lse=True, **kwargs, **opts,
    )
    assert got is out
    assert torch.equal(dev["cache_seqlens"], seqlens_before)  # FlashAttention-3: the lengths are not modified
    written = _written(p, args)
    _check_cache(dev["k_cache"], expected_k, written, p["dtype"] if p["rotary"] else None)
    _check_cache(dev["v_cache"], expected_v, written, None)
    assert_close(got, expected_out, p["dtype"])
    finite = torch.isfinite(expected_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    assert torch.allclose(lse.cpu()[finite].double(), expected_lse[finite], atol=TOLERANCE[p["dtype"]] * 10)


FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("scale_kind", ["none", "scalar", "per_head"])
@pytest.mark.parametrize("rotary", [False, True])
def test_fp8_cache_append_quantises_with_the_descales(fp8, scale_kind, rotary):
    """Into an fp8 cache the new keys (rotated first) and values are stored as ``x / descale``
    (saturated, rounded to nearest: one fp8 step from the reference at most), then read back
    dequantised by the same factors."""
    gen = torch.Generator().manual_seed(5)
    B, hk, hq, d, page = 2, 2, 4, 32, 4
    table = torch.tensor([[3, 0, 5], [1, 4, 2]], dtype=torch.int32)
    k_cache = (torch.randn(6, page, hk, d, generator=gen) * 2).to(fp8)
    v_cache = (torch.randn(6, page, hk, d, generator=gen) * 2).to(fp8)
    lens = torch.tensor([3, 6], dtype=torch.int32)
    q = torch.randn(B, 2, hq, d, generator=gen).to(torch.float16)
    k = (torch.randn(B, 2, hk, d, generator=gen) * 3).to(torch.float16)
    v = (torch.randn(B, 2, hk, d, generator=gen) * 3).to(torch.float16)
    scales = {"none": (None, None), "scalar": (0.5, 0.25),
              "per_head": (torch.tensor([[0.5, 0.7], [0.3, 1.5]]), torch.tensor([[0.2, 0.9], [1.1, 0.4]]))}[scale_kind]
    cos = sin = None
    if rotary:
        angle = torch.rand(16, 8, generator=gen, dtype=torch.float64) * 6.283
        cos, sin = angle.cos().half(), angle.sin().half()
    exp_out, _, exp_k, exp_v = ref.flash_attn_with_kvcache_append(
        q, k_cache, v_cache, k, v, cache_seqlens=lens, page_table=table, rotary_cos=cos, rotary_sin=sin,
        causal=True, k_descale=scales[0], v_descale=scales[1])
    to = (lambda x: x.to(DEVICE) if isinstance(x, torch.Tensor) else x)
    kc, vc = to(k_cache), to(v_cache)
    got = tx.flash_attn_with_kvcache(to(q), kc, vc, to(k), to(v), rotary_cos=to(cos), rotary_sin=to(sin),
                                     cache_seqlens=to(lens), page_table=to(table), causal=True,
                                     k_descale=to(scales[0]), v_descale=to(scales[1]))
    step = 2.0 ** (-3 if fp8 == torch.float8_e4m3fn else -2)
    for out_cache, exp_cache in ((kc, exp_k), (vc, exp_v)):
        a, b = out_cache.cpu().float(), exp_cache.float()
        assert torch.all((a - b).abs() <= b.abs() * step + 2.0 ** -16)
    assert_close(got, exp_out, torch.float16) if fp8 == torch.float8_e4m3fn and not rotary else None
    assert (got.cpu().float() - exp_out.float()).abs().max() < 0.1 * exp_out.abs().max()


def test_fp8_keys_in_the_cache_dtype_are_copied():
    """k / v given in the fp8 cache's own dtype are written bit for bit (sgl-kernel-xpu's AppendKV)."""
    gen = torch.Generator().manual_seed(6)
    f8 = torch.float8_e4m3fn
    k_cache = torch.randn(4, 4, 1, 16, generator=gen).to(f8)
    v_cache = torch.randn(4, 4, 1, 16, generator=gen).to(f8)
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    k, v = torch.randn(2, 3, 1, 16, generator=gen).to(f8), torch.randn(2, 3, 1, 16, generator=gen).to(f8)
    lens = torch.tensor([1, 5], dtype=torch.int32)
    kc, vc = k_cache.to(DEVICE), v_cache.to(DEVICE)
    tx.flash_attn_with_kvcache(torch.randn(2, 1, 2, 16).half().to(DEVICE), kc, vc, k.to(DEVICE), v.to(DEVICE),
                               cache_seqlens=lens.to(DEVICE), page_table=table.to(DEVICE), k_descale=0.5)
    _, _, exp_k, exp_v = ref.flash_attn_with_kvcache_append(torch.zeros(2, 1, 2, 16), k_cache, v_cache, k, v,
                                                            cache_seqlens=lens, page_table=table)
    assert torch.equal(_bits(kc), _bits(exp_k)) and torch.equal(_bits(vc), _bits(exp_v))


def test_untrusted_indices_write_nothing_outside():
    """Positions past a row's capacity (or negative), cache rows past the table, page ids past the
    pool: those tokens are skipped; everything else lands where it should, no other slot changes,
    and a request whose row lies outside the table sees no key (output 0)."""
    gen = torch.Generator().manual_seed(7)
    page, hk, d = 2, 1, 16
    k_cache = torch.randn(5, page, hk, d, generator=gen)
    v_cache = torch.randn(5, page, hk, d, generator=gen)
    # request 0: fine (row 1); request 1: length runs past its 2-page row; request 2: a page id
    # past the pool and -1; request 3: row 9 (outside the table); request 4: negative length
    table = torch.tensor([[0, 1], [2, 3], [7, -1]], dtype=torch.int32)
    idx = torch.tensor([1, 0, 2, 9, 1], dtype=torch.int32)
    lens = torch.tensor([0, 3, 0, 0, -5], dtype=torch.int32)
    k = torch.randn(5, 2, hk, d, generator=gen)
    v = torch.randn(5, 2, hk, d, generator=gen)
    kc, vc = k_cache.clone().to(DEVICE), v_cache.clone().to(DEVICE)
    out = tx.flash_attn_with_kvcache(torch.randn(5, 1, hk, d).to(DEVICE), kc, vc, k.to(DEVICE), v.to(DEVICE),
                                     cache_seqlens=lens.to(DEVICE), page_table=table.to(DEVICE),
                                     cache_batch_idx=idx.to(DEVICE))
    exp_k, exp_v = k_cache.clone(), v_cache.clone()
    exp_k[2, 0], exp_k[2, 1] = k[0, 0, 0], k[0, 1, 0]  # request 0 -> row 1 = pages [2, 3], positions 0, 1
    exp_v[2, 0], exp_v[2, 1] = v[0, 0, 0], v[0, 1, 0]
    exp_k[1, 1], exp_v[1, 1] = k[1, 0, 0], v[1, 0, 0]  # request 1 -> row 0, position 3 fits, 4 does not
    assert torch.equal(kc.cpu(), exp_k) and torch.equal(vc.cpu(), exp_v)
    assert torch.equal(out[3].cpu(), torch.zeros_like(out[3].cpu()))
    assert torch.isfinite(out.cpu()).all()


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(k=None), ValueError, "^k: "),
        (dict(cu_seqlens_k_new=torch.tensor([0, 1, 2], dtype=torch.int32)), ValueError, "^cu_seqlens_k_new: "),
        (dict(k=torch.zeros(2, 2, 16), v=torch.zeros(2, 2, 16)), ValueError, "^cu_seqlens_k_new: "),
        (dict(k=torch.zeros(2, 1, 2, 16)), ValueError, "k must have shape"),
        (dict(v=torch.zeros(2, 2, 2, 8)), ValueError, "v must have shape"),
        (dict(k=torch.zeros(2, 1, 1, 16, dtype=torch.float64)), TypeError, "k must have dtype"),
        (dict(rotary_cos=torch.zeros(8, 12), rotary_sin=torch.zeros(8, 12)), ValueError, "^rotary_cos: rotary_dim"),
        (dict(rotary_cos=torch.zeros(8, 4)), ValueError, "^rotary_sin: "),
        (dict(cache_batch_idx=torch.zeros(2, dtype=torch.int64)), TypeError, "cache_batch_idx"),
        (dict(cache_leftpad=torch.zeros(3, dtype=torch.int32)), ValueError, "cache_leftpad"),
        (dict(rotary_cos=torch.zeros(8, 4), rotary_sin=torch.zeros(8, 4), rotary_seqlens=torch.zeros(3, dtype=torch.int32)),
         ValueError, "rotary_seqlens"),
        (dict(page_table=torch.zeros(3, 2, dtype=torch.int32)), ValueError, "page_table has 3 rows"),
        (dict(page_table=None), ValueError, "k_cache has 4 rows"),
    ],
)
def test_bad_append_input_names_the_argument(change, error, match):
    args = dict(q=torch.zeros(2, 1, 2, 16), k_cache=torch.zeros(4, 4, 1, 16), v_cache=torch.zeros(4, 4, 1, 16),
                k=torch.zeros(2, 1, 1, 16), v=torch.zeros(2, 1, 1, 16), cache_seqlens=torch.zeros(2, dtype=torch.int32),
                page_table=torch.zeros(2, 2, dtype=torch.int32))
    args.update(change)
    args = {n: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for n, t in args.items()}
    with pytest.raises(error, match=match):
        tx.flash_attn_with_kvcache(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("k"),
                                   args.pop("v"), **args)


def test_empty_batch_and_no_new_tokens():
    """B = 0 gives an empty output; zero new tokens leave the cache untouched and equal the plain call."""
    kc, vc = torch.randn(3, 4, 1, 16).to(DEVICE), torch.randn(3, 4, 1, 16).to(DEVICE)
    out = tx.flash_attn_with_kvcache(torch.zeros(0, 2, 16).to(DEVICE), kc, vc, torch.zeros(0, 1, 16).to(DEVICE),
                                     torch.zeros(0, 1, 16).to(DEVICE), cache_seqlens=torch.zeros(0, dtype=torch.int32).to(DEVICE),
                                     page_table=torch.zeros(0, 2, dtype=torch.int32).to(DEVICE),
                                     cu_seqlens_q=torch.zeros(1, dtype=torch.int32).to(DEVICE),
                                     cu_seqlens_k_new=torch.zeros(1, dtype=torch.int32).to(DEVICE))
    assert out.shape == (0, 2, 16)
    table = torch.tensor([[2, 0]], dtype=torch.int32).to(DEVICE)
    lens = torch.tensor([5], dtype=torch.int32).to(DEVICE)
    q = torch.randn(1, 1, 2, 16).to(DEVICE)
    before = kc.clone()
    plain = tx.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table)
    appended = tx.flash_attn_with_kvcache(q, kc, vc, torch.zeros(1, 0, 1, 16).to(DEVICE),
                                         torch.zeros(1, 0, 1, 16).to(DEVICE), cache_seqlens=lens, page_table=table)
    assert torch.equal(kc, before) and torch.equal(plain, appended)


@pytest.mark.gpu
def test_graph_replay_without_host_sync():
    """One append + rotary + attention call captured in a device graph, replayed with new lengths,
    new tokens and a new table: output and cache equal the reference (no host sync allowed)."""
    from helpers import capture_graph, replay_without_host_sync

    api = torch.cuda if torch.cuda.is_available() else torch.xpu
    gen = torch.Generator().manual_seed(13)
    B, hk, hq, d, page, width, pages = 3, 2, 8, 128, 16, 8, 40
    k_cache = torch.randn(pages, page, hk, d, generator=gen).bfloat16().to(DEVICE)
    v_cache = torch.randn(pages, page, hk, d, generator=gen).bfloat16().to(DEVICE)
    angle = torch.rand(width * page, 32, generator=gen, dtype=torch.float64) * 6.283
    cos, sin = angle.cos().bfloat16().to(DEVICE), angle.sin().bfloat16().to(DEVICE)

    def values():
        return (torch.randn(B, 4, hq, d, generator=gen).bfloat16(), torch.randn(B, 4, hk, d, generator=gen).bfloat16(),
                torch.randn(B, 4, hk, d, generator=gen).bfloat16(),
                torch.randint(0, width * page - 4, (B,), generator=gen, dtype=torch.int32),
                torch.randperm(pages, generator=gen)[: B * width].reshape(B, width).to(torch.int32))

    q, k, v, lens, table = (x.to(DEVICE) for x in values())
    out = torch.empty(B * 4, hq, d, dtype=torch.bfloat16, device=DEVICE)

    def run():
        tx.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                   page_table=table, causal=True, rotary_interleaved=False, out=out)

    graph, _ = capture_graph(api, run)
    for new, old in zip(values(), (q, k, v, lens, table)):
        old.copy_(new)
    kc0, vc0 = k_cache.cpu(), v_cache.cpu()
    replay_without_host_sync(api, graph)
    exp_out, _, exp_k, exp_v = ref.flash_attn_with_kvcache_append(
        q.cpu(), kc0, vc0, k.cpu(), v.cpu(), cache_seqlens=lens.cpu(), page_table=table.cpu(), rotary_cos=cos.cpu(),
        rotary_sin=sin.cpu(), rotary_interleaved=False, causal=True)
    assert_close(out, exp_out, torch.bfloat16)
    assert torch.allclose(k_cache.cpu().double(), exp_k.double(), rtol=2e-2, atol=2e-2)
    assert torch.equal(v_cache.cpu(), exp_v)
