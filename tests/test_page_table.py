import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import DEVICE, GridRecorder, poison
from triton_xpu_attn import normalize_page_table, translate_loc_from_full_to_swa
from triton_xpu_attn import reference as ref

PAGE_SIZES = [2**i for i in range(12)]  # 1 to 2048


def _pool(num_reqs, page_size, max_len, gen):
    """A token-granular req_to_token whose pages are contiguous, page-aligned slot runs (as
    sglang's allocator guarantees), with physical pages drawn as a random permutation."""
    pages_per_req = -(-max_len // page_size)
    perm = torch.randperm(num_reqs * pages_per_req + 1, generator=gen)[: num_reqs * pages_per_req] + 1
    pages = perm.reshape(num_reqs, pages_per_req)
    slots = pages[:, :, None] * page_size + torch.arange(page_size)[None, None, :]
    return slots.reshape(num_reqs, -1)[:, :max_len].to(torch.int32)


@given(
    page_size=st.sampled_from(PAGE_SIZES),
    batch=st.integers(0, 4),
    data=st.data(),
    mapped=st.booleans(),
    explicit_width=st.booleans(),
)
def test_normalize_page_table_matches_reference(page_size, batch, data, mapped, explicit_width):
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    pool_rows = batch + 2
    max_len = data.draw(st.integers(1, 3 * page_size + 5))
    req_to_token = _pool(pool_rows, page_size, max_len, gen)
    # a strided view: req_to_token padded to a wider buffer
    wide = torch.zeros(pool_rows, max_len + 7, dtype=torch.int32)
    wide[:, :max_len] = req_to_token
    req_to_token = wide[:, :max_len]
    req_pool_indices = torch.randperm(pool_rows, generator=gen)[:batch].to(torch.int64)
    seq_lens = torch.randint(0, max_len + 1, (batch,), generator=gen, dtype=torch.int32)
    full_to_swa = None
    if mapped:
        size = int(req_to_token.max()) + page_size + 1
        full_to_swa = torch.randint(0, 1000, (size + 1,), generator=gen, dtype=torch.int64) * page_size
        full_to_swa[-1] = -1
    max_pages = -(-max_len // page_size) if explicit_width else None
    expected = ref.normalize_page_table(req_to_token, req_pool_indices, seq_lens, page_size, max_pages, full_to_swa)
    out = None
    if explicit_width:
        out = poison(torch.empty(batch, max_pages, dtype=torch.int32, device=DEVICE))
    got = normalize_page_table(
        req_to_token.to(DEVICE),
        req_pool_indices.to(DEVICE),
        seq_lens.to(DEVICE),
        page_size,
        out=out,
        full_to_swa=None if full_to_swa is None else full_to_swa.to(DEVICE),
    )
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu(), expected)


def _sglang_expression(req_to_token, req_pool_indices, page_size, max_pages, full_to_swa=None):
    """What normalize_page_table replaces: req_to_token[req_pool_indices][:, ::P][:, :max_pages] // P
    (slots translated by full_to_swa first), widened with 0 past req_to_token's width."""
    table = req_to_token[req_pool_indices][:, ::page_size][:, :max_pages]
    if full_to_swa is not None:
        table = full_to_swa[table]
    table = table // page_size
    out = torch.zeros(len(req_pool_indices), max_pages, dtype=torch.int32)
    out[:, : table.shape[1]] = table
    return out


@given(
    page_size=st.sampled_from(PAGE_SIZES),
    batch=st.integers(0, 4),
    data=st.data(),
    mapped=st.booleans(),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
)
def test_normalize_page_table_equals_sglangs_expression(page_size, batch, data, mapped, index_dtype):
    """Bitwise equal to the expression on every column it defines, 0 beyond, for
    any lengths (columns past a request's pages keep req_to_token's values, stale ones and -1
    included); seq_lens only sizes the default width."""
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    pool_rows = batch + 2
    width = data.draw(st.integers(1, 3 * page_size + 5))
    mapping_len = 50 * page_size
    # arbitrary slots, not page-aligned runs: stale entries of freed pages and the "no slot" -1
    req_to_token = torch.randint(-1, mapping_len - 1, (pool_rows, width), generator=gen, dtype=index_dtype)
    req_pool_indices = torch.randint(0, pool_rows, (batch,), generator=gen, dtype=torch.int64)
    seq_lens = torch.randint(0, width + 1, (batch,), generator=gen, dtype=torch.int32)
    full_to_swa = None
    if mapped:
        full_to_swa = torch.randint(-1, 1000, (mapping_len,), generator=gen, dtype=torch.int64)
        full_to_swa[-1] = -1
    widths = [-(-width // page_size) + data.draw(st.integers(0, 2)), data.draw(st.integers(0, -(-width // page_size)))]
    for max_pages in widths:
        expected = _sglang_expression(req_to_token, req_pool_indices, page_size, max_pages, full_to_swa)
        got = normalize_page_table(
            req_to_token.to(DEVICE), req_pool_indices.to(DEVICE), seq_lens.to(DEVICE), page_size, max_pages=max_pages,
            full_to_swa=None if full_to_swa is None else full_to_swa.to(DEVICE),
        )
        assert got.dtype == torch.int32 and torch.equal(got.cpu(), expected)
        assert torch.equal(ref.normalize_page_table(req_to_token, req_pool_indices, seq_lens, page_size, max_pages, full_to_swa),
                           expected)
    # the default width is sglang's, cdiv(max(seq_lens), P)
    got = normalize_page_table(req_to_token.to(DEVICE), req_pool_indices.to(DEVICE), seq_lens.to(DEVICE), page_size,
                               full_to_swa=None if full_to_swa is None else full_to_swa.to(DEVICE))
    default = -(-int(seq_lens.max()) // page_size) if batch else 0
    assert torch.equal(got.cpu(), _sglang_expression(req_to_token, req_pool_indices, page_size, default, full_to_swa))


def test_normalize_page_table_hand_example():
    # page_size 4: request row 1 holds pages 3 and 5 (slots 12..15, 20..23); row 0 holds page 2
    req_to_token = torch.zeros(2, 8, dtype=torch.int32)
    req_to_token[0, :4] = torch.arange(8, 12)
    req_to_token[1] = torch.tensor([12, 13, 14, 15, 20, 21, 22, 23])
    got = normalize_page_table(
        req_to_token.to(DEVICE),
        torch.tensor([1, 0], device=DEVICE),
        torch.tensor([6, 3], device=DEVICE, dtype=torch.int32),
        4,
    )
    assert got.cpu().tolist() == [[3, 5], [2, 0]]
    assert ref.normalize_page_table(req_to_token, [1, 0], [6, 3], 4).tolist() == [[3, 5], [2, 0]]


def test_normalize_page_table_translates_before_dividing():
    # full slots 8..11 (page 2 of the full pool) map to SWA slots 4..7 (page 1 of the SWA pool)
    req_to_token = torch.arange(8, 16, dtype=torch.int32)[None]
    mapping = torch.zeros(18, dtype=torch.int64)
    mapping[8:12] = torch.arange(4, 8)
    mapping[12:16] = torch.arange(12, 16)
    mapping[-1] = -1
    got = normalize_page_table(
        req_to_token.to(DEVICE), torch.tensor([0], device=DEVICE), torch.tensor([8], device=DEVICE), 4,
        full_to_swa=mapping.to(DEVICE),
    )
    assert got.cpu().tolist() == [[1, 3]]


@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=4),
    transpose=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_translate_loc_matches_torch_indexing(shape, transpose, seed):
    gen = torch.Generator().manual_seed(seed)
    mapping = torch.randint(0, 10**6, (50,), generator=gen, dtype=torch.int64)
    mapping[-1] = -1
    locs = torch.randint(-1, 49, shape, generator=gen, dtype=torch.int64)
    if transpose and locs.dim() >= 2:
        locs = locs.transpose(0, -1)  # non-contiguous input
    got = translate_loc_from_full_to_swa(mapping.to(DEVICE), locs.to(DEVICE))
    assert got.dtype == torch.int32 and got.shape == locs.shape
    assert torch.equal(got.cpu(), ref.translate_loc_from_full_to_swa(mapping, locs))


def test_translate_loc_hand_example():
    mapping = torch.tensor([0, 0, 7, 9, 0, -1], dtype=torch.int64)
    locs = torch.tensor([[2, 3], [-1, 4]], dtype=torch.int32)
    got = translate_loc_from_full_to_swa(mapping.to(DEVICE), locs.to(DEVICE))
    assert got.cpu().tolist() == [[7, 9], [-1, 0]]
    assert ref.translate_loc_from_full_to_swa(mapping, locs).tolist() == [[7, 9], [-1, 0]]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(page_size=3), ValueError, "page_size"),
        (dict(page_size=4096), ValueError, "page_size"),
        (dict(page_size=4.0), TypeError, "page_size"),
        (dict(req_to_token=torch.zeros(2, 8)), TypeError, "req_to_token"),
        (dict(req_to_token=torch.zeros(8, dtype=torch.int32)), ValueError, "req_to_token"),
        (dict(seq_lens=torch.zeros(3, dtype=torch.int32)), ValueError, "seq_lens"),
        (dict(req_pool_indices=torch.zeros(2, dtype=torch.float32)), TypeError, "req_pool_indices"),
        (dict(out=torch.zeros(2, 2, dtype=torch.int64)), TypeError, "out"),
        (dict(out=torch.zeros(3, 2, dtype=torch.int32)), ValueError, "out"),
        (dict(full_to_swa=torch.zeros(2, 2, dtype=torch.int64)), ValueError, "full_to_swa"),
    ],
)
def test_normalize_page_table_rejects_bad_input(kwargs, error, match):
    args = dict(
        req_to_token=torch.zeros(2, 8, dtype=torch.int32),
        req_pool_indices=torch.tensor([0, 1]),
        seq_lens=torch.tensor([4, 8], dtype=torch.int32),
        page_size=4,
    )
    args.update(kwargs)
    args = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    with pytest.raises(error, match=match):
        normalize_page_table(
            args.pop("req_to_token"), args.pop("req_pool_indices"), args.pop("seq_lens"), args.pop("page_size"), **args
        )


