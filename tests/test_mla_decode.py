import contextlib
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import DEVICE, FLOAT_DTYPES, INTERPRET, SMALL, assert_close
from triton_xpu_attn import flash_mla_decode, flash_mla_get_workspace_size
from triton_xpu_attn import reference as ref
from triton_xpu_attn import tune
from triton_xpu_attn.ops import mla_decode as mla_mod

PAGE_SIZES = [2**i for i in range(12)]  # 1 to 2048
# (R, Dr): tiny latent widths under the interpreter (one not a power of two); DeepSeek's on GPUs
SHAPES = [(32, 16), (24, 8)] if SMALL else [(512, 64), (256, 32), (32, 16)]
FP8 = getattr(torch, "float8_e4m3fn", None)
# kernel configs the property test draws from (None = the launcher's own choice)
CONFIGS = [
    None,
    dict(BLOCK_H=16, BLOCK_N=16, BLOCK_DV=16, num_warps=4, num_stages=1),  # tiled V channels
    dict(BLOCK_H=32, BLOCK_N=32, BLOCK_DV=0, num_warps=4, num_stages=1),
    dict(BLOCK_H=32, BLOCK_N=32, BLOCK_DV=0, num_warps=4, num_stages=3),  # 32-row gathers' built-in tile
    dict(BLOCK_H=16, BLOCK_N=32, BLOCK_DV=0, num_warps=4, num_stages=2, PREFETCH_PAGES=0),  # gather w/o prefetch
    dict(BLOCK_H=16, BLOCK_N=16, BLOCK_DV=0, num_warps=4, num_stages=2, kv_desc=True),  # whole-page tiles via descriptors
    # XPU's latent tiles through block pointers, the score dot over latent chunks (compiled runs;
    # pages shorter than the tile and Triton >= 3.9 gather rows instead)
    dict(BLOCK_H=16, BLOCK_N=16, BLOCK_DV=32, num_warps=4, num_stages=1, latent_chunk=16),
    dict(BLOCK_H=32, BLOCK_N=16, BLOCK_DV=64, num_warps=8, num_stages=1, latent_chunk=64),
]


@pytest.mark.parametrize("rows, page_size, work, expected", [
    (128, 64, 16, (64, 64, 8, 2)),  # 64-row tiles for 64+ rows
    (128, 1, 16, (64, 64, 8, 2)),
    (16, 1, 1, (16, 64, 4, 2)),  # 16-row tiles: long key tiles until the batch is large
    (16, 1, 16, (16, 32, 4, 2)),
    (32, 1, 1, (32, 32, 4, 3)),  # 32-row tiles over per-token gathers: 32-key tiles, 3 stages
    (24, 8, 32, (32, 32, 4, 3)),
    (32, 16, 1, (32, 64, 4, 2)),  # ... over pages the 64-key tile
    (32, 64, 32, (32, 64, 4, 2)),
])
def test_heuristic_choices_on_cuda(monkeypatch, rows, page_size, work, expected):
    """The built-in bf16 configs where no tuned file covers a bucket (the 32-row gather tile:
    bench/results/NVIDIA_H100_80GB_HBM3/experiments/tune_mla_rows32.txt)."""
    from triton_xpu_attn import device as _device

    monkeypatch.setattr(_device, "backend", lambda: "cuda")
    config = mla_mod._heuristic_config(rows, 512, torch.bfloat16, work, page_size < 16)  # the launcher's "gather"
    assert (config["BLOCK_H"], config["BLOCK_N"], config["num_warps"], config["num_stages"]) == expected


