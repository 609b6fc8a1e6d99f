"""Local (chunked) attention virtual batches (seed: sglang PR 23757).

* the reference reproduces the worked examples of api_semantics.md §6.3 by hand;
* the kernels equal the reference (eager and graph mode, torch and numpy inputs, any strides);
* end to end: virtual batches + paged causal attention == chunked local attention computed
  directly, for page sizes 1, 16, 64, 128 (the regression test for the seed);
* the documented bound on the number of virtual batches is exact;
* bad input raises, empty batches are defined, graph mode is capturable (GPU).
"""
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import triton_xpu_attn
from helpers import DEVICE, assert_close, poison
from triton_xpu_attn import (
    make_local_attention_virtual_batches,
    max_local_attention_virtual_batches,
    normalize_page_table,
)
from triton_xpu_attn import reference as ref

PAGE_SIZES = [1, 2, 4, 16, 64, 128, 256]


def _dev(x):
    return x.to(DEVICE) if isinstance(x, torch.Tensor) else x


def _lists(outputs):
    return [np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x).tolist() for x in outputs]


# ---------------------------------------------------------------------------------------------
# hand-computed examples (api_semantics.md §6.3)
# ---------------------------------------------------------------------------------------------

WORKED = dict(
    chunk=4, page_size=2, query_start_loc=[0, 4, 14, 19], seq_lens=[6, 17, 9],
    expected=[
        [2, 2, 1, 4, 4, 1, 4, 1],
        [0, 2, 4, 5, 9, 13, 14, 18, 19],
        [4, 2, 4, 4, 4, 1, 4, 1],
        [[0, 1], [2, 3], [12, 13], [14, 15], [16, 17], [18, 19], [22, 23], [24, 25]],
    ],
)


def test_reference_worked_example():
    bt = torch.arange(30, dtype=torch.int32).reshape(3, 10)
    got = ref.make_local_attention_virtual_batches(
        WORKED["chunk"], WORKED["query_start_loc"], WORKED["seq_lens"], bt, WORKED["page_size"]
    )
    assert _lists(got) == WORKED["expected"]
    assert all(isinstance(x, np.ndarray) and x.dtype == np.int32 for x in got[:3])


def test_reference_decode_example():
    # C = 8, P = 4, one decode token each; seq 13 -> chunk [8, 16) holds 5 keys, seq 20 -> [16, 24) holds 4
    bt = torch.tensor([[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]], dtype=torch.int32)
    got = ref.make_local_attention_virtual_batches(8, [0, 1, 2], [13, 20], bt, 4)
    assert _lists(got) == [[1, 1], [0, 1, 2], [5, 4], [[12, 13], [24, 25]]]


def test_reference_graph_padding_and_truncation():
    bt = torch.arange(30, dtype=torch.int32).reshape(3, 10)
    args = (4, [0, 4, 14, 19], [6, 17, 9], bt, 2)
    padded = _lists(ref.make_local_attention_virtual_batches(*args, max_virtual_batches=10))
    assert padded[0] == WORKED["expected"][0] + [0, 0]
    assert padded[1] == WORKED["expected"][1] + [19, 19]
    assert padded[2] == WORKED["expected"][2] + [0, 0]
    assert padded[3] == WORKED["expected"][3] + [[0, 0], [0, 0]]
    cut = _lists(ref.make_local_attention_virtual_batches(*args, max_virtual_batches=5))
    assert cut == [WORKED["expected"][0][:5], WORKED["expected"][1][:6], WORKED["expected"][2][:5], WORKED["expected"][3][:5]]


def test_reference_no_clamp_to_max_seq_len():
    # sglang would clamp chunk 8 to max(seq_lens) = 6 -> 4 (page multiple): a 6-token prefill would
    # split into 4 + 2. vLLM's algorithm (ours) keeps one chunk of 8: one virtual batch of 6 keys.
    bt = torch.tensor([[7, 9, 11, 13]], dtype=torch.int32)
    got = _lists(ref.make_local_attention_virtual_batches(8, [0, 6], [6], bt, 4))
    assert got == [[6], [0, 6], [6], [[7, 9]]]


