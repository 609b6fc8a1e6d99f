"""DeepSeek sparse attention's indexer top-k (``fast_topk_v2``, ``fast_topk_transform_fused``,
``fast_topk_transform_ragged_fused``, ``topk_transform_512`` / ``_v2``) against the exact reference.

The selection is deterministic (ties: lowest positions; output ascending), so every case compares
every output element for equality. Every case poisons what it can: scores are a window of a wider
buffer whose other elements are ``+inf`` (a score read outside a row's section would be selected),
page tables a window of a wider buffer of a sentinel slot (read outside the table, it would show),
outputs start as a sentinel inside wider buffers whose other elements must keep it. Plans shrink
the kernels' sizes so the interpreter runs every path on small rows: one read (``oneshot``), the
two-kernel path with room for the candidates (``two_kernel``), and with so little room that rows
overflow into the streaming paths (``stream``), several row groups each.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import triton_xpu_attn as tx
from helpers import DEVICE, INTERPRET
from triton_xpu_attn import reference as ref
from triton_xpu_attn.ops import topk_select as select_mod

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
SENTINEL = -777  # in output buffers: never a result (results are >= -1 or page-table values)
TABLE_SENTINEL = 555555  # page-table cells outside the table a call gets

#: kernel sizes the tests force (topk_select's module constants, read by its launcher)
PLANS = {
    "default": {},
    "oneshot": dict(ONESHOT_MAX=1024),
    "two_kernel": dict(ONESHOT_MAX=16, GROUPS=64, CAPACITY=128, ROWS_PER_LAUNCH=3, STREAM_BLOCK=32),
    # the many-row geometry (CUDA's, forced on every backend): other warps, 16-position steps
    "many_rows": dict(ONESHOT_MAX=16, GROUPS=64, CAPACITY=128, ROWS_PER_LAUNCH=3, STREAM_BLOCK=64,
                      MANY_ROWS_TWO_KERNEL=0, MANY_ROWS_BACKENDS=("cuda", "xpu", "interpreter"), MANY_ROWS_BLOCK=16),
    "stream": dict(ONESHOT_MAX=16, GROUPS=16, CAPACITY=16, ROWS_PER_LAUNCH=2, STREAM_BLOCK=16),
    # rows fewer than the interpreter's 4 units: up to 4 programs a row
    "split": dict(ONESHOT_MAX=16, GROUPS=16, CAPACITY=64, ROWS_PER_LAUNCH=2, STREAM_BLOCK=16, MAX_SPLITS=4,
                  SPLIT_MIN_POSITIONS=24),
    "split_stream": dict(ONESHOT_MAX=16, GROUPS=16, CAPACITY=16, ROWS_PER_LAUNCH=3, STREAM_BLOCK=16, MAX_SPLITS=3,
                         SPLIT_MIN_POSITIONS=16),
}


@contextlib.contextmanager
def plan(name: str):
    with pytest.MonkeyPatch.context() as mp:
        for key, value in PLANS[name].items():
            mp.setattr(select_mod, key, value)
        yield


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def make_scores(gen, rows: int, width: int, kind: str, dtype=torch.float32, pad: int = 3) -> torch.Tensor:
    """``[rows, width]`` scores of a kind, a window of a ``+inf`` buffer (``pad`` columns each side)."""
    if kind == "randn":
        s = torch.randn(rows, width, generator=gen)
    elif kind == "ties":
        s = torch.randint(0, 4, (rows, width), generator=gen).float()
    elif kind == "specials":
        s = torch.randn(rows, width, generator=gen)
        pick = torch.randint(0, 12, (rows, width), generator=gen)
        for code, value in ((0, float("nan")), (1, float("inf")), (2, -float("inf")), (3, 0.0), (4, -0.0),
                            (5, -float("nan"))):
            s[pick == code] = value
    elif kind == "ascending":
        s = torch.arange(width, dtype=torch.float32).repeat(rows, 1) + torch.rand(rows, width, generator=gen) * 0.5
    elif kind == "periodic":  # the same values every 16 positions: strided groups of 16 see no spread
        s = torch.randn(rows, 16, generator=gen).repeat(1, width // 16 + 1)[:, :width].contiguous()
    elif kind == "constant":
        s = torch.full((rows, width), 0.25)
    elif kind == "signed_zeros":  # +0 and -0 tie
        s = torch.tensor([0.0, -0.0, 1.0, -1.0])[torch.randint(0, 4, (rows, width), generator=gen)]
    else:
        raise AssertionError(kind)
    buf = torch.full((rows, width + 2 * pad), float("inf"), dtype=dtype)
    buf[:, pad:pad + width] = s.to(dtype)
    return buf.to(DEVICE)[:, pad:pad + width]


def draw_lengths(data, rows: int, width: int, topk: int, name: str = "lengths") -> torch.Tensor:
    choices = [-5, 0, 1, topk - 1, topk, topk + 1, width // 2, width, width + 7, I32_MAX]
    return _i32(data.draw(st.lists(st.sampled_from(choices), min_size=rows, max_size=rows), label=name))


def draw_row_starts(data, rows: int, width: int):
    if not data.draw(st.booleans(), label="has_row_starts"):
        return None
    choices = [0, 0, 1, 2, width // 3, width - 1, width, width + 5, -3, I32_MIN]
    return _i32(data.draw(st.lists(st.sampled_from(choices), min_size=rows, max_size=rows), label="row_starts"))


def poisoned_out(rows: int, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, ``[rows, topk]`` window of it with a row stride of ``topk + 2``), all SENTINEL."""
    buf = torch.full((rows, topk + 2), SENTINEL, dtype=torch.int32, device=DEVICE)
    return buf, buf[:, 1:1 + topk]