def _make_case(gen, batch, q_len, heads, R, Dr, page_size, max_len, dtype, cache_dtype, strided, four_d_cache):
    """A paged latent cache with randomly permuted pages, garbage beyond every request's pages."""
    pages_per_req = max(1, -(-max_len // page_size))
    num_pages = batch * pages_per_req + 2
    width = R + Dr + (5 if strided else 0)
    rows = page_size + (3 if strided else 0)
    buf = torch.randn(num_pages, rows, width, generator=gen).to(DEVICE)
    buf = buf.to(FP8) if cache_dtype == FP8 else buf.to(dtype)
    cache_dev = buf[:, :page_size, : R + Dr]  # a view inside wider rows and pages
    assert cache_dev.is_contiguous() != strided
    cache_ref = cache_dev.cpu()
    seq_lens = torch.randint(0, max_len + 1, (batch,), generator=gen, dtype=torch.int32)
    perm = torch.randperm(num_pages, generator=gen)[: batch * pages_per_req].view(batch, pages_per_req)
    table = perm.to(torch.int32).clone()
    # entries past a request's pages are never read: fill them with an out-of-range page id
    for b in range(batch):
        table[b, -(-int(seq_lens[b]) // page_size):] = 10**6
    extra_cols = int(torch.randint(0, 3, (1,), generator=gen))
    table = torch.cat([table, torch.full((batch, extra_cols), 10**6, dtype=torch.int32)], 1)
    q_shape = (batch, q_len, heads) if q_len > 1 else (batch, heads)
    q_nope = torch.randn(*q_shape, R, generator=gen)
    q_pe = torch.randn(*q_shape, Dr, generator=gen)
    if four_d_cache:
        cache_dev = cache_dev.unsqueeze(2)
    return (q_nope.to(dtype), q_pe.to(dtype), cache_dev, cache_ref, seq_lens, table)


def _workspace(nbytes):
    ws = torch.empty(max(nbytes, 0), dtype=torch.uint8, device=DEVICE)
    return ws.fill_(0xFF)  # fp32 NaN everywhere: an unwritten partial result shows up


def _run_and_check(q_nope, q_pe, cache, cache_ref, seq_lens, table, dtype, splits, sm_scale, kv_scale=None,
                   combined=False, config=None, return_lse=True):
    B = q_nope.shape[0]
    q_len = q_nope.shape[1] if q_nope.dim() == 4 else 1
    H, R = q_nope.shape[-2], q_nope.shape[-1]
    page_size = cache.shape[1]
    need = flash_mla_get_workspace_size(table.shape[1] * page_size, B, H, page_size, splits, q_len=q_len, head_dim_v=R,
                                        device=DEVICE)
    ws = _workspace(need)
    if combined:
        qn, qp, hdv = torch.cat([q_nope, q_pe], -1).to(DEVICE), None, R
    else:
        qn, qp, hdv = q_nope.to(DEVICE), q_pe.to(DEVICE), None
    with tune.override("mla_decode", config) if config is not None else contextlib.nullcontext():
        got = flash_mla_decode(qn, qp, cache, seq_lens.to(DEVICE), table.to(DEVICE), ws, sm_scale, splits,
                               return_lse=return_lse, kv_scale=kv_scale, head_dim_v=hdv)
    exp_out, exp_lse = ref.mla_decode(q_nope, q_pe, cache_ref, seq_lens, table, sm_scale, kv_scale=kv_scale)
    out = got[0] if return_lse else got
    assert out.dtype == dtype and out.shape == exp_out.shape
    assert_close(out, exp_out, dtype)
    if return_lse:
        lse = got[1].cpu().double()
        assert lse.dtype == torch.float64 and lse.shape == exp_lse.shape
        finite = torch.isfinite(exp_lse)
        assert torch.equal(torch.isfinite(lse), finite), "LSE -inf pattern differs"
        assert torch.all(lse[~finite] == -math.inf)
        if finite.any():
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            assert (lse[finite] - exp_lse[finite]).abs().max() < tol
    return got


@given(
    batch=st.integers(0, 3),
    q_len=st.sampled_from([1, 1, 2, 3]),
    heads=st.sampled_from([1, 3, 16, 20]),
    shape=st.sampled_from(SHAPES),
    page_size=st.sampled_from(PAGE_SIZES),
    dtype=st.sampled_from(FLOAT_DTYPES),
    splits=st.sampled_from([1, 2, 3, -1, 0]),
    strided=st.booleans(),
    four_d_cache=st.booleans(),
    combined=st.booleans(),
    config=st.sampled_from(CONFIGS),
    data=st.data(),
)
def test_mla_decode_matches_reference(batch, q_len, heads, shape, page_size, dtype, splits, strided, four_d_cache,
                                      combined, config, data):
    R, Dr = shape
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    max_len = data.draw(st.integers(1, 40 if SMALL else 3000))
    case = _make_case(gen, batch, q_len, heads, R, Dr, page_size, max_len, dtype, None, strided, four_d_cache)
    _run_and_check(*case, dtype, splits, sm_scale=(R + Dr) ** -0.5 * 2, combined=combined, config=config)


@pytest.mark.skipif(FP8 is None, reason="torch has no float8_e4m3fn")
@given(
    page_size=st.sampled_from([1, 4, 16]),
    splits=st.sampled_from([1, 2, -1]),
    scale_kind=st.sampled_from(["float", "tensor"]),
    q_len=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_mla_decode_fp8_cache(page_size, splits, scale_kind, q_len, seed):
    gen = torch.Generator().manual_seed(seed)
    R, Dr = SHAPES[0]
    dtype = torch.float16 if INTERPRET else torch.bfloat16
    case = _make_case(gen, 2, q_len, 4, R, Dr, page_size, 37, dtype, FP8, False, False)
    kv_scale = 0.37 if scale_kind == "float" else torch.tensor([0.37], device=DEVICE)
    _run_and_check(*case, dtype, splits, sm_scale=0.2, kv_scale=kv_scale)


def test_mla_reference_hand_example():
    # R = 2, Dr = 1, sm_scale 1; keys k0 = [1, 0 | 1] (logit 2), k1 = [0, 2 | 0] (logit 0)
    q_nope = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    q_pe = torch.tensor([[[1.0]]], dtype=torch.float64)
    cache = torch.tensor([[[1.0, 0.0, 1.0], [0.0, 2.0, 0.0]]], dtype=torch.float64)  # one page of size 2
    out, lse = ref.mla_decode(q_nope, q_pe, cache, [2], torch.tensor([[0]]), 1.0)
    e2 = math.exp(2)
    assert torch.allclose(out[0, 0], torch.tensor([e2 / (e2 + 1), 2 / (e2 + 1)], dtype=torch.float64))
    assert math.isclose(lse[0, 0].item(), math.log(e2 + 1))
    # q_len 2, causal: token 0 sees k0 only (out = V0, lse = 2); token 1 sees both
    out2, lse2 = ref.mla_decode(q_nope[:, None].expand(1, 2, 1, 2), q_pe[:, None].expand(1, 2, 1, 1), cache, [2],
                                torch.tensor([[0]]), 1.0)
    assert out2[0, 0, 0].tolist() == [1.0, 0.0] and lse2[0, 0, 0].item() == 2.0
    assert torch.allclose(out2[0, 1, 0], out[0, 0])
    # a zero-length request: 0 and -inf
    out0, lse0 = ref.mla_decode(q_nope, q_pe, cache, [0], torch.tensor([[0]]), 1.0)
    assert out0.abs().sum() == 0 and lse0[0, 0].item() == -math.inf


@pytest.mark.parametrize("splits", [1, 2])
def test_mla_decode_hand_example(splits):
    # the same numbers as the reference hand example, padded to tl.dot-friendly widths (R 16, Dr 16)
    R, Dr = 16, 16
    q_nope = torch.zeros(1, 1, R)
    q_pe = torch.zeros(1, 1, Dr)
    q_nope[0, 0, 0] = 1.0
    q_pe[0, 0, 0] = 1.0
    cache = torch.zeros(3, 1, R + Dr)  # page size 1; the request uses pages 2 then 0
    cache[2, 0, 0], cache[2, 0, R] = 1.0, 1.0  # k0: logit 2, V0 = e_0
    cache[0, 0, 1] = 2.0  # k1: logit 0, V1 = 2 e_1
    cache[1] = float("nan")  # never read
    ws = _workspace(flash_mla_get_workspace_size(2, 1, 1, 1, splits, head_dim_v=R, device=DEVICE))
    out, lse = flash_mla_decode(q_nope.to(DEVICE), q_pe.to(DEVICE), cache.to(DEVICE), torch.tensor([2], dtype=torch.int32, device=DEVICE),
                                torch.tensor([[2, 0]], dtype=torch.int32, device=DEVICE), ws, 1.0, splits, return_lse=True)
    e2 = math.exp(2)
    expected = torch.zeros(R)
    expected[0], expected[1] = e2 / (e2 + 1), 2 / (e2 + 1)
    assert torch.allclose(out[0, 0].cpu(), expected, atol=1e-6)
    assert math.isclose(lse[0, 0].item(), math.log(e2 + 1), rel_tol=1e-6)


@pytest.mark.parametrize("config", [None, CONFIGS[-2], CONFIGS[-1]], ids=["launcher", "chunks16", "chunks64"])
def test_mla_decode_slots_past_each_length_may_hold_nan(config):
    """Lengths that end inside a key tile and a page: the slots after them (a freed slot an engine
    reuses without zeroing) hold NaN and never reach the output, whether the latent tile is
    gathered row by row or read through block pointers in chunks (rows past the length are
    outside the block and read 0)."""
    gen = torch.Generator().manual_seed(12)
    R, Dr = SHAPES[0]
    q_nope, q_pe, cache, cache_ref, seq_lens, table = _make_case(
        gen, 3, 1, 16, R, Dr, 16, 40, torch.float32, None, False, False)
    seq_lens = torch.tensor([37, 5, 16], dtype=torch.int32)
    table = torch.tensor([[3, 8, 1, 10**6], [6, 10**6, 10**6, 10**6], [9, 10**6, 10**6, 10**6]], dtype=torch.int32)
    for b, n in enumerate(seq_lens.tolist()):
        for key in range(n, -(-n // 16) * 16):  # the rest of the request's last page
            cache[int(table[b, key // 16]), key % 16] = float("nan")
    cache[0] = float("nan")  # pages no request uses
    cache_ref = cache.cpu()
    out, _ = _run_and_check(q_nope, q_pe, cache, cache_ref, seq_lens, table, torch.float32, 1, sm_scale=0.1,
                            config=config)
    assert torch.isfinite(out).all()


def test_mla_decode_zero_lengths_and_empty_batch():
    R, Dr = SHAPES[0]
    cache = torch.randn(4, 8, R + Dr, device=DEVICE)
    table = torch.zeros(2, 3, dtype=torch.int32, device=DEVICE)
    seq_lens = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    for splits in (1, 3):
        ws = _workspace(flash_mla_get_workspace_size(24, 2, 5, 8, splits, head_dim_v=R, device=DEVICE))
        out, lse = flash_mla_decode(torch.randn(2, 5, R, device=DEVICE), torch.randn(2, 5, Dr, device=DEVICE), cache,
                                    seq_lens, table, ws, 0.1, splits, return_lse=True)
        assert torch.all(out == 0) and torch.all(lse == -math.inf)
    out, lse = flash_mla_decode(torch.randn(0, 5, R, device=DEVICE), torch.randn(0, 5, Dr, device=DEVICE), cache,
                                seq_lens[:0], table[:0], None, 0.1, -1, return_lse=True)
    assert out.shape == (0, 5, R) and lse.shape == (0, 5)
    # q_len 3 over a single key: tokens 0 and 1 see no key
    out, lse = flash_mla_decode(torch.randn(1, 3, 2, R, device=DEVICE), torch.randn(1, 3, 2, Dr, device=DEVICE), cache,
                                torch.ones(1, dtype=torch.int32, device=DEVICE), table[:1], None, 0.1, return_lse=True)
    assert torch.all(out[0, :2] == 0) and torch.all(lse[0, :2] == -math.inf) and torch.isfinite(lse[0, 2]).all()


def test_mla_decode_clamps_lengths_to_the_table():
    gen = torch.Generator().manual_seed(3)
    R, Dr = SHAPES[0]
    cache = torch.randn(6, 4, R + Dr, generator=gen)
    table = torch.tensor([[5, 1], [2, 3]], dtype=torch.int32)
    q_nope, q_pe = torch.randn(2, 2, R, generator=gen), torch.randn(2, 2, Dr, generator=gen)
    got = flash_mla_decode(q_nope.to(DEVICE), q_pe.to(DEVICE), cache.to(DEVICE), torch.tensor([100, 7], dtype=torch.int32, device=DEVICE),
                           table.to(DEVICE), None, 0.3)
    exp, _ = ref.mla_decode(q_nope, q_pe, cache, [8, 7], table, 0.3)
    assert_close(got, exp, torch.float32)


def test_mla_decode_is_deterministic():
    gen = torch.Generator().manual_seed(7)
    R, Dr = SHAPES[0]
    case = _make_case(gen, 2, 1, 3, R, Dr, 2, 40, torch.float32, None, False, False)
    q_nope, q_pe, cache, _, seq_lens, table = case
    ws = _workspace(flash_mla_get_workspace_size(table.shape[1] * 2, 2, 3, 2, 3, head_dim_v=R, device=DEVICE))
    args = (q_nope.to(DEVICE), q_pe.to(DEVICE), cache, seq_lens.to(DEVICE), table.to(DEVICE), ws, 0.3, 3)
    a = flash_mla_decode(*args, return_lse=True)
    b = flash_mla_decode(*args, return_lse=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---- workspace ----


@given(
    batch=st.integers(1, 300),
    heads=st.sampled_from([1, 16, 32, 64, 128]),
    q_len=st.integers(1, 4),
    units=st.sampled_from([4, 20, 64, 132]),
    lengths=st.lists(st.integers(0, 200_000), min_size=2, max_size=2),
)
def test_auto_splits_grow_with_length(batch, heads, q_len, units, lengths):
    short, long = sorted(lengths)
    a = mla_mod._auto_splits(batch, q_len * heads, short, units)
    b = mla_mod._auto_splits(batch, q_len * heads, long, units)
    assert 1 <= a <= b <= mla_mod._MAX_AUTO_SPLITS


@given(
    max_seq_len=st.integers(1, 5000),
    batch=st.integers(1, 8),
    heads=st.sampled_from([1, 16, 128]),
    page_size=st.sampled_from(PAGE_SIZES),
    splits=st.sampled_from([-1, 0, 1, 2, 7]),
    q_len=st.integers(1, 3),
)
def test_workspace_size_matches_what_decode_checks(max_seq_len, batch, heads, page_size, splits, q_len):
    """A workspace of exactly the reported size is accepted; one byte less is refused."""
    R, Dr = SHAPES[0]
    need = flash_mla_get_workspace_size(max_seq_len, batch, heads, page_size, splits, q_len=q_len, head_dim_v=R, device=DEVICE)
    if splits == 1:
        assert need == 0
    if need == 0:
        return
    max_pages = -(-max_seq_len // page_size)
    cache = torch.zeros(1, page_size, R + Dr, device=DEVICE)
    table = torch.zeros(batch, max_pages, dtype=torch.int32, device=DEVICE)
    seq_lens = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    shape = (batch, q_len, heads) if q_len > 1 else (batch, heads)
    q_nope, q_pe = torch.zeros(*shape, R, device=DEVICE), torch.zeros(*shape, Dr, device=DEVICE)
    with pytest.raises(ValueError, match=f"needs {need} bytes"):
        flash_mla_decode(q_nope, q_pe, cache, seq_lens, table, torch.empty(need - 1, dtype=torch.uint8, device=DEVICE),
                         0.1, splits)
    out = flash_mla_decode(q_nope, q_pe, cache, seq_lens, table, torch.empty(need, dtype=torch.uint8, device=DEVICE), 0.1, splits)
    assert torch.all(out == 0)


def test_workspace_size_examples():
    # splits 8, B 4, H 16, R 512: 4*16*8*512*4 bytes of partial outputs + 4*16*8*4 of LSEs (256-aligned)
    assert flash_mla_get_workspace_size(4096, 4, 16, 64, 8) == 4 * 16 * 8 * 512 * 4 + 2048
    assert flash_mla_get_workspace_size(4096, 4, 16, 64, 1) == 0
    assert flash_mla_get_workspace_size(4096, 3, 1, 64, 2, head_dim_v=16) == 512 + 256
    with pytest.raises(ValueError, match="num_heads"):
        flash_mla_get_workspace_size(4096, 4, 0, 64, -1)
    with pytest.raises(ValueError, match="page_size"):
        flash_mla_get_workspace_size(4096, 4, 16, 48, -1)
    with pytest.raises(TypeError, match="max_seq_len"):
        flash_mla_get_workspace_size(4096.0, 4, 16, 64, -1)


# ---- invalid input: one case each ----


def _valid_args():
    R, Dr = SHAPES[0]
    return dict(
        q_nope=torch.zeros(2, 3, R), q_pe=torch.zeros(2, 3, Dr), kv_c_and_k_pe_cache=torch.zeros(4, 4, R + Dr),
        seq_lens=torch.tensor([3, 5], dtype=torch.int32), page_table=torch.zeros(2, 2, dtype=torch.int32),
        workspace=None, sm_scale=0.1, num_kv_splits=1,
    )


_R, _DR = SHAPES[0]


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(q_nope=torch.zeros(2, 3, _R, dtype=torch.int32)), TypeError, "q_nope"),
        (dict(q_nope=torch.zeros(2, _R)), ValueError, "q_nope"),
        (dict(q_nope=[[0.0]]), TypeError, "q_nope"),
        (dict(q_pe=torch.zeros(2, 3, _DR, dtype=torch.float16)), TypeError, "q_pe"),
        (dict(q_pe=torch.zeros(2, 4, _DR)), ValueError, "q_pe"),
        (dict(q_pe=torch.zeros(2, 3, 1, _DR)), ValueError, "q_pe"),
        (dict(kv_c_and_k_pe_cache=torch.zeros(4, 4, _R + _DR, dtype=torch.float16)), TypeError, "kv_c_and_k_pe_cache"),
        (dict(kv_c_and_k_pe_cache=torch.zeros(4, 4, _R + _DR + 8)), ValueError, "R \\+ Dr"),  # mismatched R/Dr
        (dict(q_pe=torch.zeros(2, 3, _DR + 8)), ValueError, "R \\+ Dr"),
        (dict(kv_c_and_k_pe_cache=torch.zeros(4, 3, _R + _DR)), ValueError, "page size"),
        (dict(kv_c_and_k_pe_cache=torch.zeros(1, 4096, _R + _DR)), ValueError, "page size"),
        (dict(kv_c_and_k_pe_cache=torch.zeros(4, 4, 2, _R + _DR)), ValueError, "kv_c_and_k_pe_cache"),
        (dict(kv_c_and_k_pe_cache=torch.zeros(4, _R + _DR, 4).transpose(1, 2)), ValueError, "kv_c_and_k_pe_cache"),
        (dict(kv_c_and_k_pe_cache=torch.zeros(4, 4)), ValueError, "kv_c_and_k_pe_cache"),
        (dict(seq_lens=torch.zeros(2)), TypeError, "seq_lens"),
        (dict(seq_lens=torch.zeros(3, dtype=torch.int32)), ValueError, "seq_lens"),
        (dict(page_table=torch.zeros(2, 2)), TypeError, "page_table"),
        (dict(page_table=torch.zeros(3, 2, dtype=torch.int32)), ValueError, "page_table"),
        (dict(page_table=torch.zeros(2, dtype=torch.int32)), ValueError, "page_table"),
        (dict(sm_scale="0.1"), TypeError, "sm_scale"),
        (dict(sm_scale=float("nan")), ValueError, "sm_scale"),
        (dict(num_kv_splits=2.0), TypeError, "num_kv_splits"),
        (dict(num_kv_splits=4), ValueError, "workspace"),  # no workspace but 4 splits need one
        (dict(num_kv_splits=4, workspace=torch.zeros(16, dtype=torch.uint8)), ValueError, "bytes"),
        (dict(workspace=torch.zeros(2, 8, dtype=torch.uint8)), ValueError, "workspace"),
        (dict(q_pe=None, q_nope=torch.zeros(2, 3, 100)), ValueError, "head_dim_v"),
        (dict(q_pe=None, q_nope=torch.zeros(2, 3, _R + _DR), head_dim_v=_R + _DR), ValueError, "head_dim_v"),
        (dict(kv_scale="x"), TypeError, "kv_scale"),
        (dict(kv_scale=torch.ones(2)), ValueError, "kv_scale"),
    ],
)
def test_mla_decode_rejects_bad_input(change, error, match):
    args = _valid_args()
    args.update(change)
    args = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    with pytest.raises(error, match=match):
        flash_mla_decode(**args)


# ---- GPU: DeepSeek shapes in bf16 ----


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("splits", [1, -1])
@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("prefetch", [0, 1])
def test_mla_decode_deepseek_bf16(heads, page_size, splits, q_len, prefetch):
    gen = torch.Generator().manual_seed(heads + page_size)
    case = _make_case(gen, 3, q_len, heads, 512, 64, page_size, 1500, torch.bfloat16, None, True, False)
    config = None if prefetch else dict(PREFETCH_PAGES=0)  # the page-id prefetch of short pages on and off
    _run_and_check(*case, torch.bfloat16, splits, sm_scale=192**-0.5, config=config)


@pytest.mark.parametrize("splits", [65536, 2**31 - 1, 2**40])
def test_num_kv_splits_past_the_grid_limit_raises(splits):
    """The splits are the grid's second axis (CUDA: at most 65535): a larger count raises naming
    num_kv_splits (decode and the workspace query alike) instead of Triton's launch error."""
    with pytest.raises(ValueError, match="num_kv_splits must be at most 65535"):
        flash_mla_get_workspace_size(4096, 2, 3, 4, splits, head_dim_v=_R)
    args = _valid_args()
    args.update(num_kv_splits=splits, workspace=torch.zeros(256, dtype=torch.uint8))
    args = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    with pytest.raises(ValueError, match="num_kv_splits must be at most 65535"):
        flash_mla_decode(**args)
    # the limit itself is accepted (sized, not launched: 65535 programs a row under the interpreter)
    align = mla_mod._align
    assert flash_mla_get_workspace_size(4096, 2, 3, 4, 65535, head_dim_v=16) == (
        align(2 * 3 * 65535 * 16 * 4) + align(2 * 3 * 65535 * 4))


@pytest.mark.parametrize("splits, q_len", [(1, 1), (2, 2)])
def test_mla_decode_batch_past_the_grid_axis_launches_in_chunks(monkeypatch, splits, q_len):
    """Requests are the grid's third axis (CUDA: at most 65535): a larger batch launches in chunks
    of requests, each over its slice of q, lengths, page table, output and partials. The limit is
    patched to 3 here: 7 requests in launches of 3, 3 and 1, every output against the reference."""
    from helpers import GridRecorder

    monkeypatch.setattr(mla_mod, "MAX_GRID_DIM_1", 3)
    recorder = GridRecorder(mla_mod._mla_attention_kernel)
    monkeypatch.setattr(mla_mod, "_mla_attention_kernel", recorder)
    gen = torch.Generator().manual_seed(5)
    case = _make_case(gen, 7, q_len, 16, _R, _DR, 4, 12, torch.float32, torch.float32, False, False)
    _run_and_check(*case, torch.float32, splits, 0.3)
    assert [grid[2] for grid in recorder.grids] == [3, 3, 1]
