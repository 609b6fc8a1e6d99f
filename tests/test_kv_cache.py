"""KV-cache ops (vLLM's ``_C_cache_ops``): ``reshape_and_cache_flash``, ``reshape_and_cache``,
``concat_and_cache_mla``, ``gather_and_maybe_dequant_cache``, ``gather_cache`` against the references, with slot mappings / block tables
holding padding (-1), slots past the cache and int64 extremes (never a write or read outside the
tensors: untouched cache entries stay bit-identical), strided cache views, fp8 e4m3 / e5m2 with
scales (caches as fp8 or uint8), bad input naming the argument, and the
``torch.ops._C_cache_ops`` registrations (vllm-xpu-kernels' schemas)."""
from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import triton_xpu_attn as tx
from helpers import DEVICE, INTERPRET
from triton_xpu_attn import reference as ref

FLOATS = [torch.float16, torch.bfloat16, torch.float32]
FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
CACHE_DTYPES = ["auto", "fp8", "fp8_e5m2"]
I64 = torch.iinfo(torch.int64)
I32 = torch.iinfo(torch.int32)


def _poisoned(shape, dtype, gen):
    """Random bytes (NaN / inf patterns included for float dtypes): untouched entries must keep them."""
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit pattern of ``t`` (NaN payloads compared exactly)."""
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _assert_cache_equal(out, expected, fp8_dtype=None):
    """Bitwise, except fp8 values written by the kernel may sit one fp8 step from the reference's on
    compiled backends (their fp32 division may round differently from torch's before the fp8
    rounding); under the interpreter the fp8 path is bitwise too."""
    out_bits, exp_bits = _bits(out), _bits(expected)
    if fp8_dtype is None or INTERPRET:
        assert torch.equal(out_bits, exp_bits), (out_bits != exp_bits).nonzero()[:8]
        return
    differ = out_bits != exp_bits
    a = out.detach().cpu()[differ].float()
    b = expected.detach().cpu()[differ].float()
    step = 2.0 ** (-3 if fp8_dtype == torch.float8_e4m3fn else -2)
    assert torch.all((a - b).abs() <= b.abs() * step + 2.0 ** -16), (a, b)


def _slots(draw, num_tokens, num_slots):
    """Distinct in-range slots (a slot written twice has no defined winner), padding -1, slots past
    the cache and int64 extremes."""
    bad = st.sampled_from([-1, -1, -2, num_slots, num_slots + 7, I64.max, I64.min, I32.max, I32.min])
    picks = draw(st.lists(st.booleans(), min_size=num_tokens, max_size=num_tokens))
    good = draw(st.permutations(range(num_slots)))
    return [good[i] if keep and i < num_slots else draw(bad) for i, keep in enumerate(picks)]


def _scale(value):
    return torch.tensor([value], dtype=torch.float32, device=DEVICE)


def _cache_pair(num_blocks, block_size, heads, d, dv, dtype, fused, gen):
    """Poisoned key / value caches: separate tensors, or the two halves of one ``[..., H, D + Dv]``
    buffer (a strided view each), as vLLM's XPU backends allocate them."""
    if fused:
        buf = _poisoned((num_blocks, block_size, heads, d + dv), dtype, gen).to(DEVICE)
        return buf, buf[..., :d], buf[..., d:]
    return None, _poisoned((num_blocks, block_size, heads, d), dtype, gen).to(DEVICE), \
        _poisoned((num_blocks, block_size, heads, dv), dtype, gen).to(DEVICE)