def check_window(buf: torch.Tensor, window_cols: slice, got: torch.Tensor, expected: torch.Tensor):
    got, expected = got.cpu().long(), expected.long()
    assert torch.equal(got, expected), f"\ngot {got}\nexpected {expected}"
    rest = buf.cpu().clone()
    rest[:, window_cols] = SENTINEL
    assert torch.all(rest == SENTINEL), "wrote outside the output window"


# ---------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------

KINDS = ["randn", "ties", "specials", "ascending", "periodic", "constant", "signed_zeros"]


@given(
    rows=st.integers(1, 5),
    width=st.sampled_from([1, 7, 16, 40, 100, 257]),
    topk=st.sampled_from([1, 2, 3, 8, 13, 32]),
    kind=st.sampled_from(KINDS),
    dtype=st.sampled_from([torch.float32, torch.float32, torch.float16, torch.bfloat16]),
    plan_name=st.sampled_from(list(PLANS)),
    data=st.data(),
)
def test_fast_topk_v2_matches_reference(rows, width, topk, kind, dtype, plan_name, data):
    gen = torch.Generator().manual_seed(rows * 1000 + width + topk)
    score = make_scores(gen, rows, width, kind, dtype)
    lengths = draw_lengths(data, rows, width, topk)
    row_starts = draw_row_starts(data, rows, width)
    buf, out = poisoned_out(rows, topk)
    with plan(plan_name):
        got = tx.fast_topk_v2(score, lengths, topk, row_starts, out=out)
    assert got is out
    check_window(buf, slice(1, 1 + topk), got, ref.topk_select(score, lengths, topk, row_starts))


def _page_table(gen, n_req: int, cols: int, pad: int = 2) -> torch.Tensor:
    """``[n_req, cols]`` int32 slots (negative and extreme ones too), a window of a sentinel buffer."""
    t = torch.randint(-3, 10**6, (n_req, cols), generator=gen, dtype=torch.int64)
    if t.numel():
        t.view(-1)[:: 7] = I32_MAX
        t.view(-1)[3:: 11] = I32_MIN
    buf = torch.full((n_req + 1, cols + 2 * pad), TABLE_SENTINEL, dtype=torch.int32)
    buf[:n_req, pad:pad + cols] = t.to(torch.int32)
    return buf.to(DEVICE)[:n_req, pad:pad + cols]


def _cu_seqlens(data, rows: int, n_req: int, how: str) -> torch.Tensor:
    if how == "decode":
        return torch.arange(rows + 1, dtype=torch.int32, device=DEVICE)
    cuts = sorted(data.draw(st.lists(st.integers(0, rows), min_size=n_req - 1, max_size=n_req - 1), label="cuts"))
    end = rows if how == "prefill" else data.draw(st.integers(0, rows), label="end")  # "padded": rows past the end
    cu = [0] + [min(c, end) for c in cuts] + [end]
    if how == "unsorted":
        cu = data.draw(st.permutations(cu), label="order")
    return _i32(cu)


@given(
    rows=st.integers(1, 5),
    width=st.sampled_from([5, 16, 40, 100, 257]),
    topk=st.sampled_from([1, 3, 8, 13, 32]),
    kind=st.sampled_from(KINDS),
    how=st.sampled_from(["decode", "prefill", "padded", "unsorted"]),
    cols_over=st.sampled_from([-30, -1, 0, 5]),
    plan_name=st.sampled_from(list(PLANS)),
    data=st.data(),
)
def test_fast_topk_transform_fused_matches_reference(rows, width, topk, kind, how, cols_over, plan_name, data):
    gen = torch.Generator().manual_seed(rows * 1000 + width + topk)
    score = make_scores(gen, rows, width, kind)
    lengths = draw_lengths(data, rows, width, topk)
    row_starts = None if how == "decode" else draw_row_starts(data, rows, width)
    n_req = rows if how == "decode" else data.draw(st.integers(1, rows), label="n_req")
    cu = _cu_seqlens(data, rows, n_req, how)
    table = _page_table(gen, n_req, max(0, width + cols_over))
    buf, out = poisoned_out(rows, topk)
    with plan(plan_name):
        got = tx.fast_topk_transform_fused(score, lengths, table, cu, topk, row_starts, out=out)
    expected = ref.topk_transform_page_table(score, lengths, table, cu, topk, row_starts)
    check_window(buf, slice(1, 1 + topk), got, expected)
    assert not (got == TABLE_SENTINEL).any(), "read a page-table cell outside the table"


@given(
    rows=st.integers(1, 5),
    width=st.sampled_from([5, 40, 100, 257]),
    topk=st.sampled_from([1, 8, 13, 32]),
    kind=st.sampled_from(KINDS),
    plan_name=st.sampled_from(list(PLANS)),
    data=st.data(),
)
def test_fast_topk_transform_ragged_fused_matches_reference(rows, width, topk, kind, plan_name, data):
    gen = torch.Generator().manual_seed(rows * 1000 + width + topk)
    score = make_scores(gen, rows, width, kind)
    lengths = draw_lengths(data, rows, width, topk)
    row_starts = draw_row_starts(data, rows, width)
    offsets = _i32(data.draw(st.lists(st.sampled_from([0, 5, 1000, I32_MAX - 3, I32_MIN, -40]), min_size=rows,
                                      max_size=rows), label="offsets"))
    buf, out = poisoned_out(rows, topk)
    with plan(plan_name):
        got = tx.fast_topk_transform_ragged_fused(score, lengths, offsets, topk, row_starts, out=out)
    check_window(buf, slice(1, 1 + topk), got, ref.topk_transform_ragged(score, lengths, offsets, topk, row_starts))


