"""DeepSeek sparse attention indexer logits (``fp8_mqa_logits``, ``fp8_paged_mqa_logits``) against
the float64 references.

Every case poisons what it can: the op's output allocation starts as NaN (an element the kernel
does not write fails the comparison), keys and scales no row sees hold NaN (fp8 byte 0x7F, NaN
fp32 scales), as do queries and weights of rows that see nothing; ranges / lengths / page ids take
any value (negative, past the keys or the table, int32 extremes, a start past the end). Seen
positions compare by relative error to the reference, unseen ones must equal the fill value
exactly (0, or -inf with ``clean_logits``). Under the interpreter the shapes stay tiny (one
DeepSeek-width case: 64 heads of 128).
"""
from __future__ import annotations

import contextlib
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import DEVICE, INTERPRET, rel_error
from triton_xpu_attn import fp8_mqa_logits, fp8_paged_mqa_logits, get_paged_mqa_logits_metadata
from triton_xpu_attn import reference as ref
from triton_xpu_attn import tune
from triton_xpu_attn.ops import mqa_logits as mod

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
FP8 = torch.float8_e4m3fn
NAN_BYTE = 0x7F  # fp8 e4m3 NaN

#: ragged kernel tiles the property test draws from (None: the launcher's own choice)
RAGGED_CONFIGS = [None, dict(BLOCK_Q=16, BLOCK_K=32, num_warps=4, num_stages=1),
                  dict(BLOCK_Q=32, BLOCK_K=16, num_warps=4, num_stages=2)]
PAGED_CONFIGS = [None, dict(BLOCK_K=32, num_warps=4, num_stages=1, programs_per_unit=2),
                 dict(BLOCK_K=16, num_warps=4, num_stages=1, programs_per_unit=64)]


def _tolerance() -> float:
    # fp8 tensor-core dots accumulate in reduced precision; bf16 / fp32 dots of exact fp8 values do not
    return 2e-3 if mod._dot_kind(torch.device(DEVICE)) == "fp8" else 1e-5


class _PoisonedTorch:
    """``torch`` as the op module sees it, with ``torch.empty`` giving NaN-filled float tensors."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        t = torch.empty(*args, **kwargs)
        return t.fill_(math.nan) if t.dtype.is_floating_point else t


@pytest.fixture(scope="module")
def poisoned_outputs():
    """The op's float outputs start as NaN (an unwritten element fails the comparison)."""
    saved = mod.torch
    mod.torch = _PoisonedTorch()
    yield
    mod.torch = saved


def _config(op, config):
    return tune.override(op, config) if config is not None else contextlib.nullcontext()


def _dev(t):
    return t.to(DEVICE) if isinstance(t, torch.Tensor) else t


def _fp8(gen, shape) -> torch.Tensor:
    """Random fp8 e4m3 values (no NaN) as float8_e4m3fn."""
    return (torch.randn(shape, generator=gen) * 2).clamp(-400, 400).to(FP8)


def _edge_int(gen, n: int) -> int:
    """A range end / length: mostly inside [0, n], else negative, past n or an int32 extreme."""
    kind = int(torch.randint(0, 8, (1,), generator=gen))
    if kind < 5:
        return int(torch.randint(0, n + 1, (1,), generator=gen))
    return [-int(torch.randint(1, 100, (1,), generator=gen)), n + int(torch.randint(1, 100, (1,), generator=gen)),
            [I32_MIN, I32_MAX][int(torch.randint(0, 2, (1,), generator=gen))]][kind - 5]


def _check(out, expected, clean, what, seen=None):
    """Seen positions by relative error; unseen ones (``seen`` False; without ``seen``: the -inf
    of a clean reference) must hold the fill value exactly."""
    out = out.cpu()
    assert out.dtype == torch.float32 and out.shape == expected.shape, (out.shape, expected.shape)
    assert not torch.isnan(out).any(), f"{what}: NaN in the output"
    fill = -math.inf if clean else 0.0
    if seen is None:
        seen = expected != -math.inf if clean else torch.ones_like(expected, dtype=torch.bool)
    assert (out[~seen] == fill).all(), f"{what}: an unseen position does not hold {fill}"
    err = rel_error(out[seen], expected[seen])
    assert err < _tolerance(), f"{what}: relative error {err:.3e}"


