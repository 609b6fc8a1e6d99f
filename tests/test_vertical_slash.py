"""Vertical/slash sparse attention (``sgl_kernel.sparse_flash_attn``) against the references.

* ``convert_vertical_slash_indexes`` (and ``_mergehead``) equal the plain-Python merge exactly, on
  sorted lists (what sglang passes) and on any order, negative and out-of-range lines, per-head
  counts outside ``[0, NNZ]``, int32 / int64, strided lists; hand-worked results of the merge;
* ``sparse_attn_func`` / ``sparse_attn_varlen_func`` equal the float64 dense-mask attention for
  drawn tables: duplicate and overlapping blocks and columns, offsets and columns outside the
  keys (int32 extremes), counts outside ``[0, NNZ]``, row blocks of any size, GQA, causal,
  softcap, LSE. Keys no query of their KV head sees hold NaN, outputs start as NaN;
* the pipeline sglang runs (lines -> tables -> attention), upstream's dense-equivalent table,
  empty inputs, bad arguments, the custom ops and the compat module.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import DEVICE, FLOAT_DTYPES, assert_close, poison
from triton_xpu_attn import (
    convert_vertical_slash_indexes,
    convert_vertical_slash_indexes_mergehead,
    sparse_attn_func,
    sparse_attn_varlen_func,
)
from triton_xpu_attn import custom_ops as C
from triton_xpu_attn import reference as ref

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
LSE_TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def _dev(*ts):
    return [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in ts]


def _cpu_tables(tables):
    return [t.cpu().long() for t in tables]


# ---------------------------------------------------------------------------------------------
# convert_vertical_slash_indexes
# ---------------------------------------------------------------------------------------------


def test_convert_hand_worked_example():
    """4 queries x 4 keys, verticals [1, 3], slash [2], 2 x 2 blocks (upstream's test problem),
    worked through the merge by hand."""
    args = _dev(torch.tensor([4], dtype=torch.int32), torch.tensor([4], dtype=torch.int32),
                torch.tensor([[[1, 3]]], dtype=torch.int32), torch.tensor([[[2]]], dtype=torch.int32))
    # causal: row 0 (limit 2) has no slash and vertical 1 >= limit - 1 stops it; row 1 (limit 4):
    # slash 2 -> range [0, 2), one block at 0, vertical 1 inside it, vertical 3 >= limit - 1
    got = convert_vertical_slash_indexes(*args, 4, 2, 2, causal=True)
    assert [t.tolist() for t in got] == [[[[0, 1]]], [[[[0], [0]]]], [[[0, 0]]], [[[[0, 0], [0, 0]]]]]
    # not causal: ranges end at kv_len + end - 2: row 0 -> [2, 4) (block 2, column 1); row 1 ->
    # [4, 6), no block below kv_len, columns 1 and 3
    got = convert_vertical_slash_indexes(*args, 4, 2, 2, causal=False)
    assert [t.tolist() for t in got] == [[[[1, 0]]], [[[[2], [0]]]], [[[1, 2]]], [[[[1, 0], [1, 3]]]]]
    assert all(t.dtype == torch.int32 for t in got)


def _lines(data, batch, heads, count, lo, hi):
    values = data.draw(st.lists(st.integers(lo, hi), min_size=batch * heads * count,
                                max_size=batch * heads * count))
    return torch.tensor(values, dtype=torch.int64).view(batch, heads, count)


@given(data=st.data())
def test_convert_matches_reference(data):
    batch = data.draw(st.integers(0, 2), "batch")
    heads = data.draw(st.integers(1, 2), "heads")
    context = data.draw(st.integers(0, 24), "context")
    block_m = data.draw(st.sampled_from([1, 2, 3, 4, 8, 16]), "block_m")
    block_n = data.draw(st.sampled_from([1, 2, 4, 5, 8, 64]), "block_n")
    nnz_v = data.draw(st.integers(0, 6), "nnz_v")
    nnz_s = data.draw(st.integers(0, 5), "nnz_s")
    causal = data.draw(st.booleans(), "causal")
    sort = data.draw(st.sampled_from(["sglang", "any"]), "order")
    dtype = data.draw(st.sampled_from([torch.int32, torch.int64]), "dtype")
    q_lens = torch.tensor(data.draw(st.lists(st.integers(0, 30), min_size=batch, max_size=batch)))
    kv_lens = q_lens + torch.tensor(data.draw(st.lists(st.integers(-3, 8), min_size=batch, max_size=batch)),
                                    dtype=torch.int64)
    vertical = _lines(data, batch, heads, nnz_v, -3, 34)
    slash = _lines(data, batch, heads, nnz_s, -3, 34)
    if sort == "sglang":  # verticals ascending, slashes descending
        vertical, slash = vertical.sort(-1)[0], slash.sort(-1, descending=True)[0]
    if data.draw(st.booleans(), "extremes") and vertical.numel():
        vertical.view(-1)[0] = data.draw(st.sampled_from([I32_MIN, I32_MAX]))
    strided = data.draw(st.booleans(), "strided")
    if strided:  # heads apart in memory
        vertical = torch.stack([vertical, vertical + 1], 2)[:, :, 0]
        slash = torch.stack([slash, slash - 1], 2)[:, :, 0]
    mergehead = data.draw(st.booleans(), "mergehead")
    counts = (None, None)
    if mergehead:
        counts = tuple(torch.tensor(data.draw(st.lists(st.sampled_from([-2, 0, 1, 2, 3, 9, I32_MAX]),
                                                       min_size=heads, max_size=heads))) for _ in range(2))
    args = [q_lens.to(dtype), kv_lens.to(dtype), vertical.to(dtype), slash.to(dtype)]
    expected = ref.convert_vertical_slash_indexes(*args, context, block_m, block_n, causal, *counts)
    if mergehead:
        got = convert_vertical_slash_indexes_mergehead(*_dev(*args, *(c.to(torch.int32) for c in counts)),
                                                       context, block_m, block_n, causal=causal)
    else:
        got = convert_vertical_slash_indexes(*_dev(*args), context, block_m, block_n, causal=causal)
    for name, g, e in zip(("block_count", "block_offset", "column_count", "column_index"), got, expected):
        assert g.dtype == dtype and g.device.type == torch.device(DEVICE).type, name
        if dtype == torch.int32:  # positions past int32 wrap
            e = ((e + 2**31) % 2**32) - 2**31
        assert torch.equal(g.cpu().long(), e), (name, g.cpu().tolist(), e.tolist())


def test_convert_caps_blocks_at_nnz_s():
    """block_size_N < block_size_M: one slash makes more blocks than NNZ_S; the row keeps NNZ_S."""
    args = _dev(torch.tensor([64], dtype=torch.int32), torch.tensor([64], dtype=torch.int32),
                torch.zeros(1, 1, 0, dtype=torch.int32), torch.tensor([[[0]]], dtype=torch.int32))
    bc, bo, cc, ci = convert_vertical_slash_indexes(*args, 64, 32, 4, causal=True)
    assert bc.tolist() == [[[1, 1]]] and bo.tolist() == [[[[0], [32]]]]
    assert cc.tolist() == [[[0, 0]]] and ci.shape == (1, 1, 2, 0)


# ---------------------------------------------------------------------------------------------
# sparse attention
# ---------------------------------------------------------------------------------------------


def _draw_tables(data, batch, heads, rows, nnz_s, nnz_v, seqlen_k, block_n, index_dtype):
    def entry(limit):  # mostly keys (duplicates likely), some just outside, some extremes
        return st.one_of(st.integers(0, max(limit - 1, 0)), st.integers(0, max(limit - 1, 0)),
                         st.integers(-block_n - 1, limit + 1), st.sampled_from([I32_MIN, I32_MAX, -1]))

    def tensor(shape, strategy):
        n = math.prod(shape)
        return torch.tensor(data.draw(st.lists(strategy, min_size=n, max_size=n)), dtype=torch.int64).view(shape)

    bc = tensor((batch, heads, rows), st.one_of(st.integers(0, nnz_s), st.sampled_from([-1, nnz_s + 3, I32_MAX])))
    cc = tensor((batch, heads, rows), st.one_of(st.integers(0, nnz_v), st.sampled_from([-1, nnz_v + 3, I32_MIN])))
    bo = tensor((batch, heads, rows, nnz_s), entry(seqlen_k))
    ci = tensor((batch, heads, rows, nnz_v), entry(seqlen_k))
    if data.draw(st.booleans(), "sorted lists"):  # convert's layout: ascending, blocks apart
        bo = bo.sort(-1)[0]
        ci = ci.sort(-1)[0]
    return [t.to(index_dtype) for t in (bc, bo, cc, ci)]


def _poison_unseen(k, v, masks, group):
    """NaN into the K/V rows of each request that no query head of their KV head sees.
    ``masks``: per request ``(key rows, [H, q, k] mask)``."""
    k, v = k.clone(), v.clone()
    for rows, mask in masks:
        seen = mask.any(1)  # [H, k]
        seen = seen.view(seen.shape[0] // group, group, seen.shape[-1]).any(1)  # [H_kv, k]
        for g in range(seen.shape[0]):
            unseen = rows[~seen[g]]
            k[unseen, g] = float("nan")
            v[unseen, g] = float("nan")
    return k, v


def _check(out, lse, ref_out, ref_lse, dtype, want_lse):
    assert not torch.isnan(out).any()
    assert_close(out.cpu(), ref_out, dtype)
    if want_lse:
        lse = lse.cpu().double()
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), (lse, ref_lse)
        fin = torch.isfinite(ref_lse)
        assert torch.allclose(lse[fin], ref_lse[fin], atol=LSE_TOL[dtype], rtol=LSE_TOL[dtype])


def _problem(data, varlen):
    hk = data.draw(st.integers(1, 2), "H_kv")
    group = data.draw(st.sampled_from([1, 2]), "group")
    head_dim = data.draw(st.sampled_from([16, 24, 32]), "D")
    block_m = data.draw(st.sampled_from([4, 6, 8, 16, 32]), "block_size_M")
    block_n = data.draw(st.sampled_from([1, 3, 4, 8, 16, 20]), "block_size_N")
    return dict(
        hk=hk, group=group, heads=hk * group, head_dim=head_dim, block_m=block_m, block_n=block_n,
        nnz_s=data.draw(st.integers(0, 4), "NNZ_S"), nnz_v=data.draw(st.integers(0, 6), "NNZ_V"),
        causal=data.draw(st.booleans(), "causal"), softcap=data.draw(st.sampled_from([0.0, 0.0, 2.5]), "softcap"),
        dtype=data.draw(st.sampled_from(FLOAT_DTYPES), "dtype"), want_lse=data.draw(st.booleans(), "lse"),
        index_dtype=data.draw(st.sampled_from([torch.int32, torch.int64]), "index dtype"),
        scale=data.draw(st.sampled_from([None, 0.3]), "softmax_scale"),
    )


@given(data=st.data())
def test_sparse_attn_func_matches_reference(data):
    p = _problem(data, varlen=False)
    batch = data.draw(st.integers(1, 2), "batch")  # empty problems: test_empty_inputs
    seqlen_q, seqlen_k = data.draw(st.integers(1, 16), "seqlen_q"), data.draw(st.integers(1, 20), "seqlen_k")
    rows = data.draw(st.integers(0, -(-seqlen_q // p["block_m"]) + 1), "NUM_ROWS")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    dtype, heads = p["dtype"], p["heads"]
    q = torch.randn(batch, seqlen_q, heads, p["head_dim"], generator=g).to(dtype)
    k = torch.randn(batch, seqlen_k, p["hk"], p["head_dim"], generator=g).to(dtype)
    v = torch.randn(batch, seqlen_k, p["hk"], p["head_dim"], generator=g).to(dtype)
    tables = _draw_tables(data, batch, heads, rows, p["nnz_s"], p["nnz_v"], seqlen_k, p["block_n"], p["index_dtype"])
    masks = [ref.vertical_slash_mask(*tables, b, seqlen_q, seqlen_k, p["block_m"], p["block_n"], p["causal"])
             for b in range(batch)]
    kp, vp = zip(*[_poison_unseen(k[b], v[b], [(torch.arange(seqlen_k), masks[b])], p["group"])
                   for b in range(batch)]) if batch else ([], [])
    k, v = (torch.stack(list(x)) if batch else y for x, y in ((kp, k), (vp, v)))
    scale = p["scale"] if p["scale"] is not None else p["head_dim"] ** -0.5
    ref_out, ref_lse = ref.sparse_attention(q, k, v, *tables, scale, p["causal"], p["softcap"], p["block_m"],
                                            p["block_n"])
    out = poison(torch.empty_like(q)).to(DEVICE) if data.draw(st.booleans(), "out=") else None
    res = sparse_attn_func(*_dev(q, k, v, *tables), softmax_scale=p["scale"], causal=p["causal"],
                           softcap=p["softcap"], return_softmax_lse=p["want_lse"], out=out,
                           block_size_M=p["block_m"], block_size_N=p["block_n"])
    got, lse = res if p["want_lse"] else (res, None)
    if out is not None:
        assert got is out
    assert got.shape == q.shape and got.dtype == dtype
    if p["want_lse"]:
        assert lse.shape == (batch, heads, seqlen_q) and lse.dtype == torch.float32
    _check(got, lse, ref_out, ref_lse, dtype, p["want_lse"])


@given(data=st.data())
def test_sparse_attn_varlen_func_matches_reference(data):
    p = _problem(data, varlen=True)
    batch = data.draw(st.integers(1, 3), "batch")
    q_lens = data.draw(st.lists(st.integers(0, 14), min_size=batch, max_size=batch), "q_lens")
    k_lens = data.draw(st.lists(st.integers(0, 16), min_size=batch, max_size=batch), "k_lens")
    pad_q, pad_k = data.draw(st.integers(0, 3), "q padding"), data.draw(st.integers(0, 3), "k padding")
    max_q = max(q_lens, default=0)
    rows = data.draw(st.integers(0, -(-max_q // p["block_m"]) + 1), "NUM_ROWS")
    cu_q = torch.tensor([0, *torch.tensor(q_lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(k_lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    total_q, total_k = int(cu_q[-1]) + pad_q, int(cu_k[-1]) + pad_k
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    dtype, heads = p["dtype"], p["heads"]
    q = torch.randn(total_q, heads, p["head_dim"], generator=g).to(dtype)
    k = torch.randn(total_k, p["hk"], p["head_dim"], generator=g).to(dtype)
    v = torch.randn(total_k, p["hk"], p["head_dim"], generator=g).to(dtype)
    tables = _draw_tables(data, batch, heads, rows, p["nnz_s"], p["nnz_v"], max(k_lens, default=0), p["block_n"],
                          p["index_dtype"])
    masks = [(torch.arange(int(cu_k[b]), int(cu_k[b + 1])),
              ref.vertical_slash_mask(*tables, b, q_lens[b], k_lens[b], p["block_m"], p["block_n"], p["causal"]))
             for b in range(batch)]
    k, v = _poison_unseen(k, v, masks, p["group"])
    k[int(cu_k[-1]):] = float("nan")  # padding rows of no request
    v[int(cu_k[-1]):] = float("nan")
    scale = p["scale"] if p["scale"] is not None else p["head_dim"] ** -0.5
    ref_out, ref_lse = ref.sparse_attention(q, k, v, *tables, scale, p["causal"], p["softcap"], p["block_m"],
                                            p["block_n"], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    out = poison(torch.empty_like(q)).to(DEVICE) if data.draw(st.booleans(), "out=") else None
    res = sparse_attn_varlen_func(*_dev(q, k, v, *tables, cu_q, cu_k), max_q, max(k_lens, default=0),
                                  softmax_scale=p["scale"], causal=p["causal"], softcap=p["softcap"],
                                  return_softmax_lse=p["want_lse"], out=out, block_size_M=p["block_m"],
                                  block_size_N=p["block_n"])
    got, lse = res if p["want_lse"] else (res, None)
    assert got.shape == q.shape
    if p["want_lse"]:
        assert lse.shape == (heads, total_q)
    _check(got, lse, ref_out, ref_lse, dtype, p["want_lse"])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mergehead", [False, True])
def test_sglang_pipeline_lines_to_tables_to_attention(dtype, mergehead):
    """What sglang's dual-chunk path runs: top verticals (ascending) and slashes (descending) per
    head, converted with 8 x 8 blocks, then causal sparse attention; the tables and the output
    against the references."""
    g = torch.Generator().manual_seed(3)
    heads, hk, d, ctx, kv_len, bm, bn = 4, 2, 32, 40, 48, 8, 8
    q = torch.randn(1, ctx, heads, d, generator=g).to(dtype)
    k = torch.randn(1, kv_len, hk, d, generator=g).to(dtype)
    v = torch.randn(1, kv_len, hk, d, generator=g).to(dtype)
    vertical = torch.stack([torch.randperm(kv_len, generator=g)[:6] for _ in range(heads)])[None].sort(-1)[0]
    slash = torch.stack([torch.randperm(kv_len, generator=g)[:5] for _ in range(heads)])[None]
    slash = slash.sort(-1, descending=True)[0]
    slash[..., -1] = 0  # the diagonal itself
    lens = (torch.tensor([ctx], dtype=torch.int32), torch.tensor([kv_len], dtype=torch.int32))
    idx = (vertical.to(torch.int32), slash.to(torch.int32))
    counts = (torch.tensor([6, 3, 0, 6], dtype=torch.int32), torch.tensor([5, 2, 5, 0], dtype=torch.int32))
    if mergehead:
        tables = convert_vertical_slash_indexes_mergehead(*_dev(*lens, *idx, *counts), ctx, bm, bn)
        expected = ref.convert_vertical_slash_indexes(*lens, *idx, ctx, bm, bn, True, *counts)
    else:
        tables = convert_vertical_slash_indexes(*_dev(*lens, *idx), ctx, bm, bn)
        expected = ref.convert_vertical_slash_indexes(*lens, *idx, ctx, bm, bn, True)
    assert all(torch.equal(a, b) for a, b in zip(_cpu_tables(tables), expected))
    out, lse = sparse_attn_func(*_dev(q, k, v), *tables, causal=True, return_softmax_lse=True,
                                block_size_M=bm, block_size_N=bn)
    ref_out, ref_lse = ref.sparse_attention(q, k, v, *expected, d ** -0.5, True, 0.0, bm, bn)
    _check(out, lse, ref_out, ref_lse, dtype, True)


@pytest.mark.parametrize("nnz_s", [0, 1, 3])
def test_dense_table_equals_dense_attention(nnz_s):
    """Upstream's check: blocks 0, N, ..., (NNZ_S - 1) N and every later key as a column cover
    all keys, so the result is dense attention."""
    g = torch.Generator().manual_seed(nnz_s)
    batch, sq, sk, heads, d, bm, bn = 2, 17, 29, 2, 32, 8, 8
    q = torch.randn(batch, sq, heads, d, generator=g)
    k = torch.randn(batch, sk, heads, d, generator=g)
    v = torch.randn(batch, sk, heads, d, generator=g)
    rows, nnz_v = -(-sq // bm), sk - nnz_s * bn
    bc = torch.full((batch, heads, rows), nnz_s, dtype=torch.int32)
    cc = torch.full((batch, heads, rows), nnz_v, dtype=torch.int32)
    bo = (torch.arange(nnz_s, dtype=torch.int32) * bn).expand(batch, heads, rows, nnz_s).contiguous()
    ci = (nnz_s * bn + torch.arange(nnz_v, dtype=torch.int32)).expand(batch, heads, rows, nnz_v).contiguous()
    out, lse = sparse_attn_func(*_dev(q, k, v, bc, bo, cc, ci), return_softmax_lse=True, block_size_M=bm,
                                block_size_N=bn)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * d ** -0.5
    dense = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v.double())
    _check(out, lse, dense, s.logsumexp(-1), torch.float32, True)


@pytest.mark.parametrize("case", ["column in a block", "column twice", "blocks overlap", "unsorted", "all"])
def test_keys_named_twice_count_once(case):
    """The union of a row's blocks and columns: a key named by two blocks, by a block and a
    column, or by two columns enters the softmax once (in any list order)."""
    g = torch.Generator().manual_seed(7)
    sq, sk, heads, d, bm, bn = 8, 32, 1, 16, 8, 4
    q, k, v = (torch.randn(1, n, heads, d, generator=g) for n in (sq, sk, sk))
    blocks, columns = {
        "column in a block": ([0, 8], [9, 20]),
        "column twice": ([0], [20, 20, 21]),
        "blocks overlap": ([4, 6, 20], [30]),
        "unsorted": ([20, 2, 0], [25, 3, 25, 1]),
        "all": ([12, 0, 14, 2], [13, 31, 1, 31, 14]),
    }[case]
    bc = torch.tensor([[[len(blocks)]]], dtype=torch.int32)
    cc = torch.tensor([[[len(columns)]]], dtype=torch.int32)
    bo = torch.tensor([[[blocks]]], dtype=torch.int32)
    ci = torch.tensor([[[columns]]], dtype=torch.int32)
    out, lse = sparse_attn_func(*_dev(q, k, v, bc, bo, cc, ci), return_softmax_lse=True, block_size_M=bm,
                                block_size_N=bn)
    ref_out, ref_lse = ref.sparse_attention(q, k, v, bc, bo, cc, ci, d ** -0.5, False, 0.0, bm, bn)
    _check(out, lse, ref_out, ref_lse, torch.float32, True)


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("head_dim, block_dv", [(128, 64), (64, 32), (24, 16)])
def test_output_channel_slices(monkeypatch, head_dim, block_dv, varlen):
    """The Intel tiles (``_xpu_tiles``: output channels in ``BLOCK_DV``-wide slices, one program
    each, repeating the score dot; LSE from the first slice), forced onto any backend: equal the
    reference with duplicates, out-of-range keys, causal + LSE, softcap, padded head dims."""
    from triton_xpu_attn.ops import vertical_slash as vs

    tiles = vs._tiles

    def sliced(block_m, hd):
        cfg = tiles(block_m, hd)
        xpu = vs._xpu_tiles(cfg["BLOCK_M"], cfg["HEAD_DIM"])
        cfg.update(BLOCK_M=xpu["BLOCK_M"], TILE_M=xpu["TILE_M"], BLOCK_N=xpu["BLOCK_N"], BLOCK_DV=block_dv)
        return cfg

    monkeypatch.setattr(vs, "_tiles", sliced)
    g = torch.Generator().manual_seed(head_dim + varlen)
    sq, sk, hk, group, bm, bn = 12, 40, 1, 2, 8, 8
    heads, rows, batch = hk * group, 2, 1
    q = torch.randn(batch, sq, heads, head_dim, generator=g)
    k, v = (torch.randn(batch, sk, hk, head_dim, generator=g) for _ in range(2))
    bc = torch.tensor([3, 2] * heads, dtype=torch.int32).view(batch, heads, rows)
    cc = torch.tensor([4, 3] * heads, dtype=torch.int32).view(batch, heads, rows)
    bo = torch.randint(-4, sk + 2, (batch, heads, rows, 3), generator=g, dtype=torch.int32)
    ci = torch.randint(-2, sk + 2, (batch, heads, rows, 4), generator=g, dtype=torch.int32)
    tables = (bc, bo, cc, ci)
    causal, softcap = (False, 2.0) if varlen else (True, 0.0)
    ref_out, ref_lse = ref.sparse_attention(q, k, v, *tables, head_dim ** -0.5, causal, softcap, bm, bn)
    if varlen:
        cu_q = torch.tensor([0, sq], dtype=torch.int32)
        cu_k = torch.tensor([0, sk], dtype=torch.int32)
        out, lse = sparse_attn_varlen_func(*_dev(q[0], k[0], v[0], *tables, cu_q, cu_k), sq, sk, causal=causal,
                                           softcap=softcap, return_softmax_lse=True, block_size_M=bm,
                                           block_size_N=bn)
        out, lse = out[None], lse[None]
    else:
        out, lse = sparse_attn_func(*_dev(q, k, v, *tables), causal=causal, softcap=softcap,
                                    return_softmax_lse=True, out=poison(torch.empty_like(q)).to(DEVICE),
                                    block_size_M=bm, block_size_N=bn)
    _check(out, lse, ref_out, ref_lse, torch.float32, True)


def test_empty_inputs():
    i32 = torch.int32
    # no batch, no queries, no keys, no rows, no lines: zeros and -inf, no NaN
    for b, sq, sk, rows in [(0, 4, 4, 1), (1, 0, 4, 0), (1, 5, 0, 1), (1, 5, 6, 0)]:
        q, k = torch.randn(b, sq, 2, 16), torch.randn(b, sk, 1, 16)
        tables = (torch.ones(b, 2, rows, dtype=i32), torch.zeros(b, 2, rows, 0, dtype=i32),
                  torch.ones(b, 2, rows, dtype=i32), torch.zeros(b, 2, rows, 0, dtype=i32))
        out, lse = sparse_attn_func(*_dev(q, k, k, *tables), causal=True, return_softmax_lse=True)
        assert out.shape == q.shape and lse.shape == (b, 2, sq)
        assert not out.any() and bool((lse == -math.inf).all())
    cu = torch.zeros(1, dtype=i32)
    q = torch.randn(3, 2, 16)
    out, lse = sparse_attn_varlen_func(*_dev(q, q[:, :1], q[:, :1], *(t[:0] for t in tables), cu, cu), 0, 0,
                                       return_softmax_lse=True)
    assert not out.any() and bool((lse == -math.inf).all())
    for context, batch in [(0, 1), (8, 0)]:
        got = convert_vertical_slash_indexes(*_dev(torch.full((batch,), 8, dtype=i32), torch.full((batch,), 8, dtype=i32),
                                                   torch.zeros(batch, 2, 3, dtype=i32), torch.zeros(batch, 2, 2, dtype=i32)),
                                             context, 4, 4)
        assert [tuple(t.shape) for t in got] == [(batch, 2, -(-context // 4)), (batch, 2, -(-context // 4), 2),
                                                 (batch, 2, -(-context // 4)), (batch, 2, -(-context // 4), 3)]


def _args(**change):
    i32 = torch.int32
    q, k = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 1, 16)
    base = dict(q=q, k=k, v=k.clone(), block_count=torch.ones(1, 2, 1, dtype=i32),
                block_offset=torch.zeros(1, 2, 1, 1, dtype=i32), column_count=torch.zeros(1, 2, 1, dtype=i32),
                column_index=torch.zeros(1, 2, 1, 1, dtype=i32))
    base.update(change)
    return {n: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for n, t in base.items()}


@pytest.mark.parametrize("change, error, name", [
    (dict(dropout_p=0.1), ValueError, "dropout_p"),
    (dict(alibi_slopes=torch.zeros(2)), ValueError, "alibi_slopes"),
    (dict(block_count=torch.ones(1, 2, 1)), TypeError, "block_count"),
    (dict(block_offset=torch.zeros(1, 2, 2, 1, dtype=torch.int32)), ValueError, "block_offset"),
    (dict(column_index=torch.zeros(1, 3, 1, 1, dtype=torch.int32)), ValueError, "column_index"),
    (dict(k=torch.randn(1, 8, 3, 16), v=torch.randn(1, 8, 3, 16)), ValueError, "k"),
    (dict(v=torch.randn(1, 8, 1, 16).half()), TypeError, "v"),
    (dict(block_size_M=0), ValueError, "block_size_M"),
    (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(causal=1), TypeError, "causal"),
    (dict(out=torch.empty(1, 8, 2, 8)), ValueError, "out"),
])
def test_bad_arguments_are_named(change, error, name):
    with pytest.raises(error, match=name):
        sparse_attn_func(**_args(**change))


def test_convert_bad_arguments_are_named():
    i32 = torch.int32
    lens = _dev(torch.tensor([4], dtype=i32), torch.tensor([4], dtype=i32))
    lines = _dev(torch.zeros(1, 2, 3, dtype=i32), torch.zeros(1, 2, 2, dtype=i32))
    with pytest.raises(TypeError, match="vertical_indexes"):
        convert_vertical_slash_indexes(*lens, lines[0].float(), lines[1], 4, 2, 2)
    with pytest.raises(ValueError, match="slash_indexes"):
        convert_vertical_slash_indexes(*lens, lines[0], lines[1][:, :1], 4, 2, 2)
    with pytest.raises(ValueError, match="block_size_N"):
        convert_vertical_slash_indexes(*lens, *lines, 4, 2, 0)
    with pytest.raises(ValueError, match="slash_indices_count"):
        convert_vertical_slash_indexes_mergehead(*lens, *lines, *_dev(torch.ones(2, dtype=i32), torch.ones(3, dtype=i32)),
                                                 4, 2, 2)


# ---------------------------------------------------------------------------------------------
# custom ops, compat
# ---------------------------------------------------------------------------------------------


def _op_inputs():
    g = torch.Generator().manual_seed(0)
    i32 = torch.int32
    lens = (torch.tensor([12, 9], dtype=i32), torch.tensor([12, 11], dtype=i32))
    lines = (torch.randint(0, 12, (2, 2, 3), generator=g, dtype=i32).sort(-1)[0],
             torch.randint(0, 12, (2, 2, 2), generator=g, dtype=i32).sort(-1, descending=True)[0])
    counts = (torch.tensor([3, 1], dtype=i32), torch.tensor([2, 0], dtype=i32))
    q = torch.randn(2, 12, 2, 16, generator=g)
    k = torch.randn(2, 12, 1, 16, generator=g)
    return [t.to(DEVICE) for t in (*lens, *lines, *counts, q, k)]


def test_custom_ops_opcheck_and_equal_the_functions():
    ql, kl, vert, sl, vc, sc, q, k = _op_inputs()
    cases = [
        (C.convert_vertical_slash_indexes, (ql, kl, vert, sl, 12, 4, 4), {}, convert_vertical_slash_indexes),
        (C.convert_vertical_slash_indexes_mergehead, (ql, kl, vert, sl, vc, sc, 12, 4, 4), dict(causal=False),
         convert_vertical_slash_indexes_mergehead),
    ]
    for op, args, kwargs, fn in cases:
        result = torch.library.opcheck(op, args, kwargs)
        assert all(v == "SUCCESS" for v in result.values()), result
        assert all(torch.equal(a, b) for a, b in zip(op(*args, **kwargs), fn(*args, **kwargs)))
    tables = convert_vertical_slash_indexes(ql, kl, vert, sl, 12, 4, 4)
    kw = dict(causal=True, return_softmax_lse=True, block_size_M=4, block_size_N=4)
    result = torch.library.opcheck(C.sparse_attn_func, (q, k, k, *tables), kw)
    assert all(v == "SUCCESS" for v in result.values()), result
    out, lse = C.sparse_attn_func(q, k, k, *tables, **kw)
    want = sparse_attn_func(q, k, k, *tables, **kw)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    out, lse = C.sparse_attn_func(q, k, k, *tables, causal=True, block_size_M=4, block_size_N=4)
    assert lse.shape == (0,) and torch.equal(out, want[0])
    cu_q = torch.tensor([0, 12, 21], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 12, 23], dtype=torch.int32, device=DEVICE)
    vq, vk = q.reshape(24, 2, 16)[:21], k.reshape(24, 1, 16)[:23]
    args = (vq, vk, vk, *tables, cu_q, cu_k, 12, 12)
    result = torch.library.opcheck(C.sparse_attn_varlen_func, args, kw)
    assert all(v == "SUCCESS" for v in result.values()), result
    out, lse = C.sparse_attn_varlen_func(*args, **kw)
    want = sparse_attn_varlen_func(*args, **kw)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])


def test_compat_module_sgl_kernel_sparse_flash_attn():
    import inspect

    import triton_xpu_attn
    from triton_xpu_attn.compat.sgl_kernel import sparse_flash_attn as sfa
    import triton_xpu_attn.compat.sgl_kernel as sgl

    for name in ("sparse_attn_func", "sparse_attn_varlen_func", "convert_vertical_slash_indexes",
                 "convert_vertical_slash_indexes_mergehead"):
        assert getattr(sfa, name) is getattr(triton_xpu_attn, name)
        assert getattr(sgl, name) is getattr(triton_xpu_attn, name)  # the root re-exports them, as upstream's
    assert list(inspect.signature(sfa.sparse_attn_func).parameters) == [
        "q", "k", "v", "block_count", "block_offset", "column_count", "column_index", "dropout_p", "softmax_scale",
        "causal", "softcap", "alibi_slopes", "deterministic", "return_attn_probs", "return_softmax_lse", "out",
        "block_size_M", "block_size_N"]
    assert list(inspect.signature(sfa.sparse_attn_varlen_func).parameters)[7:11] == [
        "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]