@given(
    rows=st.integers(1, 5),
    width=st.sampled_from([5, 40, 100, 257]),
    topk=st.sampled_from([1, 8, 13, 32]),
    page_size=st.sampled_from([1, 2, 4, 16, 64]),
    kind=st.sampled_from(KINDS),
    pages_over=st.sampled_from([-2, 0, 1]),
    lens_2d=st.booleans(),
    with_raw=st.booleans(),
    v2=st.booleans(),
    plan_name=st.sampled_from(list(PLANS)),
    data=st.data(),
)
def test_topk_transform_512_matches_reference(rows, width, topk, page_size, kind, pages_over, lens_2d, with_raw, v2,
                                              plan_name, data):
    gen = torch.Generator().manual_seed(rows * 1000 + width + topk + page_size)
    scores = make_scores(gen, rows, width, kind)
    seq_lens = draw_lengths(data, rows, width, topk, "seq_lens")
    if lens_2d:
        seq_lens = seq_lens[:, None]
    pages = max(0, -(-width // page_size) + pages_over)
    table = _page_table(gen, rows, pages)
    buf, out = poisoned_out(rows, topk)
    raw_buf, raw = poisoned_out(rows, topk) if with_raw else (None, None)
    with plan(plan_name):
        if v2:
            result = tx.topk_transform_512_v2(scores, seq_lens, table, out, page_size,
                                              torch.empty(rows + 1, 2, dtype=torch.int32, device=DEVICE), raw)
        else:
            result = tx.topk_transform_512(scores, seq_lens, table, out, page_size, raw)
    assert result is None
    exp_page, exp_raw = ref.topk_transform_paged(scores, seq_lens, table, topk, page_size)
    check_window(buf, slice(1, 1 + topk), out, exp_page)
    if with_raw:
        check_window(raw_buf, slice(1, 1 + topk), raw, exp_raw)


# ---------------------------------------------------------------------------------------------
# hand-checked semantics
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("plan_name", list(PLANS))
def test_nan_ranks_below_every_number(plan_name):
    nan, inf = float("nan"), float("inf")
    score = torch.tensor([[nan, 1.0, -inf, nan, 0.0, -0.0, nan, 2.0, -1.0, nan, -inf, 0.0, 3.0, nan, 1.0, 0.0,
                           nan, nan]], device=DEVICE)
    width = score.shape[1]
    n_numbers = 11  # the others are NaN
    with plan(plan_name):
        for topk, expected in [
            (3, [1, 7, 12]),  # 3.0, 2.0, 1.0 (1.0 twice: the lower position)
            (4, [1, 7, 12, 14]),
            (6, [1, 4, 5, 7, 12, 14]),  # +0 / -0 / +0 tie: the two lowest positions
            (10, [1, 2, 4, 5, 7, 8, 11, 12, 14, 15]),  # every finite number, then the first -inf
            (n_numbers + 2, [0, 1, 2, 3, 4, 5, 7, 8, 10, 11, 12, 14, 15]),  # the two first NaN fill the rest
        ]:
            got = tx.fast_topk_v2(score, _i32([width]), topk)
            assert got.cpu().tolist() == [expected], (topk, got)
            assert got.cpu().tolist() == ref.topk_select(score, _i32([width]), topk).tolist()


def test_short_rows_return_their_positions_unread():
    """A section of at most ``topk`` positions: ``0 .. n-1`` then -1, whatever the scores hold."""
    score = torch.full((2, 6), float("nan"), device=DEVICE)
    got = tx.fast_topk_v2(score, _i32([4, 0]), 5)
    assert got.cpu().tolist() == [[0, 1, 2, 3, -1], [-1] * 5]


def test_sections_are_clipped_to_the_row():
    score = torch.arange(10, dtype=torch.float32, device=DEVICE).repeat(4, 1)
    got = tx.fast_topk_v2(score, _i32([50, -1, 8, 9]), 2, _i32([7, 2, -4, 20]))
    # row 0: columns 7..9 (3 > 2 positions) -> relative 1, 2; row 1: nothing; row 2: start 0, 8 columns;
    # row 3: start clipped to 10: nothing
    assert got.cpu().tolist() == [[1, 2], [-1, -1], [6, 7], [-1, -1]]


def test_transform_reads_the_page_table_at_relative_positions():
    """``row_starts`` moves the section in the scores only; rows map to requests through
    ``cu_seqlens_q`` (prefill), or directly when there is one request per row and no row starts."""
    score = torch.tensor([[0.0, 9.0, 1.0, 8.0, 2.0, 7.0]] * 3, device=DEVICE)
    table = _i32([[100, 101, 102, 103, 104, 105], [200, 201, 202, 203, 204, 205]])
    cu = _i32([0, 1, 3])
    got = tx.fast_topk_transform_fused(score, _i32([6, 4, 4]), table, cu, 2, _i32([0, 2, 1]))
    # row 0 (request 0): positions 1, 3; row 1 (request 1, scores 1, 8, 2, 7): 1, 3; row 2: 9, 1, 8, 2 -> 0, 2
    assert got.cpu().tolist() == [[101, 103], [201, 203], [200, 202]]
    direct = tx.fast_topk_transform_fused(score[:2], _i32([6, 6]), table, _i32([0, 2, 2]), 2)
    assert direct.cpu().tolist() == [[101, 103], [201, 203]]  # row 1 reads request 1 though cu says 0


def test_upstream_style_set_comparison():
    """sgl-kernel-xpu's own check (sets against torch.topk, tolerating tie swaps), topk 2048 and
    row starts, on the one-read and the two-kernel paths."""
    gen = torch.Generator().manual_seed(42)
    rows, seq_len = 2, 2600
    score = torch.randn(rows, seq_len + 2048, generator=gen).to(DEVICE)
    row_starts = torch.randint(0, 2048, (rows,), generator=gen, dtype=torch.int32).to(DEVICE)
    lengths = _i32([seq_len] * rows)
    for plan_name in ("default", "two_kernel"):
        with plan(plan_name):
            ours = tx.fast_topk_v2(score, lengths, 2048, row_starts).cpu()
        for b in range(rows):
            s = int(row_starts[b])
            expected = torch.topk(score[b, s:s + seq_len].cpu(), 2048).indices
            assert set(ours[b].tolist()) == set(expected.tolist())


@pytest.mark.parametrize("plan_name", ["two_kernel", "stream"])
def test_every_path_is_taken(plan_name):
    """The small plans do reach the candidates kernel, in row groups, and its three outcomes:
    candidates that fit; too many, the threshold at the bound (ties); too many, the threshold
    above it (periodic scores defeat the strided groups)."""
    gen = torch.Generator().manual_seed(3)
    score = torch.cat([make_scores(gen, 1, 200, "periodic"), make_scores(gen, 1, 200, "constant"),
                       make_scores(gen, 1, 200, "randn")])
    lengths = _i32([200, 200, 200])
    topk = 8
    metas = []
    real = select_mod._topk_candidates_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                real[grid](*args, **kwargs)
                metas.append(args[11][:grid[0]].cpu().clone())  # [rows, 4]: candidates, bound, above bound
            return launch

    with plan(plan_name), pytest.MonkeyPatch.context() as mp:
        mp.setattr(select_mod, "_topk_candidates_kernel", Spy())
        got = tx.fast_topk_v2(score, lengths, topk)
    assert torch.equal(got.cpu().long(), ref.topk_select(score, lengths, topk))
    assert len(metas) == -(-3 // PLANS[plan_name]["ROWS_PER_LAUNCH"])  # ROWS_PER_LAUNCH rows at a time
    meta = torch.cat(metas)
    fits = meta[:, 0] <= plan_capacity(plan_name)
    if plan_name == "stream":
        assert not fits[0] and meta[0, 2] >= topk, meta  # periodic: bisection over the row
        assert not fits[1] and meta[1, 2] < topk, meta  # constant: the bound is the threshold
    else:
        assert fits[0] and not fits[1], meta


def plan_capacity(plan_name: str) -> int:
    return PLANS[plan_name]["CAPACITY"]


@pytest.mark.parametrize("plan_name", ["split", "split_stream"])
def test_rows_split_over_programs(plan_name):
    """Fewer rows than units: the group maxima from several programs a row (atomic max), each
    program compacting its range; the select kernel joins the ranges in order."""
    gen = torch.Generator().manual_seed(9)
    score = torch.cat([make_scores(gen, 1, 300, kind) for kind in ("randn", "periodic", "ties")])
    lengths = _i32([300, 250, 299])
    grids = []
    real = select_mod._topk_group_max_kernel

    class Spy:
        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]

    with plan(plan_name), pytest.MonkeyPatch.context() as mp:
        mp.setattr(select_mod, "_topk_group_max_kernel", Spy())
        got = tx.fast_topk_v2(score, lengths, 8)
        got_table = tx.fast_topk_transform_fused(score, lengths, _i32([[5 * j for j in range(300)]] * 3),
                                                 _i32([0, 1, 2, 3]), 8)
    assert grids and all(g[1] > 1 for g in grids), grids
    assert torch.equal(got.cpu().long(), ref.topk_select(score, lengths, 8))
    assert torch.equal(got_table.cpu().long(), torch.where(got.cpu() >= 0, 5 * got.cpu(), -1).long())


@pytest.mark.parametrize("plan_name", ["default", "two_kernel", "split"])
def test_strided_scores_and_int64_metadata(plan_name):
    """Scores with a column stride (a transposed view) and int64 lengths / row starts / offsets
    give what contiguous scores and int32 metadata give."""
    gen = torch.Generator().manual_seed(4)
    base = torch.randn(120, 3, generator=gen).to(DEVICE)
    score = base.t()  # [3, 120], column stride 3
    lengths, starts = torch.tensor([120, 70, 99], device=DEVICE), torch.tensor([0, 30, -5], device=DEVICE)
    table = torch.randint(0, 10**6, (1, 120), generator=gen, dtype=torch.int32).to(DEVICE)
    cu = torch.tensor([0, 3], device=DEVICE)
    with plan(plan_name):
        got = tx.fast_topk_v2(score, lengths, 9, starts)
        mapped = tx.fast_topk_transform_fused(score, lengths, table, cu, 9, starts)
        plain = tx.fast_topk_v2(score.contiguous(), lengths.int(), 9, starts.int())
    assert torch.equal(got, plain)
    assert torch.equal(got.cpu().long(), ref.topk_select(score, lengths, 9, starts))
    assert torch.equal(mapped.cpu().long(), ref.topk_transform_page_table(score, lengths, table, cu, 9, starts))


def test_empty_inputs():
    assert tx.fast_topk_v2(torch.empty(0, 5, device=DEVICE), _i32([]), 4).shape == (0, 4)
    got = tx.fast_topk_v2(torch.empty(2, 0, device=DEVICE), _i32([3, 0]), 4)
    assert got.cpu().tolist() == [[-1] * 4] * 2
    table = torch.empty(0, 0, dtype=torch.int32, device=DEVICE)
    got = tx.fast_topk_transform_fused(torch.randn(2, 5, device=DEVICE), _i32([5, 2]), table, _i32([0]), 3)
    assert got.cpu().tolist() == [[-1] * 3] * 2  # no request: no page-table row to read


def test_repeated_runs_are_bitwise_equal():
    gen = torch.Generator().manual_seed(5)
    score = make_scores(gen, 3, 100, "ties")
    with plan("two_kernel"):
        first = tx.fast_topk_v2(score, _i32([100, 60, 99]), 13)
        assert torch.equal(first, tx.fast_topk_v2(score, _i32([100, 60, 99]), 13))


# ---------------------------------------------------------------------------------------------
# the argument contract, custom ops, compat names
# ---------------------------------------------------------------------------------------------


def _v2_args(**change):
    args = dict(score=torch.randn(3, 10, device=DEVICE), lengths=_i32([10, 4, 7]), topk=4, row_starts=None)
    args.update(change)
    return args


BAD = [
    ("score", TypeError, dict(score=[[1.0]])),
    ("score", TypeError, dict(score=torch.zeros(3, 10, dtype=torch.int32, device=DEVICE))),
    ("score", ValueError, dict(score=torch.zeros(3, 10, 2, device=DEVICE))),
    ("lengths", TypeError, dict(lengths=torch.tensor([1.0, 2.0, 3.0], device=DEVICE))),
    ("lengths", ValueError, dict(lengths=_i32([1, 2]))),
    ("topk", ValueError, dict(topk=0)),
    ("topk", ValueError, dict(topk=2049)),
    ("topk", TypeError, dict(topk=2.0)),
    ("topk", TypeError, dict(topk=None)),
    ("row_starts", ValueError, dict(row_starts=_i32([0, 1]))),
    ("row_starts", TypeError, dict(row_starts=torch.zeros(3, device=DEVICE))),
]


@pytest.mark.parametrize("name, error, change", BAD, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD)])
def test_bad_input_names_the_argument(name, error, change):
    args = _v2_args(**change)
    with pytest.raises(error, match=rf"^{name}\b"):
        tx.fast_topk_v2(args["score"], args["lengths"], args["topk"], args["row_starts"])