def _ragged_seen(ks, ke, n_k):
    j = torch.arange(n_k)[None, :]
    return (j >= ks.long()[:, None]) & (j < ke.long()[:, None])


# ---- ragged keys (prefill) ----


def make_ragged(gen, n_q, h, d, n_k, *, wide=False, clean_keys=False):
    q = _fp8(gen, (n_q, h, d))
    k = _fp8(gen, (n_k, d))
    k_scale = torch.rand(n_k, generator=gen) + 0.25
    w = torch.randn(n_q, h, generator=gen)
    ks = torch.tensor([_edge_int(gen, n_k) for _ in range(n_q)], dtype=torch.int64)
    ke = torch.tensor([_edge_int(gen, n_k) for _ in range(n_q)], dtype=torch.int64)
    if not wide:
        ks, ke = ks.to(torch.int32), ke.to(torch.int32)
    if not clean_keys:
        seen = _ragged_seen(ks, ke, n_k)
        blind_keys = ~seen.any(0)
        k.view(torch.uint8)[blind_keys] = NAN_BYTE
        k_scale[blind_keys] = math.nan
        blind_rows = ~seen.any(1)
        q.view(torch.uint8)[blind_rows] = NAN_BYTE
        w[blind_rows] = math.nan
    return q, k, k_scale, w, ks, ke