def test_reference_chunked_attention_hand_example():
    # C = 2: positions 0,1 | 2,3 | 4. Query at 3 sees keys 2..3, the one at 4 only key 4.
    q = torch.zeros(3, 1, 4, dtype=torch.float64)  # equal logits: outputs are plain means of v
    k_cache = torch.zeros(1, 5, 1, 4, dtype=torch.float64)
    v_cache = torch.arange(5, dtype=torch.float64).reshape(1, 5, 1, 1).expand(1, 5, 1, 4).clone()
    out = ref.chunked_local_attention(q, k_cache, v_cache, [0, 3], [5], torch.tensor([[0]]), 2)
    assert out[:, 0, 0].tolist() == [2.0, 2.5, 4.0]  # position 2: key 2; position 3: keys 2,3; 4: key 4


def test_kernel_worked_and_decode_examples():
    bt = torch.arange(30, dtype=torch.int32).reshape(3, 10).to(DEVICE)
    got = make_local_attention_virtual_batches(
        4, torch.tensor(WORKED["query_start_loc"], device=DEVICE), torch.tensor(WORKED["seq_lens"], device=DEVICE), bt, 2
    )
    assert _lists(got) == WORKED["expected"]
    assert all(x.dtype == torch.int32 and x.device == bt.device for x in got)
    bt = torch.tensor([[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]], dtype=torch.int32, device=DEVICE)
    got = make_local_attention_virtual_batches(8, torch.tensor([0, 1, 2], device=DEVICE), torch.tensor([13, 20], device=DEVICE), bt, 4)
    assert _lists(got) == [[1, 1], [0, 1, 2], [5, 4], [[12, 13], [24, 25]]]


def test_numpy_inputs_give_numpy_lengths():
    bt = torch.arange(30, dtype=torch.int32).reshape(3, 10).to(DEVICE)
    got = make_local_attention_virtual_batches(
        4, np.array(WORKED["query_start_loc"], dtype=np.int32), np.array(WORKED["seq_lens"], dtype=np.int64), bt, 2
    )
    assert all(isinstance(x, np.ndarray) and x.dtype == np.int32 for x in got[:3])
    assert isinstance(got[3], torch.Tensor) and got[3].device == bt.device
    assert _lists(got) == WORKED["expected"]


def test_zero_length_requests_are_defined():
    # request 0: no queries and no keys; request 1: keys but no queries; request 2: a decode token
    bt = torch.tensor([[5, 6], [7, 8], [9, 10]], dtype=torch.int32, device=DEVICE)
    qsl = torch.tensor([0, 0, 0, 1], device=DEVICE)
    seq = torch.tensor([0, 3, 4], device=DEVICE)
    got = _lists(make_local_attention_virtual_batches(2, qsl, seq, bt, 2))
    assert got == [[0, 0, 1], [0, 0, 0, 1], [0, 1, 2], [[5], [8], [10]]]
    assert _lists(ref.make_local_attention_virtual_batches(2, [0, 0, 0, 1], [0, 3, 4], bt.cpu(), 2)) == got


def test_table_without_columns():
    # requests with no keys need no pages: a [B, 0] table is valid and the local table is all 0
    zeros = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    got = _lists(make_local_attention_virtual_batches(
        4, torch.zeros(3, dtype=torch.int32, device=DEVICE), zeros, torch.zeros(2, 0, dtype=torch.int32, device=DEVICE), 2,
        validate=True,
    ))
    assert got == [[0, 0], [0, 0, 0], [0, 0], [[0, 0], [0, 0]]]


@pytest.mark.parametrize("graph", [False, True])
def test_empty_batch(graph):
    kwargs = dict(max_virtual_batches=3) if graph else {}
    got = make_local_attention_virtual_batches(
        8, torch.zeros(1, dtype=torch.int32, device=DEVICE), torch.zeros(0, dtype=torch.int32, device=DEVICE),
        torch.zeros(0, 5, dtype=torch.int32, device=DEVICE), 4, **kwargs,
    )
    v = 3 if graph else 0
    assert [tuple(x.shape) for x in got] == [(v,), (v + 1,), (v,), (v, 2)]
    assert all(int(x.abs().sum()) == 0 for x in got)


# ---------------------------------------------------------------------------------------------
# kernels == reference
# ---------------------------------------------------------------------------------------------