def test_bad_transform_inputs_name_the_argument():
    score, lengths = torch.randn(3, 10, device=DEVICE), _i32([10, 4, 7])
    table = torch.zeros(2, 10, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="^page_table_size_1"):
        tx.fast_topk_transform_fused(score, lengths, table, _i32([0, 1, 2, 3]), 4)
    with pytest.raises(TypeError, match="^page_table_size_1"):
        tx.fast_topk_transform_fused(score, lengths, table.long(), _i32([0, 1, 3]), 4)
    with pytest.raises(ValueError, match="^cu_seqlens_q"):
        tx.fast_topk_transform_fused(score, lengths, table, _i32([0, 1, 2, 3, 3]), 4)
    with pytest.raises(ValueError, match="^topk_indices_offset"):
        tx.fast_topk_transform_ragged_fused(score, lengths, _i32([0, 1]), 4)
    with pytest.raises(ValueError, match="^out"):
        tx.fast_topk_v2(score, lengths, 4, out=torch.zeros(3, 5, dtype=torch.int32, device=DEVICE))
    out = torch.zeros(3, 4, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="^page_size"):
        tx.topk_transform_512(score, lengths, table[:1].expand(3, 10), out, 3)
    with pytest.raises(ValueError, match="^page_tables"):
        tx.topk_transform_512(score, lengths, table, out, 1)
    with pytest.raises(ValueError, match=r"^out_page_indices.shape\[1\]"):
        tx.topk_transform_512(score, lengths, table[:1].expand(3, 10),
                              torch.zeros(3, 4096, dtype=torch.int32, device=DEVICE), 1)
    with pytest.raises(ValueError, match="^out_raw_indices"):
        tx.topk_transform_512(score, lengths, table[:1].expand(3, 10), out, 1, out[:2])
    with pytest.raises(ValueError, match="^seq_lens"):
        tx.topk_transform_512(score, lengths[:, None].expand(3, 2), table[:1].expand(3, 10), out, 1)
    with pytest.raises(TypeError, match="^metadata"):
        tx.topk_transform_512_v2(score, lengths, table[:1].expand(3, 10), out, 1, None)


