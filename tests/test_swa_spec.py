import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import triton_xpu_attn
from helpers import DEVICE, FLOAT_DTYPES, assert_close, poison
from triton_xpu_attn import prepare_swa_spec_page_table, translate_loc_from_full_to_swa
from triton_xpu_attn import reference as ref
from triton_xpu_attn._common import COMPILE_VARIANTS
from triton_xpu_attn.ops import swa_spec

POISON = -123456


def _t(values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def _expand_table(draft_slots, mask):
    """sglang's expand table for one request: each draft token's row holds the request's draft
    slots, visible ones first (stable order), and its length is the mask's row sum (§2.1)."""
    ndt = mask.shape[0]
    key = torch.arange(ndt)[None, :] + ndt * (~mask).long()
    order = torch.sort(key, dim=1, stable=True).indices
    return draft_slots[order], mask.sum(1)


def _random_tree_mask(ndt, gen):
    """Random EAGLE draft tree: token 0 is the root, token j > 0 hangs under one of 0..j-1;
    row j marks j's ancestors and j itself."""
    parent = [-1] + [int(torch.randint(0, j, (1,), generator=gen)) for j in range(1, ndt)]
    mask = torch.zeros(ndt, ndt, dtype=torch.bool)
    for j in range(ndt):
        k = j
        while k >= 0:
            mask[j, k] = True
            k = parent[k]
    return mask


# ---------------------------------------------------------------- hand-computed examples


def test_section_7_3_example():
    # B=1, ndt=3, prefix slots [10..13], draft slots [14,15,16], tree rows [1,0,0],[1,1,0],[1,0,1]
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    table_b, len_b = _expand_table(torch.tensor([14, 15, 16], dtype=torch.int32), mask)
    assert table_b.tolist() == [[14, 15, 16], [14, 15, 16], [14, 16, 15]]
    assert len_b.tolist() == [1, 2, 2]
    table_a = torch.tensor([[10, 11, 12, 13]], dtype=torch.int32)
    len_a = torch.tensor([4], dtype=torch.int32)
    len_b = len_b.to(torch.int32)
    dst = torch.zeros(3, 4 + 3, dtype=torch.int32)  # the caller's zeros(B*ndt, max_seq_len_k + ndt)
    expected = [
        [10, 11, 12, 13, 14, 0, 0],
        [10, 11, 12, 13, 14, 15, 0],
        [10, 11, 12, 13, 14, 16, 0],
    ]
    assert ref.prepare_swa_spec_page_table(dst, table_a, table_b, len_a, len_b, 3).tolist() == expected
    assert (len_a.repeat_interleave(3) + len_b).tolist() == [5, 6, 6]  # cache_seqlens_swa
    out = poison(torch.empty(3, 7, dtype=torch.int32, device=DEVICE))
    got = prepare_swa_spec_page_table(out, table_a.to(DEVICE), table_b.to(DEVICE), len_a.to(DEVICE), len_b.to(DEVICE), 3)
    assert got is out
    cut = POISON
    assert got.cpu().tolist() == [
        [10, 11, 12, 13, 14, cut, cut],
        [10, 11, 12, 13, 14, 15, cut],
        [10, 11, 12, 13, 14, 16, cut],
    ]


def test_per_row_lengths_and_starts_example():
    # ndt=2: row 0 copies A[0, 1:3] then B[0, :1]; row 1 copies A[0, 4:7] then B[1, :2]
    table_a = [[1, 2, 3, 4, 5, 6, 7, 8]]
    table_b = [[50, 51], [60, 61]]
    args = ([[0] * 6] * 2, table_a, table_b, [2, 3], [1, 2], 2)
    expected = [[2, 3, 50, 0, 0, 0], [5, 6, 7, 60, 61, 0]]
    got_ref = ref.prepare_swa_spec_page_table(*[torch.tensor(a) if isinstance(a, list) else a for a in args], seq_start_a=torch.tensor([1, 4]))
    assert got_ref.tolist() == expected
    got = prepare_swa_spec_page_table(*[_t(a) if isinstance(a, list) else a for a in args], seq_start_a=_t([1, 4]))
    assert got.cpu().tolist() == expected


def test_translation_and_out_of_width_reads_example():
    # mapping: full 0 -> 7, 3 -> 30, 4 -> 40, 9 -> 90, last entry -1 (so slot -1 -> -1); 12 is outside
    mapping = torch.zeros(11, dtype=torch.int64)
    mapping[0], mapping[3], mapping[4], mapping[9], mapping[-1] = 7, 30, 40, 90, -1
    table_a = [[3, 0, 12]]
    table_b = [[9, -1]]
    # la = 5 > A's width 3: columns 3 and 4 read past A and give 0, untranslated; slot 0 -> 7
    dst = poison(torch.empty(1, 9, dtype=torch.int64, device=DEVICE))
    got = prepare_swa_spec_page_table(
        dst, _t(table_a), _t(table_b, torch.int64), _t([5]), _t([3]), 1, full_to_swa=mapping.to(DEVICE)
    )
    expected = [[30, 7, -1, 0, 0, 90, -1, 0, POISON]]
    assert got.cpu().tolist() == expected
    assert ref.prepare_swa_spec_page_table(
        torch.full((1, 9), POISON, dtype=torch.int64), torch.tensor(table_a), torch.tensor(table_b), torch.tensor([5]),
        torch.tensor([3]), 1, full_to_swa=mapping,
    ).tolist() == expected


# ---------------------------------------------------------------- property test vs the reference


def _strided(t, transpose):
    """Same values, other strides: a column-major copy, or a slice of a wider buffer."""
    if transpose:
        return t.T.contiguous().T
    wide = torch.full((t.shape[0], t.shape[1] + 3), 77, dtype=t.dtype)
    wide[:, 1 : 1 + t.shape[1]] = t
    return wide[:, 1 : 1 + t.shape[1]]


@given(
    batch=st.integers(0, 3),
    ndt=st.integers(1, 4),
    widths=st.tuples(st.integers(0, 12), st.integers(0, 5), st.integers(0, 20)),
    dtypes=st.tuples(*[st.sampled_from([torch.int32, torch.int64])] * 4),
    len_a_per_row=st.booleans(),
    start_mode=st.sampled_from([None, "row", "request"]),
    mapped=st.booleans(),
    transposes=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=max(30, settings.default.max_examples))  # cheap: more cases than the ci profile's 6
def test_matches_reference(batch, ndt, widths, dtypes, len_a_per_row, start_mode, mapped, transposes, seed):
    gen = torch.Generator().manual_seed(seed)
    rows = batch * ndt
    len_a_w, len_b_w, dst_w = widths
    map_len = 40
    table_a = torch.randint(-1, map_len + 3, (batch, len_a_w), generator=gen).to(dtypes[0])
    table_b = torch.randint(-1, map_len + 3, (rows, len_b_w), generator=gen).to(dtypes[1])
    # lengths reach past the tables' widths (reads give 0), past dst's width (dropped) and below 0
    seq_len_a = torch.randint(-1, len_a_w + 4, (rows if len_a_per_row else batch,), generator=gen).to(dtypes[2])
    seq_len_b = torch.randint(-1, len_b_w + 3, (rows,), generator=gen).to(dtypes[2])
    seq_start_a = None
    if start_mode is not None:
        seq_start_a = torch.randint(-1, 5, (rows if start_mode == "row" else batch,), generator=gen).to(dtypes[3])
    full_to_swa = None
    if mapped:
        full_to_swa = torch.randint(0, 10**6, (map_len,), generator=gen, dtype=torch.int64)
        full_to_swa[-1] = -1
    dst = torch.full((rows, dst_w), POISON, dtype=dtypes[3])
    expected = ref.prepare_swa_spec_page_table(
        dst, table_a, table_b, seq_len_a, seq_len_b, ndt, seq_start_a=seq_start_a, full_to_swa=full_to_swa
    )
    out = _strided(dst, transposes[2]).to(DEVICE)
    got = prepare_swa_spec_page_table(
        out,
        _strided(table_a, transposes[0]).to(DEVICE),
        _strided(table_b, transposes[1]).to(DEVICE),
        seq_len_a.to(DEVICE),
        seq_len_b.to(DEVICE),
        ndt,
        seq_start_a=None if seq_start_a is None else seq_start_a.to(DEVICE),
        full_to_swa=None if full_to_swa is None else full_to_swa.to(DEVICE),
    )
    assert got is out
    assert torch.equal(got.cpu(), expected)
    # columns from la + lb on stay untouched (poisoned), independently of the reference
    la = seq_len_a.long().clamp(min=0)
    la = la if la.numel() == rows else la.repeat_interleave(ndt)
    total = la + seq_len_b.long().clamp(min=0)
    cols = torch.arange(dst_w)[None, :]
    assert (got.cpu()[cols >= total[:, None]] == POISON).all()
    assert (got.cpu()[cols < total[:, None]] != POISON).all()


def test_wide_table_loops_over_column_tiles(monkeypatch):
    # cap the grid's column programs at 2 so each program handles several 1024-column tiles
    monkeypatch.setattr(swa_spec, "MAX_GRID_DIM_1", 2)
    gen = torch.Generator().manual_seed(0)
    table_a = torch.randint(0, 1000, (1, 3000), generator=gen, dtype=torch.int32)
    table_b = torch.randint(0, 1000, (2, 40), generator=gen, dtype=torch.int32)
    args = (table_a, table_b, torch.tensor([2990], dtype=torch.int32), torch.tensor([30, 5], dtype=torch.int32), 2)
    dst = torch.full((2, 3100), POISON, dtype=torch.int32)
    expected = ref.prepare_swa_spec_page_table(dst, *args, seq_start_a=torch.tensor([3, 0]))
    got = prepare_swa_spec_page_table(
        dst.to(DEVICE), *[a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args],
        seq_start_a=torch.tensor([3, 0], device=DEVICE),
    )
    assert torch.equal(got.cpu(), expected)


def test_fused_translation_equals_translating_afterwards():
    # in-width reads only: fusing the mapping = translate_loc_from_full_to_swa of the plain table
    gen = torch.Generator().manual_seed(5)
    batch, ndt, rows = 2, 3, 6
    table_a = torch.randint(-1, 30, (batch, 10), generator=gen, dtype=torch.int32).to(DEVICE)
    table_b = torch.randint(-1, 30, (rows, ndt), generator=gen, dtype=torch.int32).to(DEVICE)
    len_a = torch.randint(0, 11, (batch,), generator=gen, dtype=torch.int32).to(DEVICE)
    len_b = torch.randint(0, ndt + 1, (rows,), generator=gen, dtype=torch.int32).to(DEVICE)
    mapping = torch.randint(0, 500, (30,), generator=gen, dtype=torch.int64)
    mapping[-1] = -1
    mapping = mapping.to(DEVICE)
    plain = prepare_swa_spec_page_table(torch.zeros(rows, 13, dtype=torch.int32, device=DEVICE), table_a, table_b, len_a, len_b, ndt)
    fused = prepare_swa_spec_page_table(
        torch.zeros(rows, 13, dtype=torch.int32, device=DEVICE), table_a, table_b, len_a, len_b, ndt, full_to_swa=mapping
    )
    total = (len_a.repeat_interleave(ndt) + len_b).cpu()
    produced = torch.arange(13)[None, :] < total[:, None]
    assert torch.equal(fused.cpu()[produced], translate_loc_from_full_to_swa(mapping, plain).cpu()[produced])
    assert (fused.cpu()[~produced] == 0).all()


def test_empty_inputs():
    empty = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    dst = torch.zeros(0, 5, dtype=torch.int32, device=DEVICE)
    got = prepare_swa_spec_page_table(
        dst, torch.zeros(0, 4, dtype=torch.int32, device=DEVICE), torch.zeros(0, 2, dtype=torch.int32, device=DEVICE),
        empty, empty, 3, validate=True, swa_pool_size=8,
    )
    assert got is dst and got.shape == (0, 5)
    # zero-width destination with zero lengths: nothing to write, validation passes
    dst = torch.zeros(2, 0, dtype=torch.int32, device=DEVICE)
    got = prepare_swa_spec_page_table(
        dst, torch.zeros(1, 4, dtype=torch.int32, device=DEVICE), torch.zeros(2, 2, dtype=torch.int32, device=DEVICE),
        _t([0]), _t([0, 0]), 2, validate=True,
    )
    assert got.shape == (2, 0)


# ---------------------------------------------------------------- validate=True


def _small_case():
    return dict(
        page_table_a=_t([[4, 5, 6]]),
        page_table_b=_t([[7], [8]]),
        seq_len_a=_t([3]),
        seq_len_b=_t([1, 1]),
        num_draft_tokens=2,
    )


def _call(dst_width=5, **overrides):
    kw = _small_case()
    kw.update(overrides)
    dst = kw.pop("page_table_dst", None)
    if dst is None:
        dst = torch.zeros(2, dst_width, dtype=torch.int32, device=DEVICE)
    return prepare_swa_spec_page_table(
        dst, kw.pop("page_table_a"), kw.pop("page_table_b"), kw.pop("seq_len_a"), kw.pop("seq_len_b"),
        kw.pop("num_draft_tokens"), **kw,
    )


def test_validate_accepts_good_input():
    got = _call(validate=True, swa_pool_size=9)
    assert got.cpu().tolist() == [[4, 5, 6, 7, 0], [4, 5, 6, 8, 0]]


def test_validate_rejects_slot_outside_swa_pool():
    with pytest.raises(ValueError, match=r"outside the SWA pool \[0, 8\).*page_table_dst\[1, 3\] = 8"):
        _call(validate=True, swa_pool_size=8)


def test_validate_rejects_untranslatable_slot():
    mapping = torch.zeros(8, dtype=torch.int64, device=DEVICE)  # slot 8 is outside: translates to -1
    mapping[4:8] = torch.tensor([1, 2, 3, 4])
    mapping[-1] = -1
    with pytest.raises(ValueError, match="= -1"):
        _call(validate=True, swa_pool_size=100, full_to_swa=mapping)


def test_validate_rejects_narrow_destination():
    with pytest.raises(ValueError, match="too narrow"):
        _call(dst_width=3, validate=True)
    # without validate the launch reads no lengths on the host: columns past the width are dropped
    assert _call(dst_width=3).cpu().tolist() == [[4, 5, 6], [4, 5, 6]]


def test_validate_rejects_negative_lengths():
    with pytest.raises(ValueError, match="seq_len_b"):
        _call(validate=True, seq_len_b=_t([1, -1]))
    with pytest.raises(ValueError, match="seq_start_a"):
        _call(validate=True, seq_start_a=_t([0, -2]))


# ---------------------------------------------------------------- invalid input, one class per test


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        (dict(page_table_a=torch.zeros(1, 3)), TypeError, "page_table_a"),
        (dict(page_table_b=torch.zeros(2, dtype=torch.int32)), ValueError, "page_table_b"),
        (dict(page_table_dst=torch.zeros(2, 5, dtype=torch.int16)), TypeError, "page_table_dst"),
        (dict(page_table_dst=torch.zeros(3, 5, dtype=torch.int32)), ValueError, "page_table_dst"),
        (dict(page_table_a=torch.zeros(2, 3, dtype=torch.int32)), ValueError, "page_table_a"),
        (dict(page_table_b=torch.zeros(1, 1, dtype=torch.int32)), ValueError, "page_table_b"),
        (dict(seq_len_a=torch.zeros(3, dtype=torch.int32)), ValueError, "seq_len_a"),
        (dict(seq_len_a=torch.zeros(1, dtype=torch.float32)), TypeError, "seq_len_a"),
        (dict(seq_len_b=torch.zeros(3, dtype=torch.int32)), ValueError, "num_draft_tokens"),
        (dict(seq_len_b=torch.zeros(2, 1, dtype=torch.int32)), ValueError, "seq_len_b"),
        (dict(seq_start_a=torch.zeros(3, dtype=torch.int32)), ValueError, "seq_start_a"),
        (dict(num_draft_tokens=0), ValueError, "num_draft_tokens"),
        (dict(num_draft_tokens=2.0), TypeError, "num_draft_tokens"),
        (dict(full_to_swa=torch.zeros(2, 2, dtype=torch.int64)), ValueError, "full_to_swa"),
        (dict(full_to_swa=torch.zeros(4)), TypeError, "full_to_swa"),
        (dict(validate=True, swa_pool_size=0), ValueError, "swa_pool_size"),
        (dict(swa_pool_size=8), ValueError, "swa_pool_size"),
        (dict(validate=1), TypeError, "validate"),
    ],
)
def test_rejects_bad_input(overrides, error, match):
    overrides = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in overrides.items()}
    with pytest.raises(error, match=match):
        _call(**overrides)