@given(data=st.data(), dtype=st.sampled_from(FLOATS), cache_dtype=st.sampled_from(CACHE_DTYPES),
       num_tokens=st.integers(0, 9), heads=st.sampled_from([1, 2, 3]), dims=st.sampled_from([(16, 16), (8, 24),
       (64, 64), (40, 40)]), block_size=st.sampled_from([1, 4, 16]), num_blocks=st.integers(1, 4),
       fused=st.booleans(), uint8_cache=st.booleans(), padded=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_reshape_and_cache_flash(data, dtype, cache_dtype, num_tokens, heads, dims, block_size, num_blocks, fused,
                                 uint8_cache, padded, seed):
    d, dv = dims
    gen = torch.Generator().manual_seed(seed)
    slots = _slots(data.draw, num_tokens, num_blocks * block_size)
    # key / value as slices of a wider qkv-like buffer (token stride larger than H * D)
    qkv = torch.randn(num_tokens + padded, heads, 2 * d + dv + 8, generator=gen).mul(3).to(dtype).to(DEVICE)
    key, value = qkv[:, :, 8:8 + d], qkv[:, :, 8 + d:8 + d + dv]
    fmt = FP8.get(cache_dtype, dtype)
    _, key_cache, value_cache = _cache_pair(num_blocks, block_size, heads, d, dv, fmt, fused, gen)
    k_scale, v_scale = (_scale(0.05), _scale(2.0)) if cache_dtype != "auto" else (_scale(1.0), _scale(1.0))
    exp_k, exp_v = ref.reshape_and_cache_flash(
        key.cpu(), value.cpu(), key_cache.cpu(), value_cache.cpu(), torch.tensor(slots, dtype=torch.int64),
        *((k_scale.cpu(), v_scale.cpu()) if cache_dtype != "auto" else ()))
    mapping = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    args_k, args_v = key_cache, value_cache
    if uint8_cache and cache_dtype != "auto":
        args_k, args_v = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
    tx.reshape_and_cache_flash(key, value, args_k, args_v, mapping, cache_dtype, k_scale, v_scale)
    fp8 = FP8.get(cache_dtype)
    _assert_cache_equal(key_cache, exp_k, fp8)
    _assert_cache_equal(value_cache, exp_v, fp8)


@given(data=st.data(), dtype=st.sampled_from(FLOATS), cache_dtype=st.sampled_from(CACHE_DTYPES),
       num_tokens=st.integers(0, 9), dims=st.sampled_from([(32, 16), (512, 64), (24, 8)]),
       block_size=st.sampled_from([1, 4, 16]), num_blocks=st.integers(1, 4), strided=st.booleans(),
       int32_slots=st.booleans(), seed=st.integers(0, 2**16))
def test_concat_and_cache_mla(data, dtype, cache_dtype, num_tokens, dims, block_size, num_blocks, strided,
                              int32_slots, seed):
    rank, pe = dims
    gen = torch.Generator().manual_seed(seed)
    slots = _slots(data.draw, num_tokens, num_blocks * block_size)
    if int32_slots:
        slots = [s if I32.min <= s <= I32.max else -1 for s in slots]
    kv = torch.randn(num_tokens, rank + pe + 4, generator=gen).mul(3).to(dtype).to(DEVICE)
    kv_c, k_pe = kv[:, :rank], kv[:, rank + 4:]
    fmt = FP8.get(cache_dtype, dtype)
    if strided:  # one page of a wider per-block layout: block stride past block_size * width
        whole = _poisoned((num_blocks, block_size + 2, rank + pe + 8), fmt, gen).to(DEVICE)
        kv_cache = whole[:, 1:block_size + 1, :rank + pe]
    else:
        whole = kv_cache = _poisoned((num_blocks, block_size, rank + pe), fmt, gen).to(DEVICE)
    before = whole.clone()
    scale = _scale(0.25)
    expected = ref.concat_and_cache_mla(kv_c.cpu(), k_pe.cpu(), kv_cache.cpu(), torch.tensor(slots),
                                        *((scale.cpu(),) if cache_dtype != "auto" else ()))
    mapping = torch.tensor(slots, dtype=torch.int32 if int32_slots else torch.int64, device=DEVICE)
    tx.concat_and_cache_mla(kv_c, k_pe, kv_cache, mapping, cache_dtype, scale)
    _assert_cache_equal(kv_cache, expected, FP8.get(cache_dtype))
    if strided:  # the rows and columns outside the view are untouched
        mask = torch.ones(whole.shape, dtype=torch.bool)
        mask[:, 1:block_size + 1, :rank + pe] = False
        assert torch.equal(_bits(whole)[mask], _bits(before)[mask])


def _gather_problem(draw, num_blocks, block_size, batch, max_blocks, with_starts):
    lens = [draw(st.integers(0, 7)) for _ in range(batch)]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    # block ids: mostly valid, some -1 / past the cache / extremes
    ids = st.one_of(st.integers(0, num_blocks - 1), st.sampled_from([-1, num_blocks, I32.max, I32.min]))
    table = [[draw(ids) for _ in range(max_blocks)] for _ in range(batch)]
    starts = [draw(st.one_of(st.integers(0, block_size * max_blocks), st.sampled_from([-3, I32.max])))
              for _ in range(batch)] if with_starts else None
    return cu, table, starts


@given(data=st.data(), dst_dtype=st.sampled_from(FLOATS), cache_dtype=st.sampled_from(CACHE_DTYPES),
       width=st.sampled_from([16, 48, 576]), block_size=st.sampled_from([1, 4, 16]), num_blocks=st.integers(1, 5),
       batch=st.integers(0, 4), max_blocks=st.integers(1, 4), with_starts=st.booleans(),
       index_dtype=st.sampled_from([torch.int32, torch.int64]), extra_rows=st.integers(-3, 3),
       uint8_cache=st.booleans(), seed=st.integers(0, 2**16))
def test_gather_and_maybe_dequant_cache(data, dst_dtype, cache_dtype, width, block_size, num_blocks, batch, max_blocks,
                                        with_starts, index_dtype, extra_rows, uint8_cache, seed):
    gen = torch.Generator().manual_seed(seed)
    cu, table, starts = _gather_problem(data.draw, num_blocks, block_size, batch, max_blocks, with_starts)
    src_dtype = FP8.get(cache_dtype, data.draw(st.sampled_from(FLOATS)))
    src = torch.randn(num_blocks, block_size + 1, width, generator=gen).mul(4).to(src_dtype)[:, :block_size]
    dst = torch.full((max(cu[-1] + extra_rows, 0), width), float("nan"), dtype=dst_dtype)
    table_t = torch.tensor(table, dtype=index_dtype).reshape(batch, max_blocks)
    cu_t = torch.tensor(cu, dtype=index_dtype)
    starts_t = None if starts is None else torch.tensor(starts, dtype=index_dtype)
    scale = _scale(0.37 if cache_dtype != "auto" else 1.0)  # products inexact in dst's dtype
    fp8 = cache_dtype != "auto"
    expected = ref.gather_and_maybe_dequant_cache(src, dst, table_t, cu_t, batch, scale if fp8 else None, starts_t,
                                                  dtype=torch.float32)
    close = ref.gather_and_maybe_dequant_cache(src, dst, table_t, cu_t, batch, scale if fp8 else None, starts_t)
    out = dst.to(DEVICE)
    src_arg = src.to(DEVICE)
    if uint8_cache and fp8:
        src_arg = src_arg.view(torch.uint8)
    tx.gather_and_maybe_dequant_cache(src_arg, out, table_t.to(DEVICE), cu_t.to(DEVICE), batch, cache_dtype,
                                      scale, None if starts_t is None else starts_t.to(DEVICE))
    # fp32 arithmetic (the kernel's): bitwise; the float64 reference: within one rounding
    assert torch.equal(_bits(out), _bits(expected))
    torch.testing.assert_close(out.cpu().float(), close.float(), equal_nan=True, rtol=1e-2, atol=1e-6)


@given(data=st.data(), dtype=st.sampled_from(FLOATS), cache_dtype=st.sampled_from(CACHE_DTYPES),
       num_tokens=st.integers(0, 9), heads=st.sampled_from([1, 2]), head_dim=st.sampled_from([16, 40, 64]),
       x=st.sampled_from([1, 4, 8, 16]), block_size=st.sampled_from([1, 4, 16]), num_blocks=st.integers(1, 3),
       uint8_cache=st.booleans(), strided=st.booleans(), seed=st.integers(0, 2**16))
def test_reshape_and_cache(data, dtype, cache_dtype, num_tokens, heads, head_dim, x, block_size, num_blocks,
                           uint8_cache, strided, seed):
    if head_dim % x:
        x = 8
    gen = torch.Generator().manual_seed(seed)
    slots = _slots(data.draw, num_tokens, num_blocks * block_size)
    qkv = torch.randn(num_tokens + 1, 3, heads, head_dim, generator=gen).mul(3).to(dtype).to(DEVICE)
    key, value = qkv[:, 1], qkv[:, 2]  # token stride 3 * H * D
    fmt = FP8.get(cache_dtype, dtype)
    k_shape, v_shape = (num_blocks, heads, head_dim // x, block_size, x), (num_blocks, heads, head_dim, block_size)
    if strided:  # each a slice of a wider buffer: a gap between blocks and heads
        key_cache = _poisoned((num_blocks + 1, heads + 1, *k_shape[2:]), fmt, gen).to(DEVICE)[1:, :heads]
        value_cache = _poisoned((num_blocks, heads, head_dim, block_size + 3), fmt, gen).to(DEVICE)[..., 1:block_size + 1]
    else:
        key_cache, value_cache = (_poisoned(shape, fmt, gen).to(DEVICE) for shape in (k_shape, v_shape))
    fp8 = cache_dtype != "auto"
    k_scale, v_scale = (_scale(0.05), _scale(2.0)) if fp8 else (None, None)
    exp_k, exp_v = ref.reshape_and_cache(key.cpu(), value.cpu(), key_cache.cpu(), value_cache.cpu(),
                                         torch.tensor(slots, dtype=torch.int64),
                                         *((k_scale.cpu(), v_scale.cpu()) if fp8 else ()))
    args_k, args_v = key_cache, value_cache
    if uint8_cache and fp8:
        args_k, args_v = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
    tx.reshape_and_cache(key, value, args_k, args_v, torch.tensor(slots, dtype=torch.int64, device=DEVICE), cache_dtype,
                         k_scale, v_scale)
    _assert_cache_equal(key_cache, exp_k, FP8.get(cache_dtype))
    _assert_cache_equal(value_cache, exp_v, FP8.get(cache_dtype))


@given(data=st.data(), dtype=st.sampled_from(FLOATS + [torch.uint8, torch.float8_e4m3fn, torch.int32]),
       entry=st.sampled_from([(16,), (48,), (2, 8), (656,)]), block_size=st.sampled_from([1, 4, 16]),
       num_blocks=st.integers(1, 5), batch=st.integers(0, 4), max_blocks=st.integers(1, 4),
       with_starts=st.booleans(), index_dtype=st.sampled_from([torch.int32, torch.int64]),
       extra_rows=st.integers(-3, 3), strided=st.booleans(), seed=st.integers(0, 2**16))
def test_gather_cache(data, dtype, entry, block_size, num_blocks, batch, max_blocks, with_starts, index_dtype,
                      extra_rows, strided, seed):
    gen = torch.Generator().manual_seed(seed)
    cu, table, starts = _gather_problem(data.draw, num_blocks, block_size, batch, max_blocks, with_starts)
    if strided:  # a page of a wider per-block allocation: block stride past block_size entries
        src = _poisoned((num_blocks, block_size + 2, *entry), dtype, gen)[:, 1:block_size + 1]
    else:
        src = _poisoned((num_blocks, block_size, *entry), dtype, gen)
    dst = _poisoned((max(cu[-1] + extra_rows, 0), *entry), dtype, gen)
    table_t = torch.tensor(table, dtype=index_dtype).reshape(batch, max_blocks)
    cu_t = torch.tensor(cu, dtype=index_dtype)
    starts_t = None if starts is None else torch.tensor(starts, dtype=index_dtype)
    expected = ref.gather_cache(src, dst, table_t, cu_t, batch, starts_t)
    out = dst.to(DEVICE)
    tx.gather_cache(src.to(DEVICE), out, table_t.to(DEVICE), cu_t.to(DEVICE), batch,
                    None if starts_t is None else starts_t.to(DEVICE))
    assert torch.equal(_bits(out), _bits(expected))


def test_gather_cache_starts_count_whole_blocks():
    """vLLM's ``gather_cache``: ``seq_starts[b] // block_size`` columns skipped, the offset in a block
    restarting at 0 (a start inside a block reads from that block's first entry)."""
    src = torch.arange(3 * 4 * 2, dtype=torch.float32).reshape(3, 4, 2).to(DEVICE)
    dst = torch.full((5, 2), float("nan"), device=DEVICE)
    table = torch.tensor([[2, 0, 1]], dtype=torch.int32, device=DEVICE)
    tx.gather_cache(src, dst, table, torch.tensor([0, 5], dtype=torch.int32, device=DEVICE), 1,
                    torch.tensor([6], dtype=torch.int32, device=DEVICE))
    assert torch.equal(dst.cpu(), torch.cat([src.cpu()[0], src.cpu()[1, :1]]))
    tx.gather_cache(src, dst, table, torch.tensor([0, 5], dtype=torch.int32, device=DEVICE), 1,
                    torch.tensor([-4], dtype=torch.int32, device=DEVICE))  # a negative start: zeros
    assert torch.equal(dst.cpu(), torch.zeros(5, 2))


def test_gather_rows_outside_every_request_stay_untouched_and_bad_pages_read_zero():
    src = torch.arange(2 * 4 * 8, dtype=torch.float32).reshape(2, 4, 8).to(DEVICE)
    dst = torch.full((8, 8), float("nan"), device=DEVICE)
    table = torch.tensor([[1, -1], [7, 0]], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([1, 4, 7], dtype=torch.int32, device=DEVICE)  # row 0 and row 7: no request
    starts = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
    tx.gather_and_maybe_dequant_cache(src, dst, table, cu, 2, "auto", None, starts)
    got = dst.cpu()
    assert got[0].isnan().all() and got[7].isnan().all()
    # request 0: positions 2, 3 of block 1, then position 4 -> column 1 (-1): zeros
    assert torch.equal(got[1], src.cpu()[1, 2]) and torch.equal(got[2], src.cpu()[1, 3])
    assert torch.equal(got[3], torch.zeros(8))
    # request 1: column 0 holds block 7 (past the 2 blocks): zeros
    assert torch.equal(got[4:7], torch.zeros(3, 8))


def test_slots_past_the_cache_and_extremes_write_nothing():
    gen = torch.Generator().manual_seed(0)
    cache = _poisoned((2, 4, 1, 16), torch.float16, gen).to(DEVICE)
    before = cache.clone()
    key = torch.randn(6, 1, 16, generator=gen).half().to(DEVICE)
    mapping = torch.tensor([-1, 8, 2**40, I64.max, I64.min, 7], device=DEVICE)
    tx.reshape_and_cache_flash(key, key, cache, cache.clone(), mapping, "auto", None, None)
    expect = before.clone()
    expect[1, 3] = key[5]
    assert torch.equal(_bits(cache), _bits(expect))


def test_fp8_saturates():
    key = torch.tensor([[[1000.0, -1000.0, 1.0, -0.5]]], device=DEVICE)
    cache = torch.zeros(1, 1, 1, 4, dtype=torch.uint8, device=DEVICE)
    tx.reshape_and_cache_flash(key, key, cache, cache.clone(), torch.tensor([0], device=DEVICE), "fp8",
                               _scale(0.5), _scale(0.5))
    got = cache.view(torch.float8_e4m3fn).float().flatten().cpu()
    assert got.tolist() == [448.0, -448.0, 2.0, -1.0]


def _bad(**change):
    base = dict(key=torch.zeros(3, 2, 16), value=torch.zeros(3, 2, 16), key_cache=torch.zeros(4, 2, 2, 16),
                value_cache=torch.zeros(4, 2, 2, 16), slot_mapping=torch.tensor([0, 5, -1]), kv_cache_dtype="auto",
                k_scale=None, v_scale=None)
    base.update(change)
    # moved whole and sliced again on the device: .to() makes a strided view contiguous
    return {k: (_moved(v) if isinstance(v, torch.Tensor) else v) for k, v in base.items()}


def _moved(t: torch.Tensor) -> torch.Tensor:
    if t.is_contiguous() or t.storage_offset() or t.dim() == 0:
        return t.to(DEVICE)
    whole = torch.empty_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), dtype=t.dtype)
    return whole.to(DEVICE).as_strided(t.shape, t.stride())


@pytest.mark.parametrize("change, error, match", [
    (dict(key=torch.zeros(3, 2, 16, dtype=torch.int32)), TypeError, "key must have dtype"),
    (dict(value=torch.zeros(3, 2, 16, dtype=torch.float16)), TypeError, "value must have dtype"),
    (dict(key_cache=torch.zeros(4, 2, 3, 16)), ValueError, "key_cache must have shape"),
    (dict(value_cache=torch.zeros(4, 2, 2, 16, dtype=torch.float16)), TypeError, "value_cache must have dtype"),
    (dict(slot_mapping=torch.tensor([0.0, 1.0, 2.0])), TypeError, "slot_mapping must have dtype"),
    (dict(slot_mapping=torch.tensor([0, 1, 2, 3])), ValueError, "slot_mapping has 4"),
    (dict(kv_cache_dtype="int8"), ValueError, "kv_cache_dtype must be one of"),
    (dict(kv_cache_dtype="fp8", key_cache=torch.zeros(4, 2, 2, 16, dtype=torch.uint8),
          value_cache=torch.zeros(4, 2, 2, 16, dtype=torch.uint8)), ValueError, "k_scale is required"),
    (dict(kv_cache_dtype="fp8_e5m2", key_cache=torch.zeros(4, 2, 2, 16, dtype=torch.float8_e4m3fn)), TypeError,
     "key_cache must have dtype"),
    (dict(kv_cache_dtype="fp8", key_cache=torch.zeros(4, 2, 2, 16, dtype=torch.uint8),
          value_cache=torch.zeros(4, 2, 2, 16, dtype=torch.uint8), k_scale=torch.ones(2), v_scale=torch.ones(1)),
     ValueError, "k_scale must hold one value"),
    (dict(key_cache=torch.zeros(4, 2, 2, 32)[..., ::2]), ValueError, "key_cache must be contiguous in its last"),
])
def test_reshape_and_cache_flash_bad_input(change, error, match):
    with pytest.raises(error, match=match):
        tx.reshape_and_cache_flash(**_bad(**change))


def test_mla_and_gather_bad_input():
    z = lambda *s, **k: torch.zeros(*s, **k, device=DEVICE)  # noqa: E731
    slots = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="kv_cache must have shape"):
        tx.concat_and_cache_mla(z(2, 32), z(2, 16), z(4, 2, 40), slots)
    with pytest.raises(TypeError, match="k_pe must have dtype"):
        tx.concat_and_cache_mla(z(2, 32), z(2, 16, dtype=torch.float16), z(4, 2, 48), slots)
    with pytest.raises(ValueError, match="scale is required"):
        tx.concat_and_cache_mla(z(2, 32), z(2, 16), z(4, 2, 48, dtype=torch.uint8), slots, "fp8")
    args = lambda **c: {**dict(src_cache=z(4, 2, 48), dst=z(3, 48), block_table=z(2, 2, dtype=torch.int32),  # noqa: E731
                               cu_seq_lens=z(3, dtype=torch.int32), batch_size=2), **c}
    with pytest.raises(ValueError, match="dst must have shape"):
        tx.gather_and_maybe_dequant_cache(**args(dst=z(3, 40)))
    with pytest.raises(ValueError, match="block_table must have at least batch_size"):
        tx.gather_and_maybe_dequant_cache(**args(batch_size=3, cu_seq_lens=z(4, dtype=torch.int32)))
    with pytest.raises(ValueError, match="cu_seq_lens must be contiguous with at least"):
        tx.gather_and_maybe_dequant_cache(**args(cu_seq_lens=z(2, dtype=torch.int32)))
    with pytest.raises(TypeError, match="cu_seq_lens must have dtype"):
        tx.gather_and_maybe_dequant_cache(**args(cu_seq_lens=z(3)))
    with pytest.raises(ValueError, match="seq_starts must be contiguous"):
        tx.gather_and_maybe_dequant_cache(**args(seq_starts=z(1, dtype=torch.int32)))
    with pytest.raises(ValueError, match="batch_size must be"):
        tx.gather_and_maybe_dequant_cache(**args(batch_size=-1))
    with pytest.raises(TypeError, match="src_cache must have dtype"):
        tx.gather_and_maybe_dequant_cache(**args(kv_cache_dtype="fp8", scale=torch.ones(1, device=DEVICE)))