def test_cpu_inputs_under_a_gpu_backend_raise(monkeypatch):
    from triton_xpu_attn import device as _device

    monkeypatch.setattr(_device, "backend", lambda: "cuda")
    monkeypatch.setattr(_device, "default_device", lambda: torch.device("cuda"))
    with pytest.raises(ValueError, match=r"^score is on cpu but kernels run on cuda here \(the cuda backend\)"):
        tx.fast_topk_v2(torch.randn(2, 8), torch.tensor([8, 3], dtype=torch.int32), 4)


def _custom_cases():
    score, lengths = torch.randn(3, 40, device=DEVICE), _i32([40, 4, 30])
    table = torch.randint(0, 1000, (2, 40), dtype=torch.int32, device=DEVICE)
    out = torch.zeros(3, 8, dtype=torch.int32, device=DEVICE)
    return [
        ("fast_topk_v2", (score, lengths, 8, _i32([0, 3, 5])), None),
        ("fast_topk_transform_fused", (score, lengths, table, _i32([0, 1, 3]), 8, None), None),
        ("fast_topk_transform_ragged_fused", (score, lengths, _i32([0, 40, 44]), 8, None), None),
        ("topk_transform_512", (score, lengths, table[:1].expand(3, 40), out, 4, out.clone()), (3, 5)),
        ("topk_transform_512_v2", (score, lengths, table[:1].expand(3, 40), out, 4, _i32([[0, 0]] * 4), out.clone()),
         (3, 6)),
    ]