def _draw_batch(data, chunk, batch):
    """q lengths and context lengths that often sit on, just before or just after chunk boundaries."""
    near = st.builds(lambda k, d: max(k * chunk + d, 0), st.integers(0, 3), st.integers(-2, 2))
    q_lens = data.draw(st.lists(st.one_of(st.just(0), st.just(1), near, st.integers(0, 3 * chunk)), min_size=batch, max_size=batch))
    ctx = data.draw(st.lists(st.one_of(near, st.integers(0, 3 * chunk)), min_size=batch, max_size=batch))
    return q_lens, [q + c for q, c in zip(q_lens, ctx)]


@given(
    page_size=st.sampled_from(PAGE_SIZES),
    pages_per_chunk=st.integers(1, 4),
    batch=st.integers(0, 5),
    mode=st.sampled_from(["eager", "graph", "graph_out"]),
    numpy_inputs=st.booleans(),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    strided_table=st.booleans(),
    data=st.data(),
)
def test_kernel_matches_reference(page_size, pages_per_chunk, batch, mode, numpy_inputs, index_dtype, strided_table, data):
    chunk = page_size * pages_per_chunk
    q_lens, seq_lens = _draw_batch(data, chunk, batch)
    qsl = np.concatenate([[data.draw(st.integers(0, 3))], q_lens]).cumsum()  # query_start_loc[0] may be > 0
    max_pages = -(-max(seq_lens, default=0) // page_size) + data.draw(st.integers(0, 2))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    table = torch.randint(0, 1000, (batch, max_pages), generator=gen, dtype=index_dtype)
    bt = table.to(DEVICE)
    if strided_table:
        bt = table.t().contiguous().to(DEVICE).t()  # column stride != 1
    bound = max_local_attention_virtual_batches(batch, int(sum(q_lens)), chunk)
    m = None
    kwargs = {}
    if mode != "eager":
        m = bound + data.draw(st.integers(0, 2))
        if mode == "graph":
            kwargs["max_virtual_batches"] = m
        else:
            kwargs["out"] = tuple(
                poison(torch.empty(shape, dtype=torch.int32, device=DEVICE)) for shape in ((m,), (m + 1,), (m,), (m, pages_per_chunk))
            )
    if numpy_inputs:
        qsl_in, seq_in = qsl.astype(np.int64), np.asarray(seq_lens, dtype=np.int32)
    else:
        qsl_in = torch.tensor(qsl, dtype=index_dtype, device=DEVICE)
        seq_in = torch.tensor(seq_lens, dtype=index_dtype, device=DEVICE)
    got = make_local_attention_virtual_batches(chunk, qsl_in, seq_in, bt, page_size, validate=True, **kwargs)
    expected = ref.make_local_attention_virtual_batches(chunk, qsl, seq_lens, table, page_size, max_virtual_batches=m)
    assert _lists(got) == _lists(expected)
    if numpy_inputs:
        assert all(isinstance(x, np.ndarray) for x in got[:3])
    else:
        assert all(x.dtype == torch.int32 for x in got)
    if mode == "graph_out":  # results live in `out` (numpy mode returns copies of the lengths)
        assert all(g is o for g, o in zip(got, kwargs["out"])) or (numpy_inputs and got[3] is kwargs["out"][3])
    if mode == "eager":
        assert len(got[0]) <= bound


def test_graph_mode_truncates_when_too_small():
    bt = torch.arange(30, dtype=torch.int32).reshape(3, 10)
    args = (4, torch.tensor([0, 4, 14, 19]), torch.tensor([6, 17, 9]))
    got = make_local_attention_virtual_batches(*[_dev(a) for a in args], bt.to(DEVICE), 2, max_virtual_batches=5)
    assert _lists(got) == _lists(ref.make_local_attention_virtual_batches(*args, bt, 2, max_virtual_batches=5))


def test_bound_is_exact():
    """max_local_attention_virtual_batches equals the true maximum over every split of T query tokens
    among B requests and every alignment of each request's queries to the chunks."""
    for chunk in (1, 2, 3, 4):
        # most virtual batches one request with q queries can make, over all contexts
        most = [
            max(len(ref.make_local_attention_virtual_batches(chunk, [0, q], [q + ctx], torch.zeros(1, 0, dtype=torch.int32), 1)[0])
                for ctx in range(chunk))
            for q in range(9)
        ]
        for batch, tokens in itertools.product(range(1, 4), range(9)):
            splits = (s for s in itertools.product(range(tokens + 1), repeat=batch) if sum(s) == tokens)
            true_max = max(sum(most[q] for q in s) for s in splits)
            assert max_local_attention_virtual_batches(batch, tokens, chunk) == true_max, (chunk, batch, tokens)
    assert max_local_attention_virtual_batches(0, 0, 8) == 0
    assert max_local_attention_virtual_batches(5, 5, 8) == 7  # only T and B known: two queries can straddle
    with pytest.raises(ValueError, match="attn_chunk_size"):
        max_local_attention_virtual_batches(1, 1, 0)
    with pytest.raises(ValueError, match="num_tokens"):
        max_local_attention_virtual_batches(1, -1, 4)


# ---------------------------------------------------------------------------------------------
# end to end: virtual batches + causal paged attention == chunked local attention
# ---------------------------------------------------------------------------------------------


def _attention(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, max_seqlen_q):
    """The package's flash_attn_with_kvcache, or the reference until the kernel exists."""
    fn = getattr(triton_xpu_attn, "flash_attn_with_kvcache", None)
    if fn is None:
        return ref.paged_attention(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, causal=True)[0]
    return fn(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table, cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=max_seqlen_q, causal=True,
    )


def _token_pool(seq_lens, page_size, gen):
    """sglang-style token-granular req_to_token: each page a contiguous, page-aligned slot run;
    physical pages a random permutation (page 0, the dummy page, unused)."""
    pages_per_req = max(-(-max(seq_lens) // page_size), 1)
    num_pages = len(seq_lens) * pages_per_req + 1
    pages = (torch.randperm(num_pages - 1, generator=gen) + 1).reshape(len(seq_lens), pages_per_req)
    slots = pages[:, :, None] * page_size + torch.arange(page_size)[None, None, :]
    return slots.reshape(len(seq_lens), -1).to(torch.int32), num_pages


def _run_e2e(page_size, chunk, q_lens, seq_lens, dtype, seed=0, num_q_heads=2, num_kv_heads=1, head_dim=64):
    gen = torch.Generator().manual_seed(seed)
    req_to_token, num_pages = _token_pool(seq_lens, page_size, gen)
    k_cache = torch.randn(num_pages, page_size, num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    v_cache = torch.randn(num_pages, page_size, num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    q = torch.randn(sum(q_lens), num_q_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    qsl = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    # the sglang path: token-granular req_to_token -> page-granular table -> virtual batches
    page_table = normalize_page_table(
        req_to_token.to(DEVICE), torch.arange(len(seq_lens), device=DEVICE), seq.to(DEVICE), page_size
    )
    sq, cu, sk, bt = make_local_attention_virtual_batches(
        chunk, qsl.to(DEVICE), seq.to(DEVICE), page_table, page_size, validate=True, num_pages=num_pages
    )
    out = _attention(q, k_cache, v_cache, sk, bt, cu, int(sq.max()))
    expected = ref.chunked_local_attention(q, k_cache, v_cache, qsl, seq, page_table, chunk)
    assert_close(out, expected, dtype, what=f"chunked local attention P={page_size} C={chunk}")


def _e2e_rows(page_size, chunk):
    """(q_lens, seq_lens): prefill straddling a chunk boundary, decode in a later chunk, decode
    exactly on a boundary, a fresh prefill, a request without new queries, and (small chunks) a
    prefill spanning three chunks."""
    rows = [  # (q_len, context before the queries)
        (6, max(chunk - 3, 0)),  # queries at C-3 .. C+2
        (1, 2 * chunk + page_size // 2 + 1),
        (1, chunk),  # the query at position C sees only itself
        (min(chunk, 32) + 5, 0),
        (0, chunk + 2),
    ]
    if chunk <= 16:
        rows.append((2 * chunk + 3, chunk // 2))
    return [q for q, _ in rows], [q + ctx for q, ctx in rows]


E2E_CASES = [(1, 1), (1, 8), (16, 16), (16, 48), (64, 64), (64, 192), (128, 128), (128, 256)]


@pytest.mark.parametrize("page_size, chunk", E2E_CASES, ids=[f"P{p}-C{c}" for p, c in E2E_CASES])
def test_end_to_end_chunked_local_attention(page_size, chunk):
    q_lens, seq_lens = _e2e_rows(page_size, chunk)
    _run_e2e(page_size, chunk, q_lens, seq_lens, torch.float16)


def test_end_to_end_batch_shorter_than_chunk():
    """max(seq_lens) < C and not a page multiple: sglang's clamp (chunk -> 64 here) would split the
    70-token request into 64 + 6 and change its attention; the result must stay full causal."""
    _run_e2e(64, 192, [6, 1, 40], [6, 70, 40], torch.float16)


def test_validate_catches_a_token_granular_table():
    """The seed bug: req_to_token (slot ids) passed where page ids are expected. With the pool size
    known, validate=True rejects it instead of returning garbage."""
    gen = torch.Generator().manual_seed(0)
    req_to_token, num_pages = _token_pool([40, 70], 16, gen)
    args = (64, torch.tensor([0, 5, 6], device=DEVICE), torch.tensor([40, 70], device=DEVICE))
    with pytest.raises(ValueError, match="outside the page pool"):
        make_local_attention_virtual_batches(*args, req_to_token.to(DEVICE), 16, validate=True, num_pages=num_pages)
    page_table = normalize_page_table(req_to_token.to(DEVICE), torch.arange(2, device=DEVICE), args[2], 16)
    make_local_attention_virtual_batches(*args, page_table, 16, validate=True, num_pages=num_pages)


@given(
    page_size=st.sampled_from([1, 2, 4, 8]),
    pages_per_chunk=st.integers(1, 3),
    batch=st.integers(1, 4),
    data=st.data(),
)
def test_reference_virtual_batches_compute_chunked_attention(page_size, pages_per_chunk, batch, data):
    """The algorithm itself, in plain torch: reference virtual batches + reference causal paged
    attention == chunked local attention computed directly."""
    chunk = page_size * pages_per_chunk
    q_lens, seq_lens = _draw_batch(data, chunk, batch)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    req_to_token, num_pages = _token_pool(seq_lens, page_size, gen)
    page_table = ref.normalize_page_table(req_to_token, range(batch), seq_lens, page_size)
    k_cache = torch.randn(num_pages, page_size, 2, 8, generator=gen, dtype=torch.float64)
    v_cache = torch.randn(num_pages, page_size, 2, 8, generator=gen, dtype=torch.float64)
    q = torch.randn(sum(q_lens), 4, 8, generator=gen, dtype=torch.float64)
    qsl = [0] + list(itertools.accumulate(q_lens))
    sq, cu, sk, bt = ref.make_local_attention_virtual_batches(chunk, qsl, seq_lens, page_table, page_size)
    got = ref.paged_attention(q, k_cache, v_cache, torch.from_numpy(sk), bt, torch.from_numpy(cu), causal=True)[0]
    expected = ref.chunked_local_attention(q, k_cache, v_cache, qsl, seq_lens, page_table, chunk)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16, 64, 128])
@pytest.mark.parametrize("pages_per_chunk", [1, 4, 16])
def test_end_to_end_large(page_size, pages_per_chunk, dtype):
    chunk = page_size * pages_per_chunk
    gen = torch.Generator().manual_seed(page_size * 100 + pages_per_chunk)
    q_lens, seq_lens = [], []
    for i in range(12):
        q = 1 if i % 3 == 0 else int(torch.randint(1, min(3 * chunk + 2, 1500), (1,), generator=gen))
        ctx = int(torch.randint(0, min(4 * chunk, 3000), (1,), generator=gen))
        q_lens.append(q)
        seq_lens.append(q + ctx)
    _run_e2e(page_size, chunk, q_lens, seq_lens, dtype, seed=1, num_q_heads=4, num_kv_heads=2, head_dim=128)


# ---------------------------------------------------------------------------------------------
# graph mode on the GPU: no host sync, captured and replayed
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_graph_mode_never_syncs_and_replays_in_cuda_graph():
    if DEVICE.type != "cuda":
        pytest.skip("CUDA graphs need a CUDA device")
    chunk, page_size, batch = 64, 16, 8
    gen = torch.Generator().manual_seed(0)
    bt = torch.randint(0, 5000, (batch, 40), generator=gen, dtype=torch.int32).cuda()
    m = max_local_attention_virtual_batches(batch, 600, chunk)

    def inputs(seed):
        g = torch.Generator().manual_seed(seed)
        q = torch.multinomial(torch.ones(batch), 600, replacement=True, generator=g).bincount(minlength=batch)
        seq = q + torch.randint(0, 64, (batch,), generator=g)
        return torch.cat([torch.zeros(1, dtype=torch.int64), q.cumsum(0)]).int(), seq.int()

    qsl0, seq0 = inputs(0)
    qsl, seq = qsl0.cuda(), seq0.cuda()
    make_local_attention_virtual_batches(chunk, qsl, seq, bt, page_size, max_virtual_batches=m)  # compile
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        make_local_attention_virtual_batches(chunk, qsl, seq, bt, page_size, max_virtual_batches=m)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.graph(graph, stream=stream):
        outs = make_local_attention_virtual_batches(chunk, qsl, seq, bt, page_size, max_virtual_batches=m)
    for seed in (1, 2):
        qsl_new, seq_new = inputs(seed)
        qsl.copy_(qsl_new)
        seq.copy_(seq_new)
        for t in outs:
            poison(t)
        graph.replay()
        torch.cuda.synchronize()
        expected = ref.make_local_attention_virtual_batches(chunk, qsl_new, seq_new, bt, page_size, max_virtual_batches=m)
        assert _lists(outs) == _lists(expected)


# ---------------------------------------------------------------------------------------------
# invalid input
# ---------------------------------------------------------------------------------------------


def _args(**overrides):
    args = dict(
        attn_chunk_size=4,
        query_start_loc=torch.tensor([0, 4, 14, 19], dtype=torch.int32),
        seq_lens=torch.tensor([6, 17, 9], dtype=torch.int32),
        block_table=torch.arange(30, dtype=torch.int32).reshape(3, 10),
        page_size=2,
    )
    args.update(overrides)
    return {k: _dev(v) for k, v in args.items()}


def _call(**overrides):
    a = _args(**overrides)
    return make_local_attention_virtual_batches(
        a.pop("attn_chunk_size"), a.pop("query_start_loc"), a.pop("seq_lens"), a.pop("block_table"), a.pop("page_size"), **a
    )


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        (dict(attn_chunk_size=6, page_size=4), ValueError, "multiple of page_size"),
        (dict(attn_chunk_size=0), ValueError, "attn_chunk_size"),
        (dict(attn_chunk_size=-4), ValueError, "attn_chunk_size"),
        (dict(attn_chunk_size=4.0), TypeError, "attn_chunk_size"),
        (dict(page_size=0), ValueError, "page_size"),
        (dict(page_size=3, attn_chunk_size=6), ValueError, "page_size"),
        (dict(seq_lens=torch.tensor([6, 17], dtype=torch.int32)), ValueError, "seq_lens"),
        (dict(block_table=torch.zeros(2, 10, dtype=torch.int32)), ValueError, "block_table"),
        (dict(query_start_loc=torch.zeros(0, dtype=torch.int32)), ValueError, "query_start_loc"),
        (dict(query_start_loc=torch.tensor([0.0, 4, 14, 19])), TypeError, "query_start_loc"),
        (dict(block_table=torch.zeros(3, 10)), TypeError, "block_table"),
        (dict(block_table=np.zeros((3, 10), dtype=np.int32)), TypeError, "block_table"),
        (dict(query_start_loc=np.array([0, 4, 14, 19])), TypeError, "numpy"),
        (dict(max_virtual_batches=2), ValueError, "max_virtual_batches"),
        (dict(max_virtual_batches=-1), ValueError, "max_virtual_batches"),
        (dict(out=(torch.zeros(9, dtype=torch.int32),) * 4), ValueError, r"out\[1\]"),
        (dict(out=[torch.zeros(9, dtype=torch.int64)] * 4), TypeError, r"out\[0\]"),
        (dict(num_pages=-1), ValueError, "num_pages"),
    ],
)
def test_rejects_bad_input(overrides, error, match):
    with pytest.raises(error, match=match):
        _call(**overrides)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(query_start_loc=torch.tensor([0, 4, 3, 19], dtype=torch.int32)), "non-decreasing"),
        (dict(seq_lens=torch.tensor([3, 17, 9], dtype=torch.int32)), r"seq_lens\[0\]"),
        (dict(seq_lens=torch.tensor([6, 21, 9], dtype=torch.int32)), "more pages than block_table"),
        (dict(num_pages=20), "outside the page pool"),
        (dict(block_table=-torch.ones(3, 10, dtype=torch.int32)), "outside the page pool"),
        (dict(max_virtual_batches=7), "needs 8 virtual batches"),
    ],
)
def test_validate_rejects_inconsistent_input(overrides, match):
    _call(**overrides)  # without validate: no error, no sync to find out
    with pytest.raises(ValueError, match=match):
        _call(validate=True, **overrides)


def test_validate_checks_only_pages_that_are_read():
    # a hybrid-SWA table may hold evicted (-1) pages before the chunk; they are never read
    bt = torch.arange(30, dtype=torch.int32).reshape(3, 10)
    bt[0, :2] = -1  # request 0's queries start at position 2: chunk 0 (pages 0-1) is read
    with pytest.raises(ValueError, match="outside the page pool"):
        _call(block_table=bt, validate=True)
    bt = torch.arange(30, dtype=torch.int32).reshape(3, 10)
    bt[1, :2] = -1  # request 1's queries start at position 7: chunk 0 (pages 0-1) is never read
    bt[2, :2] = -1  # request 2's queries start at 4
    bt[1, 9] = -1  # past request 1's last page (seq 17 -> pages 0..8)
    _call(block_table=bt, validate=True, num_pages=30)


def test_kernels_are_registered_for_the_xpu_compile_check():
    from triton_xpu_attn._common import COMPILE_VARIANTS

    names = {getattr(v.kernel, "fn", v.kernel).__name__ for v in COMPILE_VARIANTS}
    assert {"_local_vb_count_kernel", "_local_vb_fill_kernel"} <= names


# ---------------------------------------------------------------------------------------------
# impossible lengths and absurd sizes: bounded outputs and grids
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("lengths", [
    ([0, 2**31 - 1, 2**31 - 1], [2**31 - 1, 6]),  # a request of 2^31 - 1 queries (and keys)
    ([0, 4, 2**31 - 1], [6, 2**31 - 1]),
    ([0, 4, 14], [6, 2**30]),  # keys past the table, few queries: nothing to cut
    ([0, 2**40, 2**41], [2**62, 2**40]),  # int64 only
    ([0, -(2**31), 8], [-5, 2**31 - 1]),  # decreasing offsets, negative lengths
])
def test_eager_outputs_are_bounded_by_the_table(index_dtype, lengths, monkeypatch):
    """Without max_virtual_batches V is read back: a request with 2^31 - 1 queries made cdiv(2^31, C)
    virtual batches (gigabytes) before. V is now at most B * max(1, cdiv(max_pages * P, C)), what
    the table can hold; more are cut as graph mode cuts (equal to a graph-mode call at that size,
    and to the host path's result). The fill's grid stays small."""
    from helpers import GridRecorder
    from triton_xpu_attn.ops import local_attention as la

    qsl, seq = lengths
    if index_dtype == torch.int32 and any(abs(x) >= 2**31 for x in qsl + seq):
        pytest.skip("int64 values")
    monkeypatch.setattr(la, "_local_vb_fill_kernel", GridRecorder(la._local_vb_fill_kernel, max_programs=64))
    chunk, page_size, max_pages = 4, 2, 5
    bt = torch.arange(2 * max_pages, dtype=torch.int32).reshape(2, max_pages)
    args = (chunk, torch.tensor(qsl, dtype=index_dtype), torch.tensor(seq, dtype=index_dtype))
    bound = 2 * max(1, -(-max_pages * page_size // chunk))  # 6
    got = make_local_attention_virtual_batches(*[_dev(a) for a in args], bt.to(DEVICE), page_size)
    assert len(got[0]) <= bound and got[3].shape == (len(got[0]), chunk // page_size)
    graph = make_local_attention_virtual_batches(
        *[_dev(a) for a in args], bt.to(DEVICE), page_size, max_virtual_batches=len(got[0]))
    assert _lists(got) == _lists(graph)
    host = la._virtual_batches_on_host(args[1], args[2], bt, chunk, page_size, None, False, None)
    assert _lists(got) == _lists(host)


def test_absurd_chunk_and_max_virtual_batches_raise():
    # a chunk of more pages than the fill's grid covers (65535 x 256), and more than 2^30 virtual
    # batches (int32 offsets in the kernel): ValueError naming the argument, before any allocation
    with pytest.raises(ValueError, match="attn_chunk_size / page_size must be at most"):
        _call(attn_chunk_size=2**32)
    with pytest.raises(ValueError, match="attn_chunk_size / page_size must be at most"):
        _call(attn_chunk_size=2**33, page_size=2)
    with pytest.raises(ValueError, match="max_virtual_batches must be at most"):
        _call(max_virtual_batches=2**30 + 1)