def test_reshape_and_cache_and_gather_cache_bad_input():
    z = lambda *s, **k: torch.zeros(*s, **k, device=DEVICE)  # noqa: E731
    slots = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="key_cache must have shape"):
        tx.reshape_and_cache(z(2, 2, 16), z(2, 2, 16), z(4, 2, 3, 4, 8), z(4, 2, 16, 4), slots)
    with pytest.raises(ValueError, match="key_cache must have 5 dimensions"):
        tx.reshape_and_cache(z(2, 2, 16), z(2, 2, 16), z(4, 4, 2, 16), z(4, 2, 16, 4), slots)
    with pytest.raises(ValueError, match="value_cache must have shape"):
        tx.reshape_and_cache(z(2, 2, 16), z(2, 2, 16), z(4, 2, 2, 4, 8), z(4, 4, 2, 16), slots)
    with pytest.raises(ValueError, match="k_scale is required"):
        tx.reshape_and_cache(z(2, 2, 16), z(2, 2, 16), z(4, 2, 1, 4, 16, dtype=torch.uint8),
                             z(4, 2, 16, 4, dtype=torch.uint8), slots, "fp8")
    args = lambda **c: {**dict(src_cache=z(4, 2, 48), dst=z(3, 48), block_table=z(2, 2, dtype=torch.int32),  # noqa: E731
                               cu_seq_lens=z(3, dtype=torch.int32), batch_size=2), **c}
    with pytest.raises(ValueError, match="dst must have shape"):
        tx.gather_cache(**args(dst=z(3, 40)))
    with pytest.raises(TypeError, match="dst must have src_cache's dtype"):
        tx.gather_cache(**args(dst=z(3, 48, dtype=torch.float16)))
    with pytest.raises(ValueError, match="entries must be contiguous"):
        tx.gather_cache(**args(src_cache=z(4, 2, 96)[..., ::2]))
    with pytest.raises(ValueError, match="block_table must have at least batch_size"):
        tx.gather_cache(**args(batch_size=3, cu_seq_lens=z(4, dtype=torch.int32)))
    with pytest.raises(TypeError, match="cu_seq_lens must have dtype"):
        tx.gather_cache(**args(cu_seq_lens=z(3)))


