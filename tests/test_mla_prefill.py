"""MLA prefill: ``flash_mla_prefill`` / ``flash_mla_prefill_get_workspace_size`` against the
float64 reference, over ragged queries with and without cached prefixes, every page size, NaN in every
cache slot no query may see, poisoned outputs, bad input, empty batches; DeepSeek widths on the GPU."""
import contextlib
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import DEVICE, FLOAT_DTYPES, INTERPRET, SMALL, assert_close
from triton_xpu_attn import (
    flash_mla_decode_get_workspace_size,
    flash_mla_get_workspace_size,
    flash_mla_prefill,
    flash_mla_prefill_get_workspace_size,
)
from triton_xpu_attn import reference as ref
from triton_xpu_attn import tune

PAGE_SIZES = [2**i for i in range(12)]  # 1 to 2048
# (R, Dr): tiny latent widths under the interpreter (one not a power of two); DeepSeek's on GPUs
SHAPES = [(32, 16), (24, 8)] if SMALL else [(512, 64), (256, 32), (32, 16)]
FP8 = getattr(torch, "float8_e4m3fn", None)
# kernel configs the property test draws from (None = the launcher's own choice)
CONFIGS = [
    None,
    dict(BLOCK_H=16, BLOCK_N=16, BLOCK_DV=16, num_warps=4, num_stages=1),  # tiled V channels
    dict(BLOCK_H=32, BLOCK_N=32, BLOCK_DV=0, num_warps=4, num_stages=1),  # tiles span tokens and keys past pages
    dict(BLOCK_H=16, BLOCK_N=32, BLOCK_DV=0, num_warps=4, num_stages=2, PREFETCH_PAGES=0),
    dict(BLOCK_H=16, BLOCK_N=16, BLOCK_DV=0, num_warps=4, num_stages=2, kv_desc=True),  # whole-page tiles via descriptors
    # XPU's latent tiles through block pointers, the score dot over latent chunks (compiled runs;
    # pages shorter than the tile and Triton >= 3.9 gather rows instead)
    dict(BLOCK_H=16, BLOCK_N=16, BLOCK_DV=32, num_warps=4, num_stages=1, latent_chunk=16),
    dict(BLOCK_H=32, BLOCK_N=16, BLOCK_DV=64, num_warps=8, num_stages=1, latent_chunk=64),
]
UNREAD_PAGE = 10**6  # page-table entries past a request's pages: never read