def test_translate_loc_rejects_bad_input():
    with pytest.raises(TypeError, match="locs"):
        translate_loc_from_full_to_swa(torch.zeros(4, dtype=torch.int64, device=DEVICE), torch.zeros(2, device=DEVICE))
    with pytest.raises(TypeError, match="full_to_swa"):
        translate_loc_from_full_to_swa(torch.zeros(4, device=DEVICE), torch.zeros(2, dtype=torch.int32, device=DEVICE))


def test_empty_inputs_give_empty_results():
    got = normalize_page_table(
        torch.zeros(1, 4, dtype=torch.int32, device=DEVICE), torch.zeros(0, dtype=torch.int64, device=DEVICE),
        torch.zeros(0, dtype=torch.int32, device=DEVICE), 2,
    )
    assert got.shape == (0, 0)
    got = translate_loc_from_full_to_swa(torch.full((3,), -1, device=DEVICE), torch.zeros(0, 5, dtype=torch.int32, device=DEVICE))
    assert got.shape == (0, 5)


# ---- impossible lengths and wide tables: bounded outputs and grids (validate-free op) ----


@pytest.fixture
def record_page_table_grid(monkeypatch):
    from triton_xpu_attn.ops import page_table as pt

    recorder = GridRecorder(pt._normalize_page_table_kernel)
    monkeypatch.setattr(pt, "_normalize_page_table_kernel", recorder)
    return recorder


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(
    "lengths",
    [
        [2**31 - 1, 3],  # the compute-sanitizer case: 134M pages per row at P = 16 before
        [40, 1000],  # past the table, but small: gigabytes at larger values
        [-5, 3],  # negative: counts as 0
        [-(2**31), -1],  # every length negative: width 0
        [2**62, 0],  # int64 only (int32 takes the table's width the same way)
        [2**63 - 1, 7],
    ],
)
def test_default_width_clamps_impossible_lengths_to_the_table(index_dtype, lengths, record_page_table_grid):
    """A length past req_to_token's width counts as that width, a negative one as 0: the default
    width is at most cdiv(req_to_token.shape[1], P) pages and the rows are the table's."""
    if index_dtype == torch.int32 and any(not -(2**31) <= n < 2**31 for n in lengths):
        lengths = [max(min(n, 2**31 - 1), -(2**31)) for n in lengths]
    page_size, width = 16, 37  # 3 pages, the last one partial
    gen = torch.Generator().manual_seed(1)
    req_to_token = torch.randint(-1, 10_000, (3, width), generator=gen, dtype=torch.int32)
    req_pool_indices = torch.tensor([2, 0])
    seq_lens = torch.tensor(lengths, dtype=index_dtype)
    got = normalize_page_table(req_to_token.to(DEVICE), req_pool_indices.to(DEVICE), seq_lens.to(DEVICE), page_size)
    clamped = [min(max(n, 0), width) for n in lengths]
    expected_width = -(-max(clamped) // page_size)
    assert got.shape == (2, expected_width) and expected_width <= 3
    assert torch.equal(got.cpu(), _sglang_expression(req_to_token, req_pool_indices, page_size, expected_width))
    assert torch.equal(ref.normalize_page_table(req_to_token, req_pool_indices, seq_lens, page_size), got.cpu())
    assert all(grid[1] <= 1 for grid in record_page_table_grid.grids)  # 3 pages: one column program


def test_impossible_lengths_with_a_mapping_and_bad_pool_indices():
    # the length clamp composes with the translation and with a pool index outside the table (-1 row)
    req_to_token = torch.arange(8, 16, dtype=torch.int32)[None].repeat(2, 1)
    mapping = torch.zeros(18, dtype=torch.int64)
    mapping[8:12] = torch.arange(4, 8)
    mapping[12:16] = torch.arange(12, 16)
    mapping[-1] = -1
    got = normalize_page_table(
        req_to_token.to(DEVICE), torch.tensor([0, 7], device=DEVICE),
        torch.tensor([2**31 - 1, -3], dtype=torch.int32, device=DEVICE), 4, full_to_swa=mapping.to(DEVICE),
    )
    assert got.cpu().tolist() == [[1, 3], [-1, -1]]


@pytest.mark.parametrize("use_out", [False, True])
def test_max_pages_wider_than_the_table_is_zero_padded(use_out, record_page_table_grid):
    """An explicit width is the caller's (the custom op's fake shape): kept, columns past the table
    0, every element written (poisoned out), whatever seq_lens says."""
    page_size, width, max_pages = 4, 10, 300  # 3 table pages, 297 columns of padding, 3 column tiles
    gen = torch.Generator().manual_seed(2)
    req_to_token = torch.randint(0, 1000, (2, width), generator=gen, dtype=torch.int32)
    req_pool_indices = torch.tensor([1, 0, 5])
    seq_lens = torch.tensor([2**31 - 1, -1, 4], dtype=torch.int32)
    out = poison(torch.empty(3, max_pages, dtype=torch.int32, device=DEVICE)) if use_out else None
    got = normalize_page_table(
        req_to_token.to(DEVICE), req_pool_indices.to(DEVICE), seq_lens.to(DEVICE), page_size,
        max_pages=None if use_out else max_pages, out=out,
    )
    assert got.shape == (3, max_pages)
    assert use_out is (got is out)
    expected = _sglang_expression(req_to_token, req_pool_indices.clamp(max=1), page_size, max_pages)
    expected[2] = -1  # pool index 5 is outside req_to_token
    assert torch.equal(got.cpu(), expected)
    assert (got.cpu()[:2, 3:] == 0).all()
    assert record_page_table_grid.grids == [(3, 3, 1)]


@pytest.mark.parametrize("mapped", [False, True])
def test_wide_table_loops_over_column_tiles(mapped, monkeypatch, record_page_table_grid):
    """The grid's column axis is capped at MAX_GRID_DIM_1 (CUDA's 65535), a wider table looping
    inside each program: capped at 2 here, so a 5-tile table needs 3 tiles in one program;
    bitwise the same table."""
    from triton_xpu_attn.ops import page_table as pt

    monkeypatch.setattr(pt, "MAX_GRID_DIM_1", 2)
    page_size, width = 2, 5 * 128 * 2 - 3  # 639 pages: 5 tiles of 128
    gen = torch.Generator().manual_seed(3)
    req_to_token = torch.randint(-1, 4000, (3, width), generator=gen, dtype=torch.int64)
    req_pool_indices = torch.tensor([2, -1, 0, 1])
    full_to_swa = None
    if mapped:
        full_to_swa = torch.randint(-1, 1000, (4001,), generator=gen, dtype=torch.int64)
        full_to_swa[-1] = -1
    seq_lens = torch.tensor([2**31 - 1, 5, 0, 100], dtype=torch.int32)
    out = poison(torch.empty(4, 700, dtype=torch.int32, device=DEVICE))  # and 61 columns past the table
    for kwargs in (dict(), dict(out=out)):  # the default width (the table's, from 2^31 - 1), then wider
        got = normalize_page_table(
            req_to_token.to(DEVICE), req_pool_indices.to(DEVICE), seq_lens.to(DEVICE), page_size,
            full_to_swa=None if full_to_swa is None else full_to_swa.to(DEVICE), **kwargs,
        )
        cols = got.shape[1]
        expected = _sglang_expression(req_to_token, req_pool_indices.clamp(min=0), page_size, cols, full_to_swa)
        expected[1] = -1
        assert cols == (639 if not kwargs else 700)
        assert torch.equal(got.cpu(), expected)
    assert [g[1] for g in record_page_table_grid.grids] == [2, 2]