def test_kernels_are_registered_for_the_xpu_compile_check():
    registered = {getattr(v.kernel, "fn", v.kernel) for v in COMPILE_VARIANTS}
    kernels = [getattr(swa_spec, n) for n in dir(swa_spec) if n.endswith("_kernel")]
    assert kernels and all(getattr(k, "fn", k) in registered for k in kernels)


# ---------------------------------------------------------------- end to end: tree verify on a hybrid pool


def _hybrid_pool(batch, ndt, prefix_lens, window, page_size, gen):
    """A full pool and a smaller SWA pool, both paged with ``page_size``, as sglang's SWA
    allocator leaves them. Full pages are drawn above the SWA pool's slot range (so an
    untranslated slot is always outside the SWA pool); SWA pages hold only the tokens some draft
    token's window can reach, every other full slot maps to 0 (freed -> the dummy slot).

    Returns req_to_token (full slots), full_to_swa, the SWA slot of each (request, position) as a
    dict, and the SWA pool's slot count."""
    need = [-(-(n + ndt) // page_size) for n in prefix_lens]
    swa_pages_needed = sum(-(-(window + 1 + ndt) // page_size) + 1 for _ in range(batch))
    num_swa_pages = 1 + swa_pages_needed + 2  # page 0 is the dummy page
    num_full_pages = num_swa_pages + sum(need) + 5
    full_pages = (torch.randperm(num_full_pages - num_swa_pages, generator=gen) + num_swa_pages).tolist()
    swa_pages = (torch.randperm(num_swa_pages - 1, generator=gen) + 1).tolist()
    width = max(n + ndt for n in prefix_lens)
    req_to_token = torch.zeros(batch, width, dtype=torch.int32)
    full_to_swa = torch.zeros(num_full_pages * page_size + 1, dtype=torch.int64)
    full_to_swa[-1] = -1
    swa_slot = {}
    for r, n in enumerate(prefix_lens):
        pages = [full_pages.pop() for _ in range(need[r])]
        for pos in range(n + ndt):
            req_to_token[r, pos] = pages[pos // page_size] * page_size + pos % page_size
        oldest_visible = max(0, n + 1 - (window + 1))  # a root draft at position n sees n - window on
        for p in range(oldest_visible // page_size, need[r]):
            swa_page = swa_pages.pop()
            for off in range(page_size):
                pos = p * page_size + off
                full_to_swa[pages[p] * page_size + off] = swa_page * page_size + off
                swa_slot[(r, pos)] = swa_page * page_size + off
    return req_to_token, full_to_swa, swa_slot, num_swa_pages * page_size


def _attention(q, k_cache, v_cache, cache_seqlens, page_table, window):
    """flash_attn_with_kvcache when the package has it, else the reference (one query per row)."""
    rows = q.shape[0]
    kwargs = dict(
        cache_seqlens=cache_seqlens, page_table=page_table,
        cu_seqlens_q=torch.arange(rows + 1, dtype=torch.int32, device=q.device),
        causal=True, window_size=(window, 0),
    )
    fa = getattr(triton_xpu_attn, "flash_attn_with_kvcache", None)
    if fa is not None:
        return fa(q, k_cache, v_cache, max_seqlen_q=1, **kwargs)
    return ref.paged_attention(q, k_cache, v_cache, **kwargs)[0]


@pytest.mark.parametrize("page_size, dtype, seed", [(1, torch.float32, 0), (16, torch.float32, 1), (1, FLOAT_DTYPES[0], 2), (16, FLOAT_DTYPES[0], 3)])
def test_tree_verify_end_to_end_on_hybrid_pool(page_size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, ndt, num_q_heads, num_kv_heads, head_dim = 2, 4, 4, 2, 64
    window = int(torch.randint(1, 8, (1,), generator=gen))
    prefix_lens = torch.randint(1, 24, (batch,), generator=gen).tolist()
    req_to_token, full_to_swa, swa_slot, swa_pool_size = _hybrid_pool(batch, ndt, prefix_lens, window, page_size, gen)

    # target-verify metadata (§2.1, §7.3): prefix table A, expand table B (visible drafts first)
    table_a = req_to_token[:, : max(prefix_lens)].clone()
    masks = [_random_tree_mask(ndt, gen) for _ in range(batch)]
    assert any(mask.sum() < ndt * (ndt + 1) // 2 for mask in masks)  # a real tree (topk > 1), not a chain
    expand = [_expand_table(req_to_token[r, prefix_lens[r] : prefix_lens[r] + ndt], masks[r]) for r in range(batch)]
    table_b = torch.cat([e[0] for e in expand])
    len_b = torch.cat([e[1] for e in expand]).to(torch.int32)
    len_a = torch.tensor(prefix_lens, dtype=torch.int32)
    rows = batch * ndt
    args = [table_a.to(DEVICE), table_b.to(DEVICE), len_a.to(DEVICE), len_b.to(DEVICE), ndt]

    # the seed's bug: untranslated full-pool slots index the SWA pool -> caught by validate=True
    with pytest.raises(ValueError, match="outside the SWA pool"):
        prepare_swa_spec_page_table(
            torch.zeros(rows, table_a.shape[1] + ndt, dtype=torch.int32, device=DEVICE), *args,
            validate=True, swa_pool_size=swa_pool_size,
        )
    swa_table = prepare_swa_spec_page_table(
        torch.zeros(rows, table_a.shape[1] + ndt, dtype=torch.int32, device=DEVICE), *args,
        full_to_swa=full_to_swa.to(DEVICE), validate=True, swa_pool_size=swa_pool_size,
    )

    # SWA-layer KV (different data from the full layers'), paged; slot 0 (dummy) holds junk
    num_pages = swa_pool_size // page_size
    k_swa = torch.randn(num_pages, page_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_swa = torch.randn(num_pages, page_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    k_swa[0], v_swa[0] = 30.0, -30.0
    q = torch.randn(rows, num_q_heads, head_dim, generator=gen).to(dtype)
    cache_seqlens = (len_a.repeat_interleave(ndt) + len_b).to(torch.int32)
    # token-granular table -> page-size-1 view of the paged SWA pool
    out = _attention(
        q.to(DEVICE), k_swa.to(DEVICE).view(-1, 1, num_kv_heads, head_dim), v_swa.to(DEVICE).view(-1, 1, num_kv_heads, head_dim),
        cache_seqlens.to(DEVICE), swa_table, window,
    )

    # expected, by hand: each draft token attends to the last window+1 of "prefix + its ancestors
    # incl. itself", gathered from the SWA pool through the allocator's own records
    k_flat = k_swa.reshape(-1, num_kv_heads, head_dim).double()
    v_flat = v_swa.reshape(-1, num_kv_heads, head_dim).double()
    group = num_q_heads // num_kv_heads
    expected = torch.zeros(rows, num_q_heads, head_dim, dtype=torch.float64)
    for m in range(rows):
        r, i = divmod(m, ndt)
        positions = list(range(prefix_lens[r])) + [prefix_lens[r] + j for j in range(ndt) if masks[r][i, j]]
        slots = [swa_slot[(r, pos)] for pos in positions[-(window + 1) :]]
        k = k_flat[slots].repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = v_flat[slots].repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[m].double(), k) / math.sqrt(head_dim)
        expected[m] = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), v)
    assert_close(out, expected, dtype, "tree-verify SWA attention")


# ---------------------------------------------------------------- GPU: serving-size tables


@pytest.mark.gpu
@pytest.mark.parametrize("mapped", [False, True])
def test_serving_size_matches_reference(mapped):
    gen = torch.Generator().manual_seed(7)
    batch, ndt, len_a_w = 128, 8, 32768
    rows = batch * ndt
    table_a = torch.randint(0, 2**20, (batch, len_a_w), generator=gen, dtype=torch.int32)
    table_b = torch.randint(0, 2**20, (rows, ndt), generator=gen, dtype=torch.int32)
    seq_len_a = torch.randint(0, len_a_w + 1, (batch,), generator=gen, dtype=torch.int32)
    seq_len_b = torch.randint(1, ndt + 1, (rows,), generator=gen, dtype=torch.int32)
    full_to_swa = None
    if mapped:
        full_to_swa = torch.randint(0, 2**18, (2**20 + 1,), generator=gen, dtype=torch.int64)
        full_to_swa[-1] = -1
    dst = poison(torch.empty(rows, len_a_w + ndt, dtype=torch.int32))
    args = [table_a, table_b, seq_len_a, seq_len_b, ndt]
    expected = ref.prepare_swa_spec_page_table(dst, *args, full_to_swa=full_to_swa)
    got = prepare_swa_spec_page_table(
        dst.to(DEVICE), *[a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args],
        full_to_swa=None if full_to_swa is None else full_to_swa.to(DEVICE),
    )
    assert torch.equal(got.cpu(), expected)


@pytest.mark.gpu
def test_rejects_inputs_on_another_device():
    with pytest.raises(ValueError, match="seq_len_b"):
        _call(seq_len_b=torch.tensor([1, 1], dtype=torch.int32))  # on the CPU, the rest on DEVICE