def test_empty_inputs_write_nothing():
    cache = torch.full((2, 4, 1, 16), float("nan"), device=DEVICE)
    e = torch.zeros(0, 1, 16, device=DEVICE)
    tx.reshape_and_cache_flash(e, e, cache, cache, torch.zeros(0, dtype=torch.int64, device=DEVICE))
    assert cache.isnan().all()
    dst = torch.full((3, 16), float("nan"), device=DEVICE)
    tx.gather_and_maybe_dequant_cache(torch.zeros(2, 4, 16, device=DEVICE), dst,
                                      torch.zeros(0, 2, dtype=torch.int32, device=DEVICE),
                                      torch.zeros(1, dtype=torch.int32, device=DEVICE), 0)
    assert dst.isnan().all()


def test_vllm_cache_ops_registered_with_vllm_xpu_kernels_schemas():
    importlib.import_module("triton_xpu_attn.compat.vllm_xpu_kernels._C")
    ops = torch.ops._C_cache_ops
    schemas = {name: str(getattr(ops, name).default._schema) for name in
               ("reshape_and_cache_flash", "concat_and_cache_mla", "gather_and_maybe_dequant_cache")}
    assert schemas["reshape_and_cache_flash"].startswith(
        "_C_cache_ops::reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a2!) key_cache, "
        "Tensor(a3!) value_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale)")
    assert "Tensor(a2!) kv_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor scale)" in \
        schemas["concat_and_cache_mla"]
    assert "(Tensor src_cache, Tensor(a1!) dst, Tensor block_table, Tensor cu_seq_lens, Tensor token_to_seq, " \
        "SymInt num_tokens, str kv_cache_dtype, Tensor scale, Tensor? seq_starts)" in \
        schemas["gather_and_maybe_dequant_cache"].replace("int num_tokens", "SymInt num_tokens")
    # a call through torch.ops, fp8 and a padded slot, equals the package function
    gen = torch.Generator().manual_seed(3)
    kv_c, k_pe = (torch.randn(3, n, generator=gen).to(DEVICE) for n in (32, 16))
    slots = torch.tensor([2, -1, 5], device=DEVICE)
    caches = [torch.zeros(2, 4, 48, dtype=torch.uint8, device=DEVICE) for _ in range(2)]
    ops.concat_and_cache_mla(kv_c, k_pe, caches[0], slots, "fp8", _scale(0.5))
    tx.concat_and_cache_mla(kv_c, k_pe, caches[1], slots, "fp8", _scale(0.5))
    assert torch.equal(caches[0], caches[1])
    # gather: rows past num_tokens untouched; token_to_seq is not read
    dst = torch.full((5, 48), float("nan"), device=DEVICE)
    table = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 2, 4], dtype=torch.int32, device=DEVICE)
    ops.gather_and_maybe_dequant_cache(caches[0], dst, table, cu, torch.zeros(4, dtype=torch.int32, device=DEVICE), 3,
                                       "fp8", _scale(0.5), None)
    expected = ref.gather_and_maybe_dequant_cache(caches[0].view(torch.float8_e4m3fn).cpu(), dst.cpu(), table.cpu(),
                                                  cu.cpu(), 2, _scale(0.5).cpu(), dtype=torch.float32)
    expected[3:] = float("nan")
    assert torch.equal(_bits(dst), _bits(expected))
    # reshape_and_cache_flash into the two halves of one buffer
    key = torch.randn(2, 1, 8, generator=gen).to(DEVICE)
    buf = torch.zeros(2, 2, 1, 16, device=DEVICE)
    ops.reshape_and_cache_flash(key, -key, buf[..., :8], buf[..., 8:], torch.tensor([3, 0], device=DEVICE), "auto",
                                _scale(1.0), _scale(1.0))
    assert torch.equal(buf[1, 1, 0], torch.cat([key[0, 0], -key[0, 0]]))
    assert torch.equal(buf[0, 0, 0], torch.cat([key[1, 0], -key[1, 0]]))