@pytest.mark.parametrize("name, args, outs", _custom_cases(), ids=[c[0] for c in _custom_cases()])
def test_custom_op_opcheck_and_equals_the_function(name, args, outs):
    op = getattr(torch.ops.triton_xpu_attn, name)
    result = torch.library.opcheck(op, args)
    assert all(v == "SUCCESS" for v in result.values()), result
    fresh = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    expected = getattr(tx, name)(*fresh)
    got = op(*args)
    if outs is None:
        assert torch.equal(got, expected)
    else:
        for i in outs:
            assert torch.equal(args[i], fresh[i])


def test_compiled_call_has_no_graph_break():
    score, lengths = torch.randn(3, 40, device=DEVICE), _i32([40, 4, 30])

    def step(s, n):
        return torch.ops.triton_xpu_attn.fast_topk_v2(s, n, 8) + 1

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(score, lengths), step(score, lengths))


def test_sgl_kernel_compat_names():
    import importlib

    import triton_xpu_attn.compat as compat

    before = compat.installed()
    compat.install(["sgl_kernel"], force=True)
    try:
        sgl_kernel = importlib.import_module("sgl_kernel")
        top_k = importlib.import_module("sgl_kernel.top_k")
        for name in ("fast_topk_v2", "fast_topk_transform_fused", "fast_topk_transform_ragged_fused",
                     "topk_transform_512", "topk_transform_512_v2"):
            assert getattr(sgl_kernel, name) is getattr(tx, name) is getattr(top_k, name)
            assert name in sgl_kernel.__all__
    finally:
        compat.uninstall()
        if before:
            compat.install(list(before))


