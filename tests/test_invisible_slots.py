"""A key no query may see never reaches the output.

Serving engines free KV slots and reuse them without zeroing, so a slot left of every query's
window, past a request's length in its last page, in an unused page (page 0, sglang's dummy) or
in another request's page may hold NaN or inf. Masking its score is not enough (``0 * NaN`` in
``P @ V`` is NaN): such slots must never be loaded. Every test fills all of them with NaN (or
+inf) after the float64 reference is computed without them, and asks for that reference.
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import FLOAT_DTYPES, KV_LOADS, assert_close, invisible_slots, kv_load_config
from test_mla_decode import CONFIGS, SHAPES, _make_case, _run_and_check
from test_paged_attention import attention_problems, check_lse, run_problem, short_tile_problems
from triton_xpu_attn import tune

FILLS = [float("nan"), float("inf")]


def check_paged(pb, fill):
    got, lse, _, out_ref, lse_ref = run_problem(pb, invisible=fill)
    assert torch.isfinite(got).all(), "a slot no query may see reached the output"
    assert_close(got, out_ref, pb["dtype"])
    check_lse(lse, lse_ref, pb["dtype"])


@st.composite
def windowed_problems(draw):
    """``attention_problems`` with a left window most of the time: the slots left of it share the
    first key tile with visible ones."""
    pb = draw(attention_problems(max_ctx=60))
    pb["window"] = (draw(st.sampled_from([-1, 0, 1, 5, 17])), pb["window"][1])
    return pb


@given(pb=windowed_problems(), fill=st.sampled_from(FILLS))
def test_paged_attention_never_reads_a_slot_no_query_sees(pb, fill):
    check_paged(pb, fill)


@settings(max_examples=max(40, settings().max_examples))
@given(pb=short_tile_problems(), block_n=st.sampled_from([16, 32, 64]), fill=st.sampled_from(FILLS),
       kv_load=st.sampled_from(KV_LOADS))
def test_short_key_tiles_and_splits_never_read_a_slot_no_query_sees(pb, block_n, fill, kv_load):
    """16/32-key tiles: several tiles per split, split boundaries inside windows, tiles that skip
    the element mask beside tiles that need it; with descriptors the tiles of whole pages load
    through tensor descriptors (whole rows) and only the edge tiles through masked pointers; with
    block pointers (the XPU path) every tile of a page loads its visible rows only, the rest read
    as 0 by the boundary check (rows left of the window, past the length)."""
    with tune.override("paged_attention", dict(BLOCK_N=block_n, BLOCK_M=16, **kv_load_config(kv_load))):
        check_paged(pb, fill)


@st.composite
def prefill_gather_problems(draw):
    """Prefill launches (a request of more than 16 queries) over pages shorter than the key tile:
    the row gathers whose page slots and in-page offsets the kernel splits into a per-tile scalar
    and loop-invariant parts (``HOIST_GATHER``)."""
    batch = draw(st.integers(1, 2))
    q_lens = [draw(st.integers(17, 40))] + [draw(st.integers(0, 40)) for _ in range(batch - 1)]
    kv_lens = [q + draw(st.integers(0, 50)) for q in q_lens]
    causal = draw(st.booleans())
    return dict(
        dtype=draw(st.sampled_from([torch.float32, torch.float16])), batch=batch,
        group=draw(st.sampled_from([1, 2, 4])), num_kv_heads=draw(st.integers(1, 2)), head_dim=64, head_dim_v=64,
        page_size=draw(st.sampled_from([2, 4, 8, 16, 32])), q_lens=q_lens, kv_lens=kv_lens, causal=causal,
        window=(draw(st.sampled_from([-1, -1, 0, 9, 33])), -1 if causal else draw(st.sampled_from([-1, 0, 5]))),
        softcap=draw(st.sampled_from([0.0, 5.0])), sinks=draw(st.booleans()),
        layout=draw(st.sampled_from(["contiguous", "combined", "layered", "padded"])),
        num_splits=draw(st.sampled_from([0, 1, 3])), four_d=False, give_max_seqlen_q=draw(st.booleans()),
        extra_pages=1, seed=draw(st.integers(0, 2**16)),
    )


@given(pb=prefill_gather_problems(), block_n=st.sampled_from([32, 64]), fill=st.sampled_from(FILLS))
def test_prefill_gathers_of_short_pages_never_read_a_slot_no_query_sees(pb, block_n, fill):
    """Prefill tiles of 32/64 keys over 2- to 32-token pages (several pages a tile, the page table
    read per row), windows and splits, invisible slots filled with NaN/inf."""
    with tune.override("paged_attention", dict(BLOCK_N=block_n, BLOCK_M=16)):
        check_paged(pb, fill)


@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("fill", FILLS)
def test_issue_case_window_5_q_len_3_page_4(num_splits, fill):
    """The reported case: window (5, 0), q_len 3, page size 4: NaN in the slots left of the window
    that share a key tile with visible ones gave NaN."""
    pb = dict(
        dtype=torch.float32, batch=2, group=2, num_kv_heads=1, head_dim=64, head_dim_v=64, page_size=4,
        q_lens=[3, 1], kv_lens=[30, 23], causal=True, window=(5, 0), softcap=0.0, sinks=False, layout="contiguous",
        num_splits=num_splits, four_d=False, give_max_seqlen_q=True, extra_pages=1, seed=7,
    )
    check_paged(pb, fill)


@pytest.mark.parametrize("page_size", [2**i for i in range(9)])
def test_every_page_size_decode_draft_and_prefill(page_size):
    """Decode, 4-token drafts and a chunked prefill, windowed, at every page size."""
    for q_lens, window, splits in (([1, 1], (9, 0), 0), ([4, 4], (6, 0), 3), ([7, 2], (5, 2), 1)):
        pb = dict(
            dtype=torch.float16, batch=2, group=4, num_kv_heads=2, head_dim=64, head_dim_v=64, page_size=page_size,
            q_lens=q_lens, kv_lens=[45, 19], causal=window[1] == 0, window=window, softcap=5.0 if splits else 0.0,
            sinks=splits == 1, layout="combined", num_splits=splits, four_d=False, give_max_seqlen_q=True,
            extra_pages=1, seed=page_size,
        )
        check_paged(pb, float("nan"))


@pytest.mark.gpu
@pytest.mark.parametrize("fill", FILLS)
def test_gpu_bf16_long_windows_never_read_a_slot_no_query_sees(fill):
    """Compiled: bf16, the built-in tiles and split counts at serving lengths."""
    for seed in range(8):
        pb = dict(
            dtype=torch.bfloat16, batch=4, group=[1, 4, 8, 6][seed % 4], num_kv_heads=2, head_dim=128, head_dim_v=128,
            page_size=[1, 16, 64, 256][seed % 4], q_lens=[1, 4, 37, 1], kv_lens=[900, 333, 1200, 5],
            causal=True, window=[(127, 0), (1000, 0), (63, 0), (-1, -1)][seed % 4], softcap=[0.0, 30.0][seed % 2],
            sinks=seed % 3 == 0, layout=["contiguous", "combined", "layered", "padded"][seed % 4],
            num_splits=[0, 1, 4][seed % 3], four_d=False, give_max_seqlen_q=seed % 2 == 0, extra_pages=2, seed=seed,
        )
        check_paged(pb, fill)


def check_mla(gen, batch, q_len, heads, page_size, max_len, dtype, splits, fill, config=None, R_Dr=SHAPES[0]):
    R, Dr = R_Dr
    q_nope, q_pe, cache, cache_ref, seq_lens, table = _make_case(
        gen, batch, q_len, heads, R, Dr, page_size, max_len, dtype, None, False, False
    )
    cache_ref = cache_ref.clone()  # the reference reads the clean copy (on the CPU, .cpu() is no copy)
    cache[invisible_slots(cache.shape[0], page_size, table, [q_len] * batch, seq_lens, causal=True)] = fill
    out = _run_and_check(q_nope, q_pe, cache, cache_ref, seq_lens, table, dtype, splits, sm_scale=(R + Dr) ** -0.5,
                         config=config)[0]
    assert torch.isfinite(out).all(), "a slot no query may see reached the output"


@given(
    batch=st.integers(1, 3),
    q_len=st.sampled_from([1, 1, 2, 4]),
    heads=st.sampled_from([1, 3, 16]),
    page_size=st.sampled_from([2**i for i in range(9)]),
    dtype=st.sampled_from(FLOAT_DTYPES),
    splits=st.sampled_from([1, 2, 3, 0]),
    config=st.sampled_from(CONFIGS),  # 16/32-key tiles, tiled V channels, gathers without prefetch
    fill=st.sampled_from(FILLS),
    seed=st.integers(0, 2**16),
    max_len=st.integers(1, 40),
)
def test_mla_decode_never_reads_a_slot_no_query_sees(batch, q_len, heads, page_size, dtype, splits, config, fill,
                                                     seed, max_len):
    check_mla(torch.Generator().manual_seed(seed), batch, q_len, heads, page_size, max_len, dtype, splits, fill, config)


@pytest.mark.gpu
@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("page_size", [1, 64])
def test_gpu_mla_decode_bf16_never_reads_a_slot_no_query_sees(q_len, page_size):
    for splits in (1, 0):
        check_mla(torch.Generator().manual_seed(page_size + q_len), 3, q_len, 16, page_size, 1500, torch.bfloat16,
                  splits, float("nan"), R_Dr=(512, 64))