def test_vllm_paged_cache_and_gather_ops_registered_with_vllm_xpu_kernels_schemas():
    importlib.import_module("triton_xpu_attn.compat.vllm_xpu_kernels._C")
    ops = torch.ops._C_cache_ops
    assert str(ops.reshape_and_cache.default._schema) == (
        "_C_cache_ops::reshape_and_cache(Tensor key, Tensor value, Tensor(a2!) key_cache, Tensor(a3!) value_cache, "
        "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()")
    for name in ("gather_cache", "cp_gather_cache"):  # vllm-xpu-kernels' name, vLLM's name
        assert str(getattr(ops, name).default._schema).replace("SymInt", "int") == (
            f"_C_cache_ops::{name}(Tensor src_cache, Tensor(a1!) dst, Tensor block_table, Tensor cu_seq_lens, "
            "int batch_size, Tensor? seq_starts) -> ()")
    gen = torch.Generator().manual_seed(5)
    key = torch.randn(3, 2, 16, generator=gen).to(DEVICE)
    slots = torch.tensor([6, -1, 1], device=DEVICE)
    caches = [(torch.zeros(2, 2, 1, 4, 16, dtype=torch.uint8, device=DEVICE),
               torch.zeros(2, 2, 16, 4, dtype=torch.uint8, device=DEVICE)) for _ in range(2)]
    ops.reshape_and_cache(key, -key, *caches[0], slots, "fp8", _scale(0.1), _scale(0.2))
    tx.reshape_and_cache(key, -key, *caches[1], slots, "fp8", _scale(0.1), _scale(0.2))
    assert all(torch.equal(a, b) for a, b in zip(*caches))
    src = caches[0][1].reshape(2, 4, 32)
    table = torch.tensor([[1, 0]], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 6], dtype=torch.int32, device=DEVICE)
    outs = [torch.full((7, 32), 9, dtype=torch.uint8, device=DEVICE) for _ in range(3)]
    ops.gather_cache(src, outs[0], table, cu, 1, None)
    ops.cp_gather_cache(src, outs[1], table, cu, 1, None)
    tx.gather_cache(src, outs[2], table, cu, 1)
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[2])
    assert torch.equal(outs[2][:4], src[1]) and torch.equal(outs[2][4:6], src[0, :2])