def test_signatures_match_upstream():
    import inspect

    expected = {
        "fast_topk_v2": ["score", "lengths", "topk", "row_starts"],
        "fast_topk_transform_fused": ["score", "lengths", "page_table_size_1", "cu_seqlens_q", "topk", "row_starts"],
        "fast_topk_transform_ragged_fused": ["score", "lengths", "topk_indices_offset", "topk", "row_starts"],
        "topk_transform_512": ["scores", "seq_lens", "page_tables", "out_page_indices", "page_size",
                               "out_raw_indices"],
        "topk_transform_512_v2": ["scores", "seq_lens", "page_tables", "out_page_indices", "page_size", "metadata",
                                  "out_raw_indices"],
    }
    for name, params in expected.items():
        positional = [p.name for p in inspect.signature(getattr(tx, name)).parameters.values()
                      if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert positional == params, name


# ---------------------------------------------------------------------------------------------
# compiled on a GPU: DeepSeek-V3.2 shapes, graphs
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("rows, width, row_starts", [(4, 4096, False), (3, 65536, True), (2, 131072, False),
                                                     (1100, 9000, True)])
def test_gpu_deepseek_shapes(rows, width, row_starts):
    gen = torch.Generator().manual_seed(rows + width)
    score = torch.randn(rows, width, generator=gen).to(DEVICE)
    lengths = torch.randint(width // 2, width + 1, (rows,), generator=gen, dtype=torch.int32).to(DEVICE)
    starts = None
    if row_starts:
        starts = torch.randint(0, width // 4, (rows,), generator=gen, dtype=torch.int32).to(DEVICE)
    got = tx.fast_topk_v2(score, lengths, 2048, starts)
    assert torch.equal(got.cpu().long(), ref.topk_select(score, lengths, 2048, starts))
    table = torch.randint(0, 2**30, (rows, width), generator=gen, dtype=torch.int32).to(DEVICE)
    got = tx.fast_topk_transform_fused(score, lengths, table, torch.arange(rows + 1, dtype=torch.int32,
                                                                           device=DEVICE), 2048, starts)
    expected = ref.topk_transform_page_table(score, lengths, table, torch.arange(rows + 1), 2048, starts)
    assert torch.equal(got.cpu().long(), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ties", "periodic", "constant", "specials"])
def test_gpu_streaming_rows(kind):
    """Rows that overflow the candidates on the real sizes (ties, periodic scores) stay exact."""
    gen = torch.Generator().manual_seed(11)
    score = make_scores(gen, 3, 40000, kind)
    lengths = _i32([40000, 30000, 12345])
    got = tx.fast_topk_v2(score, lengths, 2048)
    assert torch.equal(got.cpu().long(), ref.topk_select(score, lengths, 2048))


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="CUDA graphs")
def test_gpu_graph_replay_without_host_sync():
    gen = torch.Generator().manual_seed(7)
    score = torch.randn(8, 20000, generator=gen).to(DEVICE)
    lengths = _i32([20000, 100, 5000, 19999, 0, 2049, 2048, 15000])
    table = torch.randint(0, 2**20, (8, 20000), generator=gen, dtype=torch.int32).to(DEVICE)
    cu = torch.arange(9, dtype=torch.int32, device=DEVICE)
    tx.fast_topk_transform_fused(score, lengths, table, cu, 2048)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tx.fast_topk_transform_fused(score, lengths, table, cu, 2048)
    score.copy_(torch.randn(8, 20000, generator=gen).to(DEVICE))
    graph.replay()
    expected = ref.topk_transform_page_table(score, lengths, table, cu, 2048)
    assert torch.equal(out.cpu().long(), expected)


def test_many_row_one_shot_launches_take_four_warps(monkeypatch):
    """CUDA: a one-shot selection of at least MANY_ROWS_PER_UNIT rows per unit runs on 4 warps;
    fewer rows, and other backends, keep the per-block warp count."""
    monkeypatch.setattr(select_mod._device, "compute_units", lambda device=None: 132)
    many = select_mod.MANY_ROWS_PER_UNIT * 132
    for backend, expect_many in (("cuda", 4), ("xpu", select_mod._options(8192, "xpu")["num_warps"])):
        monkeypatch.setattr(select_mod._device, "backend", lambda b=backend: b)
        assert select_mod._launch_options(8192, many)["num_warps"] == expect_many
        assert select_mod._launch_options(8192, many - 1)["num_warps"] == select_mod._options(8192, backend)["num_warps"]
        assert select_mod._launch_options(8192)["num_warps"] == select_mod._options(8192, backend)["num_warps"]
@pytest.mark.parametrize("backend", ["cuda", "xpu"])
def test_many_row_two_kernel_geometry(monkeypatch, backend):
    """CUDA: two-kernel launches of at least MANY_ROWS_TWO_KERNEL rows per unit take the many-row
    geometry (MANY_ROWS_* warps, MANY_ROWS_BLOCK-position steps); fewer rows, and other backends,
    keep the per-row one (warps by held block, STREAM_BLOCK steps). Results are the reference's."""
    gen = torch.Generator().manual_seed(21)
    launches = []

    def spy(name):
        real = getattr(select_mod, name)

        class Spy:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    launches.append((name, kwargs["BLOCK"], kwargs.pop("num_warps")))
                    kwargs.pop("grf_mode", None)
                    real[grid](*args, **kwargs)
                return launch
        monkeypatch.setattr(select_mod, name, Spy())

    class Device:  # the launcher's view of the machine: ``backend`` with 2 compute units
        def __getattr__(self, attr):
            return getattr(device_mod, attr)

        def backend(self):
            return backend

        def compute_units(self, device=None):
            return 2

    device_mod = select_mod._device
    spy("_topk_candidates_kernel")
    spy("_topk_select_kernel")
    monkeypatch.setattr(select_mod, "_device", Device())
    monkeypatch.setattr(select_mod.tune, "launch_options", lambda config: dict(config))
    for rows in (2 * select_mod.MANY_ROWS_TWO_KERNEL, 2 * select_mod.MANY_ROWS_TWO_KERNEL - 1):
        score = torch.randn(rows, 300, generator=gen).to(DEVICE)
        lengths = _i32([300, 257, 299, 280, 290, 271][:rows])
        launches.clear()
        with plan("two_kernel"), pytest.MonkeyPatch.context() as mp:
            mp.setattr(select_mod, "MANY_ROWS_BLOCK", 16)
            got = tx.fast_topk_v2(score, lengths, 8)
        assert torch.equal(got.cpu().long(), ref.topk_select(score, lengths, 8))
        many = backend == "cuda" and rows >= 2 * select_mod.MANY_ROWS_TWO_KERNEL
        few = select_mod._options(max(64, 128, 32), backend)["num_warps"]
        expect = [("_topk_candidates_kernel", 16 if many else 32, select_mod.MANY_ROWS_CANDIDATE_WARPS if many else few),
                  ("_topk_select_kernel", 16 if many else 32, select_mod.MANY_ROWS_SELECT_WARPS if many else few)]
        assert launches == expect * -(-rows // PLANS["two_kernel"]["ROWS_PER_LAUNCH"]), (rows, launches)


# ---------------------------------------------------------------------------------------------
# vLLM's torch.ops._C.top_k_per_row_prefill / _decode (vllm-xpu-kernels' schemas, compat _C)
# ---------------------------------------------------------------------------------------------


def _vllm_ops():
    import importlib

    importlib.import_module("triton_xpu_attn.compat.vllm_xpu_kernels._C")
    return torch.ops._C


def _in_wide_buffer(rows: int, topk: int):
    """``[rows, topk]`` output as vLLM passes it: ``topk_indices_buffer[:rows, :topk]`` of a wider buffer."""
    buf = torch.full((rows + 2, topk + 3), SENTINEL, dtype=torch.int32, device=DEVICE)
    return buf, buf[:rows, :topk]


def _untouched_outside(buf, rows: int, topk: int) -> bool:
    keep = torch.ones_like(buf, dtype=torch.bool)
    keep[:rows, :topk] = False
    return bool((buf[keep] == SENTINEL).all())


def test_vllm_top_k_per_row_schemas():
    ops = _vllm_ops()
    assert str(ops.top_k_per_row_prefill.default._schema).replace("SymInt", "int") == (
        "_C::top_k_per_row_prefill(Tensor logits, Tensor rowStarts, Tensor rowEnds, Tensor(a3!) indices, "
        "int numRows, int stride0, int stride1, int topK) -> ()")
    assert str(ops.top_k_per_row_decode.default._schema).replace("SymInt", "int") == (
        "_C::top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, Tensor(a3!) indices, "
        "int numRows, int stride0, int stride1, int topK) -> ()")


@pytest.mark.parametrize("kind", ["randn", "ties", "specials"])
def test_vllm_top_k_per_row_prefill(kind):
    """Row ``r`` selects among ``logits[r, rowStarts[r] : rowEnds[r]]``, positions relative to
    ``rowStarts[r]`` (the prefill indexer's request-local positions): the reference selection,
    rows of ``topK`` or fewer positions included (one empty); nothing outside ``indices`` written."""
    gen = torch.Generator().manual_seed(11)
    rows, width, topk = 5, 70, 8
    score = make_scores(gen, rows, width, kind)
    starts, ends = _i32([0, 10, 20, 62, 3]), _i32([70, 15, 50, 70, 3])
    buf, out = _in_wide_buffer(rows, topk)
    assert _vllm_ops().top_k_per_row_prefill(score, starts, ends, out, rows, *score.stride(), topk) is None
    expected = ref.topk_select(score, ends - starts, topk, row_starts=starts)
    assert torch.equal(out.cpu().long(), expected) and _untouched_outside(buf, rows, topk)


@pytest.mark.parametrize("next_n, form", [(1, "1d"), (1, "column"), (2, "1d"), (2, "column"), (2, "per_row")])
def test_vllm_top_k_per_row_decode(next_n, form):
    """Decode row ``r`` selects among its first ``seq_lens[r // next_n] - next_n + r % next_n + 1``
    columns (``[B]`` or ``[B, 1]`` lengths); a ``[B, next_n]`` ``seq_lens`` holds each row's own
    length (vLLM's native-MTP form)."""
    gen = torch.Generator().manual_seed(12)
    batch, width, topk = 3, 60, 6
    rows = batch * next_n
    score = make_scores(gen, rows, width, "randn")
    lens = torch.tensor([60, 4, 33])
    row = torch.arange(rows)
    per_row = lens.repeat_interleave(next_n) - next_n + row % next_n + 1
    seq_lens = {"1d": lens, "column": lens[:, None], "per_row": per_row.view(batch, next_n)}[form]
    buf, out = _in_wide_buffer(rows, topk)
    _vllm_ops().top_k_per_row_decode(score, next_n, seq_lens.int().to(DEVICE), out, rows, *score.stride(), topk)
    assert torch.equal(out.cpu().long(), ref.topk_select(score, per_row, topk)) and _untouched_outside(buf, rows, topk)


def test_vllm_top_k_per_row_bad_input_names_the_argument():
    ops = _vllm_ops()
    score, out = torch.randn(4, 20, device=DEVICE), torch.zeros(4, 5, dtype=torch.int32, device=DEVICE)
    starts, ends = _i32([0] * 4), _i32([20] * 4)
    with pytest.raises(ValueError, match="^numRows"):
        ops.top_k_per_row_prefill(score, starts, ends, out, 3, 20, 1, 5)
    with pytest.raises(ValueError, match="^stride0, stride1"):
        ops.top_k_per_row_prefill(score, starts, ends, out, 4, 21, 1, 5)
    with pytest.raises(ValueError, match="^indices"):
        ops.top_k_per_row_prefill(score, starts, ends, out, 4, 20, 1, 6)
    with pytest.raises(ValueError, match="^rowStarts"):
        ops.top_k_per_row_prefill(score, starts[:3], ends, out, 4, 20, 1, 5)
    with pytest.raises(ValueError, match="^next_n"):
        ops.top_k_per_row_decode(score, 3, _i32([5]), out, 4, 20, 1, 5)
    with pytest.raises(ValueError, match="^seq_lens"):
        ops.top_k_per_row_decode(score, 2, _i32([5, 6, 7]), out, 4, 20, 1, 5)
    with pytest.raises(ValueError, match="^topk"):
        ops.top_k_per_row_decode(score, 1, _i32([5, 6, 7, 8]), out[:, :0], 4, 20, 1, 0)


@pytest.mark.parametrize("name", ["top_k_per_row_prefill", "top_k_per_row_decode"])
def test_vllm_top_k_per_row_opcheck(name):
    score = torch.randn(4, 40, device=DEVICE)
    out = torch.zeros(4, 8, dtype=torch.int32, device=DEVICE)
    args = {"top_k_per_row_prefill": (score, _i32([0, 2, 5, 0]), _i32([40, 9, 30, 40]), out, 4, 40, 1, 8),
            "top_k_per_row_decode": (score, 2, _i32([40, 25]), out, 4, 40, 1, 8)}[name]
    result = torch.library.opcheck(getattr(_vllm_ops(), name), args)
    assert all(v == "SUCCESS" for v in result.values()), result