@given(
    n_q=st.integers(1, 20),
    h=st.integers(1, 4),
    d=st.sampled_from([16, 32, 48]),
    n_k=st.integers(1, 40),
    wide=st.booleans(),
    clean=st.booleans(),
    as_bytes=st.booleans(),
    strided=st.booleans(),
    config=st.sampled_from(RAGGED_CONFIGS),
    seed=st.integers(0, 2**16),
)
def test_fp8_mqa_logits(poisoned_outputs, n_q, h, d, n_k, wide, clean, as_bytes, strided, config, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, k_scale, w, ks, ke = make_ragged(gen, n_q, h, d, n_k, wide=wide)
    expected = ref.fp8_mqa_logits(q, k, k_scale, w, ks, ke, clean)
    if strided:  # heads apart, key rows apart, weights transposed, scales every other element
        q = torch.cat([q.view(torch.uint8), torch.zeros_like(q.view(torch.uint8))], dim=1)[:, :h].view(FP8)
        k = torch.cat([k.view(torch.uint8), torch.zeros_like(k.view(torch.uint8))], dim=1)[:, :d].view(FP8)
        w = w.t().contiguous().t()
        k_scale = torch.stack([k_scale, k_scale], dim=1)[:, 0]
    if as_bytes:
        q, k = q.view(torch.uint8), k.view(torch.uint8)
    with _config("mqa_logits", config):
        out = fp8_mqa_logits(_dev(q), (_dev(k), _dev(k_scale)), _dev(w), _dev(ks), _dev(ke), clean_logits=clean)
    _check(out, expected, clean, "fp8_mqa_logits", _ragged_seen(ks, ke, n_k))


def test_fp8_mqa_logits_causal_deepseek_width(poisoned_outputs):
    """64 heads of 128, a causal triangle over a prefix of keys (blocks above it skip the dots)."""
    gen = torch.Generator().manual_seed(5)
    n_q, n_k, h, d = 24, 56, 64, 128
    q, k = _fp8(gen, (n_q, h, d)), _fp8(gen, (n_k, d))
    k_scale, w = torch.rand(n_k, generator=gen) + 0.5, torch.rand(n_q, h, generator=gen) / 8
    ks = torch.zeros(n_q, dtype=torch.int32)
    ke = torch.arange(n_q, dtype=torch.int32) + (n_k - n_q) + 1
    for clean in (False, True):
        out = fp8_mqa_logits(_dev(q), (_dev(k), _dev(k_scale)), _dev(w), _dev(ks), _dev(ke), clean)
        _check(out, ref.fp8_mqa_logits(q, k, k_scale, w, ks, ke, clean), clean, "deepseek width")


def test_fp8_mqa_logits_empty():
    gen = torch.Generator().manual_seed(0)
    q, k, k_scale, w, ks, ke = make_ragged(gen, 3, 2, 32, 5, clean_keys=True)
    assert fp8_mqa_logits(_dev(q[:0]), (_dev(k), _dev(k_scale)), _dev(w[:0]), _dev(ks[:0]), _dev(ke[:0])).shape == (0, 5)
    out = fp8_mqa_logits(_dev(q), (_dev(k[:0]), _dev(k_scale[:0])), _dev(w), _dev(ks), _dev(ke))
    assert out.shape == (3, 0)


# ---- paged indexer cache (decode) ----


def build_cache(gen, pages, page_size, d, layout, *, gap=0):
    """``[pages, page_size, 1, d + 4]`` uint8 cache (pages ``gap`` bytes apart when ``gap``) and its
    keys / scales as (fp8 ``[pages, page_size, d]``, fp32 ``[pages, page_size]``) views to poison."""
    page_bytes = page_size * (d + 4)
    store = torch.zeros(pages, page_bytes + gap, dtype=torch.uint8)
    cache = store[:, :page_bytes].view(pages, page_size, 1, d + 4) if pages else store.view(0, page_size, 1, d + 4)
    keys = _fp8(gen, (pages, page_size, d))
    scales = torch.rand(pages, page_size, generator=gen) + 0.25
    if layout == "page":
        store[:, : page_size * d] = keys.view(torch.uint8).reshape(pages, -1)
        store[:, page_size * d: page_bytes] = scales.view(torch.uint8).reshape(pages, -1)
    else:
        tokens = store[:, :page_bytes].view(pages, page_size, d + 4)
        tokens[:, :, :d] = keys.view(torch.uint8)
        tokens[:, :, d:] = scales.view(torch.uint8).reshape(pages, page_size, 4)
    return store, cache


def poison_unread(store, cache, layout, read):
    """NaN keys and scales in every (page, slot) that ``read`` ``[pages, page_size]`` leaves False."""
    pages, page_size, _, width = cache.shape
    d = width - 4
    for p in range(pages):
        for s in range(page_size):
            if read[p, s]:
                continue
            if layout == "page":
                store[p, s * d:(s + 1) * d] = NAN_BYTE
                store[p, page_size * d + 4 * s: page_size * d + 4 * s + 4] = torch.tensor(
                    [math.nan]).view(torch.uint8)
            else:
                base = s * width
                store[p, base: base + d] = NAN_BYTE
                store[p, base + d: base + width] = torch.tensor([math.nan]).view(torch.uint8)


def _limits(lens, batch, next_n, per_row):
    """``[B, next_n]`` visibility limits (before the table's and the output's caps)."""
    if per_row:
        return lens.long()
    flat = lens.reshape(batch).long()
    return flat[:, None] - next_n + torch.arange(next_n)[None, :] + 1


def _draw_page_id(gen, pages, wide):
    kind = int(torch.randint(0, 10, (1,), generator=gen))
    if kind < 7 and pages:
        return int(torch.randint(0, pages, (1,), generator=gen))
    big = 2**40 if wide else I32_MAX
    return [-1, pages, -big, big][kind % 4]


@given(
    batch=st.integers(1, 3),
    next_n=st.sampled_from([1, 1, 2, 3]),
    h=st.sampled_from([1, 3, 16, 20]),
    d=st.sampled_from([16, 32, 48]),
    page_size=st.sampled_from([1, 2, 4, 16]),
    pages=st.integers(1, 8),
    width=st.integers(1, 5),
    max_seq_len=st.integers(1, 40),
    lens_form=st.sampled_from(["1d", "2d1", "per_row"]),
    layout=st.sampled_from(["page", "token"]),
    wide=st.booleans(),
    clean=st.booleans(),
    as_fp8=st.booleans(),
    three_d=st.booleans(),
    gap=st.sampled_from([0, 4, 12]),
    config=st.sampled_from(PAGED_CONFIGS),
    seed=st.integers(0, 2**16),
)
def test_fp8_paged_mqa_logits(poisoned_outputs, batch, next_n, h, d, page_size, pages, width, max_seq_len, lens_form,
                              layout, wide, clean, as_fp8, three_d, gap, config, seed):
    gen = torch.Generator().manual_seed(seed)
    if three_d:
        next_n = 1
    store, cache = build_cache(gen, pages, page_size, d, layout, gap=gap)
    q = _fp8(gen, (batch, next_n, h, d))
    w = torch.randn(batch * next_n, h, generator=gen)
    per_row = lens_form == "per_row" and next_n > 1
    if lens_form == "per_row":
        lens = torch.tensor([[_edge_int(gen, width * page_size) for _ in range(next_n)] for _ in range(batch)])
    else:
        lens = torch.tensor([_edge_int(gen, width * page_size) for _ in range(batch)])
        if lens_form == "2d1":
            lens = lens[:, None]
    table = torch.tensor([[_draw_page_id(gen, pages, wide) for _ in range(width)] for _ in range(batch)])
    lens = lens.to(torch.int32).clamp(I32_MIN, I32_MAX)
    table = table if wide else table.clamp(I32_MIN, I32_MAX).to(torch.int32)
    # what is read: the (page, slot) of every seen position; everything else in the cache is NaN
    limits = _limits(lens, batch, next_n, per_row).clamp(max=min(width * page_size, max_seq_len))
    read = torch.zeros(pages, page_size, dtype=torch.bool)
    seen = torch.zeros(batch * next_n, max_seq_len, dtype=torch.bool)
    for b in range(batch):
        for r in range(next_n):
            for j in range(max(int(limits[b, r]), 0)):
                seen[b * next_n + r, j] = 0 <= int(table[b, j // page_size]) < pages
        reach = int(limits[b].max())
        for j in range(max(reach, 0)):
            p = int(table[b, j // page_size])
            if 0 <= p < pages:
                read[p, j % page_size] = True
        blind = limits[b] <= 0
        q.view(torch.uint8)[b, blind] = NAN_BYTE
        w[b * next_n: (b + 1) * next_n][blind] = math.nan
    poison_unread(store, cache, layout, read)
    expected = ref.fp8_paged_mqa_logits(q, cache, w, lens, table, max_seq_len, clean, kv_layout=layout)
    q_in = q[:, 0] if three_d else q
    q_in = q_in if as_fp8 else q_in.view(torch.uint8)
    cache_in = cache.view(FP8) if as_fp8 else cache
    with _config("paged_mqa_logits", config):
        out = fp8_paged_mqa_logits(_dev(q_in), _dev(cache_in), _dev(w), _dev(lens), _dev(table), None, max_seq_len,
                                   clean, kv_layout=layout)
    _check(out, expected, clean, "fp8_paged_mqa_logits", seen)


def test_fp8_paged_mqa_logits_deepseek_width(poisoned_outputs):
    """64 heads of 128, 64-token pages, MTP rows (next_n 2) through shuffled pages."""
    gen = torch.Generator().manual_seed(3)
    batch, next_n, h, d, page_size, pages = 2, 2, 64, 128, 64, 5
    store, cache = build_cache(gen, pages, page_size, d, "page")
    q, w = _fp8(gen, (batch, next_n, h, d)), torch.rand(batch * next_n, h, generator=gen) / 8
    lens = torch.tensor([70, 130], dtype=torch.int32)
    table = torch.tensor([[4, 1, 0], [2, 0, 3]], dtype=torch.int32)
    for clean in (False, True):
        out = fp8_paged_mqa_logits(_dev(q), _dev(cache), _dev(w), _dev(lens), _dev(table), None, 192, clean)
        _check(out, ref.fp8_paged_mqa_logits(q, cache, w, lens, table, 192, clean), clean, "deepseek width")


def test_fp8_paged_mqa_logits_empty_and_no_pages():
    gen = torch.Generator().manual_seed(1)
    store, cache = build_cache(gen, 2, 4, 32, "page")
    q, w = _fp8(gen, (2, 1, 2, 32)), torch.ones(2, 2)
    lens, table = torch.tensor([3, 8], dtype=torch.int32), torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)
    args = [_dev(t) for t in (q, cache, w, lens, table)]
    assert fp8_paged_mqa_logits(*args, None, 0).shape == (2, 0)
    assert fp8_paged_mqa_logits(args[0][:0], args[1], args[2][:0], args[3][:0], args[4][:0], None, 8).shape == (0, 8)
    out = fp8_paged_mqa_logits(args[0], args[1][:0], *args[2:], None, 8, True)  # an empty pool: nothing seen
    assert torch.equal(out.cpu(), torch.full((2, 8), -math.inf))
    out = fp8_paged_mqa_logits(*args[:4], args[4][:, :0], None, 8)  # an empty table
    assert torch.equal(out.cpu(), torch.zeros(2, 8))


def test_schedule_metadata_placeholder():
    lens = _dev(torch.tensor([5, 9], dtype=torch.int32))
    meta = get_paged_mqa_logits_metadata(lens, 64, 132)
    assert meta.shape == (133, 2) and meta.dtype == torch.int32 and meta.device == lens.device
    with pytest.raises(ValueError, match="num_sms"):
        get_paged_mqa_logits_metadata(lens, 64, 0)
    with pytest.raises(TypeError, match="context_lens"):
        get_paged_mqa_logits_metadata(lens.float(), 64, 4)


# ---- bad input: errors name the argument ----


def _ragged_args():
    gen = torch.Generator().manual_seed(0)
    q, k, k_scale, w, ks, ke = make_ragged(gen, 3, 2, 32, 5, clean_keys=True)
    return dict(q_fp8=q, kv_fp8=(k, k_scale), weights=w, ks=ks, ke=ke)


RAGGED_BAD = [
    ("q_fp8", lambda a: a["q_fp8"].float(), TypeError),
    ("q_fp8", lambda a: a["q_fp8"][0], ValueError),
    ("q_fp8", lambda a: a["q_fp8"].view(torch.uint8)[..., :24], ValueError),  # D not a multiple of 16
    ("kv_fp8", lambda a: a["kv_fp8"][0], TypeError),
    ("k_fp8", lambda a: (a["kv_fp8"][0].view(torch.uint8)[:, :16], a["kv_fp8"][1]), ValueError),
    ("k_scale", lambda a: (a["kv_fp8"][0], a["kv_fp8"][1].half()), TypeError),
    ("k_scale", lambda a: (a["kv_fp8"][0], a["kv_fp8"][1][:4]), ValueError),
    ("weights", lambda a: a["weights"][:, :1], ValueError),
    ("weights", lambda a: a["weights"].int(), TypeError),
    ("ks", lambda a: a["ks"].float(), TypeError),
    ("ke", lambda a: a["ke"][:2], ValueError),
    ("clean_logits", lambda a: 1, TypeError),
]


@pytest.mark.parametrize("name,bad,exc", RAGGED_BAD, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(RAGGED_BAD)])
def test_fp8_mqa_logits_bad_input(name, bad, exc):
    args = _ragged_args()
    key = "kv_fp8" if name in ("k_fp8", "k_scale") else name
    if name == "clean_logits":
        args["clean_logits"] = bad(args)
    else:
        args[key] = bad(args)
    args = {n: (tuple(_dev(t) for t in v) if isinstance(v, tuple) else _dev(v)) for n, v in args.items()}
    with pytest.raises(exc, match=name):
        fp8_mqa_logits(**args)


def _paged_args():
    gen = torch.Generator().manual_seed(0)
    store, cache = build_cache(gen, 3, 4, 32, "page")
    return dict(q_fp8=_fp8(gen, (2, 2, 3, 32)), kv_cache=cache, weights=torch.ones(4, 3),
                seq_lens=torch.tensor([3, 7], dtype=torch.int32), block_tables=torch.zeros(2, 2, dtype=torch.int32),
                schedule_metadata=None, max_seq_len=8)


PAGED_BAD = [
    ("q_fp8", lambda a: a["q_fp8"].float(), TypeError),
    ("q_fp8", lambda a: a["q_fp8"][0, 0], ValueError),
    ("kv_cache", lambda a: a["kv_cache"][..., :20], ValueError),
    ("kv_cache", lambda a: a["kv_cache"][:, :3], ValueError),  # page_size 3
    ("kv_cache", lambda a: a["kv_cache"].float(), TypeError),
    ("kv_cache", lambda a: a["kv_cache"].transpose(0, 1).contiguous().transpose(0, 1), ValueError),
    ("weights", lambda a: a["weights"][:2], ValueError),
    ("seq_lens", lambda a: a["seq_lens"][:1], ValueError),
    ("seq_lens", lambda a: a["seq_lens"].float(), TypeError),
    ("seq_lens", lambda a: torch.zeros(2, 3, dtype=torch.int32), ValueError),
    ("block_tables", lambda a: a["block_tables"][:1], ValueError),
    ("block_tables", lambda a: a["block_tables"][0], ValueError),
    ("max_seq_len", lambda a: -1, ValueError),
    ("max_seq_len", lambda a: 2.5, TypeError),
    ("clean_logits", lambda a: "yes", TypeError),
    ("kv_layout", lambda a: "interleaved", ValueError),
]


@pytest.mark.parametrize("name,bad,exc", PAGED_BAD, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(PAGED_BAD)])
def test_fp8_paged_mqa_logits_bad_input(name, bad, exc):
    args = _paged_args()
    args[name] = bad(args)
    args = {n: _dev(v) for n, v in args.items()}
    with pytest.raises(exc, match=name):
        fp8_paged_mqa_logits(**args)


# ---- custom ops, compat modules ----


def _small_paged(layout="page", next_n=1, seed=4):
    gen = torch.Generator().manual_seed(seed)
    store, cache = build_cache(gen, 4, 4, 32, layout)
    q = _fp8(gen, (2, next_n, 3, 32))
    w = torch.rand(2 * next_n, 3, generator=gen)
    lens = torch.tensor([6, 11], dtype=torch.int32)
    table = torch.tensor([[2, 0, 3], [1, 3, 0]], dtype=torch.int32)
    return q, cache, w, lens, table


def test_custom_ops_opcheck():
    from triton_xpu_attn import custom_ops as C

    gen = torch.Generator().manual_seed(0)
    # uint8 views of the fp8 tensors (opcheck compares inputs with arithmetic fp8 lacks on the CPU)
    q, k, k_scale, w, ks, ke = (_dev(t.view(torch.uint8) if t.dtype == FP8 else t)
                                for t in make_ragged(gen, 4, 2, 32, 6, clean_keys=True))
    for args in ((q, k, k_scale, w, ks, ke, True), (q[:0], k, k_scale, w[:0], ks[:0], ke[:0], False)):
        result = torch.library.opcheck(C.fp8_mqa_logits, args)
        assert all(v == "SUCCESS" for v in result.values()), result
    assert torch.equal(torch.ops.triton_xpu_attn.fp8_mqa_logits(q, k, k_scale, w, ks, ke, True),
                       fp8_mqa_logits(q, (k, k_scale), w, ks, ke, True))
    q, cache, w, lens, table = (_dev(t.view(torch.uint8) if t.dtype == FP8 else t) for t in _small_paged(next_n=2))
    result = torch.library.opcheck(C.fp8_paged_mqa_logits, (q, cache, w, lens, table, None, 13, True))
    assert all(v == "SUCCESS" for v in result.values()), result
    result = torch.library.opcheck(C.get_paged_mqa_logits_metadata, (lens, 64, 8))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_sgl_kernel_compat():
    import importlib

    from triton_xpu_attn.compat import sgl_kernel
    from triton_xpu_attn.compat.sgl_kernel import nsa

    # the submodule (the package attribute of that name is the function, as in sgl-kernel-xpu)
    fp8_paged_module = importlib.import_module("triton_xpu_attn.compat.sgl_kernel.fp8_paged_mqa_logits")

    assert sgl_kernel.fp8_mqa_logits is nsa.fp8_mqa_logits
    assert sgl_kernel.fp8_paged_mqa_logits is nsa.fp8_paged_mqa_logits
    assert sgl_kernel.fp8_paged_mqa_logits_triton is fp8_paged_module.fp8_paged_mqa_logits_triton
    assert fp8_paged_module.FP8_DTYPE is FP8
    gen = torch.Generator().manual_seed(0)
    q, k, k_scale, w, ks, ke = make_ragged(gen, 4, 2, 32, 6, clean_keys=True)
    expected = ref.fp8_mqa_logits(q, k, k_scale, w, ks, ke, False)  # 0 outside, whatever clean_logits says
    for clean in (False, True):
        out = nsa.fp8_mqa_logits(_dev(q.view(torch.uint8)), (_dev(k.view(torch.uint8)), _dev(k_scale)), _dev(w),
                                 _dev(ks), _dev(ke), clean)
        _check(out, expected, False, "sgl_kernel.nsa.fp8_mqa_logits")
    out = nsa._fp8_mqa_logits_impl(*(_dev(t) for t in (q, k, k_scale, w, ks, ke)))
    _check(out, expected, False, "sgl_kernel.nsa._fp8_mqa_logits_impl")
    # sgl_kernel.nsa's paged op reads per-token records; 3D queries are next_n = 1
    q, cache, w, lens, table = _small_paged("token")
    expected = ref.fp8_paged_mqa_logits(q, cache, w, lens, table, 12, False, kv_layout="token")
    out = nsa.fp8_paged_mqa_logits(*(_dev(t) for t in (q[:, 0].view(torch.uint8), cache, w, lens, table)), None, 12,
                                   True)
    _check(out, expected, False, "sgl_kernel.nsa.fp8_paged_mqa_logits")
    # fp8_paged_mqa_logits_triton reads DeepGEMM's layout and honours clean_logits; [B, 1] lengths
    q, cache, w, lens, table = _small_paged("page")
    for clean in (False, True):
        expected = ref.fp8_paged_mqa_logits(q, cache, w, lens, table, 12, clean)
        out = sgl_kernel.fp8_paged_mqa_logits_triton(_dev(q), _dev(cache.view(FP8)), _dev(w), _dev(lens[:, None]),
                                                     _dev(table), None, 12, clean_logits=clean)
        _check(out, expected, clean, "fp8_paged_mqa_logits_triton")


def test_vllm_xpu_c_ops():
    from triton_xpu_attn.compat.vllm_xpu_kernels import _xpu_C  # noqa: F401  (registers torch.ops._xpu_C.*)

    gen = torch.Generator().manual_seed(2)
    q, k, k_scale, w, ks, ke = make_ragged(gen, 5, 2, 32, 7, clean_keys=True)
    out = torch.ops._xpu_C.fp8_mqa_logits(*(_dev(t) for t in (q, k, k_scale, w, ks, ke)))
    _check(out, ref.fp8_mqa_logits(q, k, k_scale, w, ks, ke, True), True, "_xpu_C.fp8_mqa_logits")
    q, cache, w, lens, table = _small_paged("page", next_n=2)
    out = torch.ops._xpu_C.fp8_paged_mqa_logits(*(_dev(t) for t in (q, cache, w, lens, table)), None, 16)
    _check(out, ref.fp8_paged_mqa_logits(q, cache, w, lens, table, 16, True), True, "_xpu_C.fp8_paged_mqa_logits")


# ---- GPU: DeepSeek sizes, CUDA graphs ----


@pytest.mark.gpu
def test_gpu_deepseek_prefill_and_decode():
    gen = torch.Generator().manual_seed(9)
    n_q, n_k, h, d = 512, 4096, 64, 128
    q, k = _fp8(gen, (n_q, h, d)), _fp8(gen, (n_k, d))
    k_scale, w = torch.rand(n_k, generator=gen) + 0.5, torch.rand(n_q, h, generator=gen) / 8
    ks = torch.randint(0, 1024, (n_q,), generator=gen, dtype=torch.int32)
    ke = torch.arange(n_q, dtype=torch.int32) + (n_k - n_q) + 1
    out = fp8_mqa_logits(_dev(q), (_dev(k), _dev(k_scale)), _dev(w), _dev(ks), _dev(ke), True)
    _check(out, ref.fp8_mqa_logits(q, k, k_scale, w, ks, ke, True), True, "prefill")
    batch, next_n, page_size, pages = 8, 2, 64, 300
    store, cache = build_cache(gen, pages, page_size, d, "page")
    qp, wp = _fp8(gen, (batch, next_n, h, d)), torch.rand(batch * next_n, h, generator=gen) / 8
    lens = torch.randint(1, 36 * page_size, (batch,), generator=gen, dtype=torch.int32)
    table = torch.stack([torch.randperm(pages, generator=gen)[:36] for _ in range(batch)]).to(torch.int32)
    out = fp8_paged_mqa_logits(*(_dev(t) for t in (qp, cache, wp, lens, table)), None, 36 * page_size, True)
    _check(out, ref.fp8_paged_mqa_logits(qp, cache, wp, lens, table, 36 * page_size, True), True, "decode")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_gpu_cuda_graph_capture():
    gen = torch.Generator().manual_seed(1)
    q, k, k_scale, w, ks, ke = (_dev(t) for t in make_ragged(gen, 64, 8, 128, 300, clean_keys=True))
    qp, cache, wp, lens, table = (_dev(t) for t in _small_paged("page", next_n=2))
    eager = (fp8_mqa_logits(q, (k, k_scale), w, ks, ke, True),
             fp8_paged_mqa_logits(qp, cache, wp, lens, table, None, 12, True))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = (fp8_mqa_logits(q, (k, k_scale), w, ks, ke, True),
                    fp8_paged_mqa_logits(qp, cache, wp, lens, table, None, 12, True))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(eager, captured))