@pytest.mark.parametrize("name", ["reshape_and_cache_flash", "concat_and_cache_mla", "gather_and_maybe_dequant_cache",
                                  "reshape_and_cache", "gather_cache"])
def test_custom_op_opcheck(name):
    gen = torch.Generator().manual_seed(1)
    f = lambda *s: torch.randn(*s, generator=gen).to(DEVICE)  # noqa: E731
    slots = torch.tensor([1, -1, 6], device=DEVICE)
    args = {
        "reshape_and_cache_flash": (f(3, 2, 16), f(3, 2, 16), f(2, 4, 2, 16), f(2, 4, 2, 16), slots, "auto", None, None),
        "concat_and_cache_mla": (f(3, 32), f(3, 16), torch.zeros(2, 4, 48, dtype=torch.uint8, device=DEVICE), slots,
                                 "fp8_e5m2", _scale(0.3)),
        "gather_and_maybe_dequant_cache": (f(2, 4, 48), f(5, 48), torch.tensor([[1, 0], [0, 1]], dtype=torch.int32,
                                           device=DEVICE), torch.tensor([0, 3, 5], dtype=torch.int32, device=DEVICE), 2,
                                           "auto", None, torch.tensor([1, 0], dtype=torch.int32, device=DEVICE)),
        "reshape_and_cache": (f(3, 2, 16), f(3, 2, 16), torch.zeros(2, 2, 1, 4, 16, dtype=torch.uint8, device=DEVICE),
                              torch.zeros(2, 2, 16, 4, dtype=torch.uint8, device=DEVICE), slots, "fp8", _scale(0.3),
                              _scale(0.5)),
        "gather_cache": (f(2, 4, 48), f(5, 48), torch.tensor([[1, 0], [0, 1]], dtype=torch.int32, device=DEVICE),
                         torch.tensor([0, 3, 5], dtype=torch.int32, device=DEVICE), 2,
                         torch.tensor([4, 0], dtype=torch.int32, device=DEVICE)),
    }[name]
    result = torch.library.opcheck(getattr(torch.ops.triton_xpu_attn, name), args)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.gpu