def _make_case(gen, q_lens, kv_lens, heads, R, Dr, page_size, dtype, *, cache_dtype=None, strided_cache=False,
               four_d_cache=False, q_layout="contiguous", pad_rows=0, nan_page_ids=False):
    """Ragged queries and a paged latent cache with randomly permuted pages. Every cache slot no
    query may see (past a request's length in its last page, pages no request owns) holds NaN;
    page-table entries past a request's pages hold an out-of-range id, or (``nan_page_ids``) the id
    of an all-NaN page."""
    batch = len(q_lens)
    pages_per_req = max(1, -(-max(kv_lens, default=0) // page_size))
    num_pages = batch * pages_per_req + 2
    width = R + Dr + (5 if strided_cache else 0)
    rows = page_size + (3 if strided_cache else 0)
    cache = torch.full((num_pages, rows, width), float("nan"))
    perm = torch.randperm(num_pages, generator=gen)
    table = perm[: batch * pages_per_req].view(batch, pages_per_req).to(torch.int32).clone()
    nan_page = int(perm[-1])  # owned by nobody
    for b, n in enumerate(kv_lens):
        keys = torch.randn(n, R + Dr, generator=gen)
        used = -(-n // page_size)
        for p in range(used):
            chunk = keys[p * page_size:(p + 1) * page_size]
            cache[int(table[b, p]), : chunk.shape[0], : R + Dr] = chunk
        table[b, used:] = nan_page if nan_page_ids else UNREAD_PAGE
    extra_cols = int(torch.randint(0, 3, (1,), generator=gen))
    fill = nan_page if nan_page_ids else UNREAD_PAGE
    table = torch.cat([table, torch.full((batch, extra_cols), fill, dtype=torch.int32)], 1)
    cache = cache.to(cache_dtype or dtype)
    cache_ref = cache[:, :page_size, : R + Dr]
    cache_dev = cache.to(DEVICE)[:, :page_size, : R + Dr]  # a view inside wider rows and pages
    if four_d_cache:
        cache_dev = cache_dev.unsqueeze(2)

    total = sum(q_lens) + pad_rows
    cu = torch.tensor([0] + [sum(q_lens[: i + 1]) for i in range(batch)], dtype=torch.int32)
    q_nope = torch.randn(total, heads, R, generator=gen).to(dtype)
    q_pe = torch.randn(total, heads, Dr, generator=gen).to(dtype)
    if q_layout == "combined":  # sglang's q_all[..., :R] / q_all[..., R:] views of one [total, H, R + Dr]
        q_all = torch.cat([q_nope, q_pe], -1).to(DEVICE)
        qn_dev, qp_dev = q_all[..., :R], q_all[..., R:]
    elif q_layout == "strided":  # token and head strides of wider buffers
        qn_dev = torch.zeros(total, heads + 1, R + 3, dtype=dtype, device=DEVICE)[:, 1:, :R]
        qp_dev = torch.zeros(total, heads + 2, Dr + 5, dtype=dtype, device=DEVICE)[:, :heads, 2:Dr + 2]
        qn_dev.copy_(q_nope)
        qp_dev.copy_(q_pe)
    else:
        qn_dev, qp_dev = q_nope.to(DEVICE), q_pe.to(DEVICE)
    seq_lens = torch.tensor(kv_lens, dtype=torch.int32)
    return dict(q_nope=q_nope, q_pe=q_pe, qn_dev=qn_dev, qp_dev=qp_dev, cache_ref=cache_ref, cache_dev=cache_dev, cu=cu,
                seq_lens=seq_lens, table=table)


@contextlib.contextmanager
def _poisoned_allocations():
    """``torch.empty`` fills float tensors with NaN inside the block, so an output element the
    kernel never writes fails the comparison."""
    original = torch.empty

    def empty(*args, **kwargs):
        t = original(*args, **kwargs)
        return t.fill_(float("nan")) if t.dtype.is_floating_point else t

    torch.empty = empty
    try:
        yield
    finally:
        torch.empty = original


def _run_and_check(c, dtype, sm_scale, *, causal=True, return_lse=True, kv_scale=None, combined=False, config=None,
                   splits=-1):
    if combined:
        qn, qp, hdv = torch.cat([c["qn_dev"], c["qp_dev"]], -1), None, c["qn_dev"].shape[-1]
    else:
        qn, qp, hdv = c["qn_dev"], c["qp_dev"], None
    max_q = int((c["cu"][1:] - c["cu"][:-1]).max()) if c["cu"].numel() > 1 else 0
    with tune.override("mla_prefill", config) if config is not None else contextlib.nullcontext():
        with _poisoned_allocations():
            got = flash_mla_prefill(qn, qp, c["cache_dev"], c["cu"].to(DEVICE), c["seq_lens"].to(DEVICE), max_q,
                                    c["table"].to(DEVICE), None, sm_scale, causal, splits, return_lse=return_lse,
                                    kv_scale=kv_scale, head_dim_v=hdv)
    exp_out, exp_lse = ref.mla_prefill(c["q_nope"], c["q_pe"], c["cache_ref"], c["cu"], c["seq_lens"], c["table"],
                                       sm_scale, causal, kv_scale=kv_scale)
    out = got[0] if return_lse else got
    assert out.dtype == dtype and out.shape == exp_out.shape
    assert_close(out, exp_out, dtype)
    if return_lse:
        lse = got[1].cpu().double()
        assert got[1].dtype == torch.float32 and lse.shape == exp_lse.shape
        finite = torch.isfinite(exp_lse)
        assert torch.equal(torch.isfinite(lse), finite), "LSE -inf pattern differs"
        assert torch.all(lse[~finite] == -math.inf)
        if finite.any():
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            assert (lse[finite] - exp_lse[finite]).abs().max() < tol
    return got


@given(
    q_lens=st.lists(st.integers(0, 12), min_size=0, max_size=3),
    data=st.data(),
    heads=st.sampled_from([1, 3, 16]),
    shape=st.sampled_from(SHAPES),
    page_size=st.sampled_from(PAGE_SIZES),
    dtype=st.sampled_from(FLOAT_DTYPES),
    causal=st.sampled_from([True, True, False]),
    q_layout=st.sampled_from(["contiguous", "combined", "strided"]),
    strided_cache=st.booleans(),
    four_d_cache=st.booleans(),
    pad_rows=st.sampled_from([0, 0, 2]),
    config=st.sampled_from(CONFIGS),
    return_lse=st.booleans(),
)
def test_mla_prefill_matches_reference(q_lens, data, heads, shape, page_size, dtype, causal, q_layout, strided_cache,
                                       four_d_cache, pad_rows, config, return_lse):
    """Full prefills (prefix 0), prefixes, and (rarely) more queries than keys, whose first
    queries see nothing."""
    R, Dr = shape
    prefixes = [data.draw(st.sampled_from([0, 0, 1, 5, 17, 40, -2])) for _ in q_lens]
    kv_lens = [max(q + p, 0) for q, p in zip(q_lens, prefixes)]
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    c = _make_case(gen, q_lens, kv_lens, heads, R, Dr, page_size, dtype, strided_cache=strided_cache,
                   four_d_cache=four_d_cache, q_layout=q_layout, pad_rows=pad_rows, nan_page_ids=data.draw(st.booleans()))
    # combined: also the q_pe=None form (one [total_q, H, R + Dr] tensor cut at head_dim_v)
    _run_and_check(c, dtype, (R + Dr) ** -0.5 * 2, causal=causal, return_lse=return_lse, config=config,
                   combined=q_layout == "combined" and data.draw(st.booleans()))


@pytest.mark.skipif(FP8 is None, reason="torch has no float8_e4m3fn")
@given(
    page_size=st.sampled_from([1, 4, 16]),
    scale_kind=st.sampled_from(["float", "tensor"]),
    seed=st.integers(0, 2**16),
)
def test_mla_prefill_fp8_cache(page_size, scale_kind, seed):
    gen = torch.Generator().manual_seed(seed)
    R, Dr = SHAPES[0]
    dtype = torch.float16 if INTERPRET else torch.bfloat16
    c = _make_case(gen, [4, 2], [4, 9], 4, R, Dr, page_size, dtype, cache_dtype=FP8)
    kv_scale = 0.37 if scale_kind == "float" else torch.tensor([0.37], device=DEVICE)
    _run_and_check(c, dtype, 0.2, kv_scale=kv_scale)


def test_mla_prefill_never_reads_unseen_slots():
    """Each request's keys end mid-page (page 4, key tiles of 16 and 32); every other slot of the
    cache, the unused table entries and the padding rows' nothing-to-see are NaN-proof."""
    gen = torch.Generator().manual_seed(11)
    R, Dr = SHAPES[0]
    for config in CONFIGS[1:3]:
        c = _make_case(gen, [5, 3, 0], [6, 10, 3], 3, R, Dr, 4, torch.float32, nan_page_ids=True, pad_rows=1)
        assert torch.isnan(c["cache_ref"]).any()
        out, lse = _run_and_check(c, torch.float32, 0.3, config=config)
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("heads", [1, 3])
def test_mla_prefill_tiles_spanning_many_tokens(heads):
    """Row tiles of up to 32 tokens (one or three heads) straddle several key tiles of the causal
    diagonal: the unmasked key range of a tile ends at its first row's bound, not its last's."""
    gen = torch.Generator().manual_seed(heads)
    R, Dr = SHAPES[0]
    c = _make_case(gen, [40, 23], [43, 23], heads, R, Dr, 8, torch.float32, pad_rows=1)
    for config in (dict(BLOCK_H=32, BLOCK_N=16, BLOCK_DV=0, num_warps=4, num_stages=1),
                   dict(BLOCK_H=16, BLOCK_N=16, BLOCK_DV=16, num_warps=4, num_stages=1)):
        _run_and_check(c, torch.float32, 0.3, config=config)


def test_reference_is_bottom_right_causal():
    """Query t of a request with q_len queries over kv_len keys equals single-token decode over the
    first kv_len - q_len + t + 1 keys (the prefix fully visible)."""
    gen = torch.Generator().manual_seed(5)
    R, Dr, H = 8, 4, 2
    c = _make_case(gen, [3, 4], [7, 4], H, R, Dr, 2, torch.float64)
    out, lse = ref.mla_prefill(c["q_nope"], c["q_pe"], c["cache_ref"], c["cu"], c["seq_lens"], c["table"], 0.5)
    for b in range(2):
        q0, q_len, kv_len = int(c["cu"][b]), int(c["cu"][b + 1] - c["cu"][b]), int(c["seq_lens"][b])
        for t in range(q_len):
            o, s = ref.mla_decode(c["q_nope"][q0 + t][None], c["q_pe"][q0 + t][None], c["cache_ref"],
                                  [kv_len - q_len + t + 1], c["table"][b:b + 1], 0.5)
            assert torch.allclose(out[q0 + t], o[0]) and torch.allclose(lse[q0 + t], s[0])
    # not causal: every query sees all kv_len keys
    out_nc, _ = ref.mla_prefill(c["q_nope"], c["q_pe"], c["cache_ref"], c["cu"], c["seq_lens"], c["table"], 0.5, False)
    o, _ = ref.mla_decode(c["q_nope"][:1], c["q_pe"][:1], c["cache_ref"], [7], c["table"][:1], 0.5)
    assert torch.allclose(out_nc[0], o[0])


def test_mla_prefill_as_sglang_calls_it():
    """sglang 0.5.23's XPU backend: keyword arguments, q_nope/q_rope cut from one [total_q, H, R + Dr]
    tensor, the MLA pool's [slots, 1, R + Dr] buffer viewed as [-1, P, R + Dr], a page-granular
    table from the token-granular one (slot // P), the prefill workspace of
    ``flash_mla_prefill_get_workspace_size(**workspace_kwargs)``."""
    gen = torch.Generator().manual_seed(4)
    R, Dr = SHAPES[0]
    P, H = 4, 3
    q_lens, kv_lens = [5, 2], [5, 9]  # a full prefill and a chunk over a 7-token prefix
    pool = torch.randn(P + 8 * P, 1, R + Dr, generator=gen)  # slot 0..P-1: sglang's dummy page
    pages = torch.tensor([[3, 7, 2], [5, 1, 8]])  # physical pages >= 1 (page 0: the dummy)
    req_to_token = (pages[:, :, None] * P + torch.arange(P)).reshape(2, -1)
    page_table = req_to_token[:, ::P] // P
    q_all = torch.randn(sum(q_lens), H, R + Dr, generator=gen)
    cu = torch.tensor([0, 5, 7], dtype=torch.int32)
    seq_lens = torch.tensor(kv_lens, dtype=torch.int32)
    workspace_kwargs = dict(max_seq_len=64, num_batches=2, num_heads=H, page_size=P, num_kv_splits=-1)
    ws = torch.empty(flash_mla_prefill_get_workspace_size(**workspace_kwargs), dtype=torch.uint8, device=DEVICE)
    q_dev = q_all.to(DEVICE)
    o = flash_mla_prefill(
        q_nope=q_dev[:, :, :R], q_pe=q_dev[:, :, R:], kv_c_and_k_pe_cache=pool.to(DEVICE).view(-1, P, R + Dr),
        cu_seqlens_q=cu.to(DEVICE), seq_lens_k=seq_lens.to(DEVICE), max_seqlen_q=5, page_table=page_table.to(torch.int32).to(DEVICE),
        workspace=ws, sm_scale=0.25, causal=True,
    )
    exp, _ = ref.mla_prefill(q_all[..., :R], q_all[..., R:], pool.view(-1, P, R + Dr), cu, seq_lens, page_table, 0.25)
    assert_close(o, exp, torch.float32)
    assert o.view(-1, H * R).shape == (7, H * R)  # sglang reshapes the output so


def test_mla_prefill_empty_batches_and_zero_lengths():
    R, Dr = SHAPES[0]
    cache = torch.randn(4, 8, R + Dr, device=DEVICE)
    z = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    cu0 = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    # no queries at all
    out, lse = flash_mla_prefill(torch.randn(0, 5, R, device=DEVICE), torch.randn(0, 5, Dr, device=DEVICE), cache, cu0, z,
                                 0, torch.zeros(0, 3, dtype=torch.int32, device=DEVICE), None, 0.1, return_lse=True)
    assert out.shape == (0, 5, R) and lse.shape == (0, 5)
    # no requests, two padding rows
    out, lse = flash_mla_prefill(torch.randn(2, 5, R, device=DEVICE), torch.randn(2, 5, Dr, device=DEVICE), cache, cu0, z,
                                 0, torch.zeros(0, 3, dtype=torch.int32, device=DEVICE), None, 0.1, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)
    # requests without keys, and one without queries
    cu = torch.tensor([0, 2, 2, 3], dtype=torch.int32, device=DEVICE)
    out, lse = flash_mla_prefill(torch.randn(3, 5, R, device=DEVICE), torch.randn(3, 5, Dr, device=DEVICE), cache, cu,
                                 torch.tensor([0, 4, 0], dtype=torch.int32, device=DEVICE),
                                 2, torch.zeros(3, 3, dtype=torch.int32, device=DEVICE), torch.empty(0, dtype=torch.uint8, device=DEVICE),
                                 0.1, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)


def test_mla_prefill_int64_indices_and_4d_cache_match_int32():
    gen = torch.Generator().manual_seed(2)
    R, Dr = SHAPES[0]
    c = _make_case(gen, [3, 2], [3, 6], 2, R, Dr, 2, torch.float32)
    args = lambda cu, sl, pt, cache: (c["qn_dev"], c["qp_dev"], cache, cu.to(DEVICE), sl.to(DEVICE), 3, pt.to(DEVICE),  # noqa: E731
                                      None, 0.2)
    a = flash_mla_prefill(*args(c["cu"], c["seq_lens"], c["table"], c["cache_dev"]))
    b = flash_mla_prefill(*args(c["cu"].long(), c["seq_lens"].long(), c["table"].long(), c["cache_dev"].unsqueeze(2)))
    assert torch.equal(a, b)


# ---- workspace ----


def test_workspace_sizes():
    assert flash_mla_prefill_get_workspace_size(4096, 4, 16, 64, -1) == 0
    assert flash_mla_prefill_get_workspace_size(max_seq_len=163840, num_batches=8, num_heads=128, page_size=1,
                                                num_kv_splits=-1) == 0  # sglang's keyword call
    assert flash_mla_prefill_get_workspace_size(0, 0) == 0
    with pytest.raises(ValueError, match="num_kv_splits"):
        flash_mla_prefill_get_workspace_size(4096, 4, 16, 64, 4)
    with pytest.raises(ValueError, match="page_size"):
        flash_mla_prefill_get_workspace_size(4096, 4, 16, 48)
    with pytest.raises(TypeError, match="max_seq_len"):
        flash_mla_prefill_get_workspace_size(4096.0, 4)
    with pytest.raises(ValueError, match="non-negative"):
        flash_mla_prefill_get_workspace_size(4096, -1)
    # sglang 0.5.23 imports the decode size under this name: the same function
    assert flash_mla_decode_get_workspace_size is flash_mla_get_workspace_size
    kw = dict(max_seq_len=4096, num_batches=4, num_heads=16, page_size=64, num_kv_splits=8)
    assert flash_mla_decode_get_workspace_size(**kw) == 4 * 16 * 8 * 512 * 4 + 2048


# ---- invalid input: one case each ----

_R, _DR = SHAPES[0]


def _valid_args():
    return dict(
        q_nope=torch.zeros(5, 3, _R), q_pe=torch.zeros(5, 3, _DR), kv_c_and_k_pe_cache=torch.zeros(4, 4, _R + _DR),
        cu_seqlens_q=torch.tensor([0, 2, 5], dtype=torch.int32), seq_lens_k=torch.tensor([3, 5], dtype=torch.int32),
        max_seqlen_q=3, page_table=torch.zeros(2, 2, dtype=torch.int32), workspace=None, sm_scale=0.1,
    )


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(q_nope=torch.zeros(5, 3, _R, dtype=torch.int32)), TypeError, "q_nope"),
        (dict(q_nope=torch.zeros(1, 5, 3, _R)), ValueError, "q_nope"),
        (dict(q_nope=[[0.0]]), TypeError, "q_nope"),
        (dict(q_pe=torch.zeros(5, 3, _DR, dtype=torch.float16)), TypeError, "q_pe"),
        (dict(q_pe=torch.zeros(5, 4, _DR)), ValueError, "q_pe"),
        (dict(kv_c_and_k_pe_cache=torch.zeros(4, 4, _R + _DR, dtype=torch.float16)), TypeError, "kv_c_and_k_pe_cache"),
        (dict(kv_c_and_k_pe_cache=torch.zeros(4, 4, _R + _DR + 8)), ValueError, "R \\+ Dr"),
        (dict(kv_c_and_k_pe_cache=torch.zeros(4, 3, _R + _DR)), ValueError, "page size"),
        (dict(kv_c_and_k_pe_cache=torch.zeros(4, 4, 2, _R + _DR)), ValueError, "kv_c_and_k_pe_cache"),
        (dict(kv_c_and_k_pe_cache=torch.zeros(4, _R + _DR, 4).transpose(1, 2)), ValueError, "kv_c_and_k_pe_cache"),
        (dict(cu_seqlens_q=torch.tensor([0.0, 2.0, 5.0])), TypeError, "cu_seqlens_q"),
        (dict(cu_seqlens_q=torch.zeros(0, dtype=torch.int32)), ValueError, "cu_seqlens_q"),
        (dict(cu_seqlens_q=torch.zeros(3, 1, dtype=torch.int32)), ValueError, "cu_seqlens_q"),
        (dict(seq_lens_k=torch.zeros(2)), TypeError, "seq_lens_k"),
        (dict(seq_lens_k=torch.zeros(3, dtype=torch.int32)), ValueError, "seq_lens_k"),
        (dict(max_seqlen_q=3.0), TypeError, "max_seqlen_q"),
        (dict(max_seqlen_q=-1), ValueError, "max_seqlen_q"),
        (dict(page_table=torch.zeros(2, 2)), TypeError, "page_table"),
        (dict(page_table=torch.zeros(3, 2, dtype=torch.int32)), ValueError, "page_table"),
        (dict(workspace=[0]), TypeError, "workspace"),
        (dict(sm_scale="0.1"), TypeError, "sm_scale"),
        (dict(sm_scale=float("inf")), ValueError, "sm_scale"),
        (dict(causal=1), TypeError, "causal"),
        (dict(num_kv_splits=2), ValueError, "num_kv_splits"),
        (dict(num_kv_splits=1.0), TypeError, "num_kv_splits"),
        (dict(kv_scale="x"), TypeError, "kv_scale"),
        (dict(q_pe=None, q_nope=torch.zeros(5, 3, 100)), ValueError, "head_dim_v"),
        # validate=True: offsets and lengths checked on the host
        (dict(validate=True, cu_seqlens_q=torch.tensor([1, 2, 5], dtype=torch.int32)), ValueError, "cu_seqlens_q\\[0\\]"),
        (dict(validate=True, cu_seqlens_q=torch.tensor([0, 3, 2], dtype=torch.int32)), ValueError, "non-decreasing"),
        (dict(validate=True, cu_seqlens_q=torch.tensor([0, 2, 6], dtype=torch.int32)), ValueError, "exceeds"),
        (dict(validate=True, seq_lens_k=torch.tensor([3, 9], dtype=torch.int32)), ValueError, "seq_lens_k"),
        (dict(validate=True, page_table=torch.tensor([[0, 1], [2, 7]], dtype=torch.int32)), ValueError, "page id"),
    ],
)
def test_mla_prefill_rejects_bad_input(change, error, match):
    args = _valid_args()
    args.update(change)
    args = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    with pytest.raises(error, match=match):
        flash_mla_prefill(**args)


# ---- GPU: DeepSeek widths in bf16, requests of 1-2k tokens ----


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("page_size", [1, 64])
def test_mla_prefill_deepseek_bf16(heads, page_size):
    """A full 1536-token prefill and a 700-token chunk over a 1300-token prefix; the float64
    reference runs on the GPU (its logits would not fit a CPU's memory comfortably)."""
    gen = torch.Generator().manual_seed(heads + page_size)
    c = _make_case(gen, [1536, 700], [1536, 2000], heads, 512, 64, page_size, torch.bfloat16, strided_cache=True)
    got, lse = flash_mla_prefill(c["qn_dev"], c["qp_dev"], c["cache_dev"], c["cu"].to(DEVICE), c["seq_lens"].to(DEVICE),
                                 1536, c["table"].to(DEVICE), None, 192**-0.5, return_lse=True)
    exp_out, exp_lse = ref.mla_prefill(c["qn_dev"], c["qp_dev"], c["cache_ref"].to(DEVICE), c["cu"], c["seq_lens"],
                                       c["table"].to(DEVICE), 192**-0.5)
    assert_close(got, exp_out, torch.bfloat16)
    assert (lse.double() - exp_lse).abs().max() < 2e-2