def test_graph_replay_without_host_sync():
    """The three ops captured in one device graph, replayed with new slots / tables / inputs (no host
    sync allowed): the caches and the gathered rows equal the references."""
    from helpers import capture_graph, replay_without_host_sync

    api = torch.cuda if torch.cuda.is_available() else torch.xpu
    gen = torch.Generator().manual_seed(11)
    t, h, d, blocks, bs, rank, pe = 24, 4, 128, 8, 16, 512, 64

    def values():
        slots = torch.randperm(blocks * bs, generator=gen)[:t]
        slots[::5] = -1
        table = torch.randint(-1, blocks + 1, (3, 4), generator=gen, dtype=torch.int32)
        return (torch.randn(t, h, d, generator=gen).bfloat16(), torch.randn(t, rank, generator=gen).bfloat16(),
                torch.randn(t, pe, generator=gen).bfloat16(), slots, table)

    key, kv_c, k_pe, slots, table = (x.to(DEVICE) for x in values())
    kv_buf = torch.zeros(blocks, bs, h, 2 * d, dtype=torch.uint8, device=DEVICE)
    mla = torch.zeros(blocks, bs, rank + pe, dtype=torch.uint8, device=DEVICE)
    cu = torch.tensor([0, 20, 20, 50], dtype=torch.int32, device=DEVICE)
    starts = torch.tensor([3, 0, 10], dtype=torch.int32, device=DEVICE)
    dst = torch.zeros(60, rank + pe, dtype=torch.bfloat16, device=DEVICE)
    k_scale, v_scale = _scale(0.02), _scale(0.03)

    def run():
        tx.reshape_and_cache_flash(key, key, kv_buf[..., :d], kv_buf[..., d:], slots, "fp8", k_scale, v_scale)
        tx.concat_and_cache_mla(kv_c, k_pe, mla, slots, "fp8_e4m3", k_scale)
        tx.gather_and_maybe_dequant_cache(mla, dst, table, cu, 3, "fp8", k_scale, starts)

    graph, _ = capture_graph(api, run)
    kv_buf.zero_(), mla.zero_(), dst.fill_(float("nan"))
    for new, old in zip(values(), (key, kv_c, k_pe, slots, table)):
        old.copy_(new)
    replay_without_host_sync(api, graph)
    f8 = torch.float8_e4m3fn
    exp_k, exp_v = ref.reshape_and_cache_flash(key.cpu(), key.cpu(), torch.zeros(blocks, bs, h, d, dtype=f8),
                                               torch.zeros(blocks, bs, h, d, dtype=f8), slots.cpu(), k_scale.cpu(),
                                               v_scale.cpu())
    _assert_cache_equal(kv_buf[..., :d].view(f8), exp_k, f8)
    _assert_cache_equal(kv_buf[..., d:].view(f8), exp_v, f8)
    exp_mla = ref.concat_and_cache_mla(kv_c.cpu(), k_pe.cpu(), torch.zeros(blocks, bs, rank + pe, dtype=f8),
                                       slots.cpu(), k_scale.cpu())
    _assert_cache_equal(mla.view(f8), exp_mla, f8)
    exp_dst = ref.gather_and_maybe_dequant_cache(mla.view(f8).cpu(), dst.cpu(), table.cpu(), cu.cpu(), 3,
                                                 k_scale.cpu(), starts.cpu(), dtype=torch.float32)
    assert torch.equal(_bits(dst), _bits(exp_dst))
