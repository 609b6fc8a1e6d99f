"""fp32 -> fp8 e4m3fn in the kernels' Intel GPU path (``_common.e4m3_bytes`` / ``fp8_cast``).

triton-xpu's own conversion saturates at 256 and rounds through fp16 (3.3; 3.4 rounds through
fp16), so on Intel GPUs every in-kernel e4m3 quantiser encodes in integer arithmetic instead
(docs/xpu.md, "fp8 e4m3 stores"). Checked here bit for bit against torch's
``x.clamp(-448, 448).to(torch.float8_e4m3fn)`` (saturated, nearest even), on every boundary of the
format, and through each quantising op with the Intel path forced (``device.intel_gpu``).
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import triton_xpu_attn as tx
from helpers import DEVICE
from triton_xpu_attn import device as _device
from triton_xpu_attn._common import e4m3_bytes, fp8_cast

E4M3 = torch.float8_e4m3fn


@triton.jit
def _encode_kernel(x_ptr, byte_ptr, fp8_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0)
    tl.store(byte_ptr + i, e4m3_bytes(x).to(tl.uint8), mask=i < n)
    tl.store(fp8_ptr + i, fp8_cast(x, fp8_ptr, True), mask=i < n)


def _encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3_bytes(x), fp8_cast(x) into an e4m3 tensor, as bytes) of fp32 ``x``, on the host."""
    x = x.to(torch.float32).flatten().to(DEVICE)
    raw = torch.empty(x.shape, dtype=torch.uint8, device=DEVICE)
    fp8 = torch.empty(x.shape, dtype=E4M3, device=DEVICE)
    block = 1024
    _encode_kernel[(triton.cdiv(x.numel(), block),)](x, raw, fp8, x.numel(), BLOCK=block)
    return raw.cpu(), fp8.view(torch.uint8).cpu()


def _expected(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).flatten().clamp(-448.0, 448.0).to(E4M3).view(torch.uint8)


def _check(x: torch.Tensor) -> None:
    x = x.to(torch.float32).flatten()
    want = _expected(x)
    nan = torch.isnan(x)
    for got in _encode(x):
        assert torch.all((got[nan] & 0x7F) == 0x7F), "NaN must encode as NaN"
        assert torch.all((got[nan] & 0x80) == (want[nan] & 0x80)), "NaN keeps its sign"
        bad = (got != want) & ~nan
        if bad.any():
            i = bad.nonzero()[:8, 0]
            pairs = [(float(x[j]), hex(int(x[j:j + 1].view(torch.int32))), hex(int(got[j])), hex(int(want[j])))
                     for j in i]
            raise AssertionError(f"{int(bad.sum())} of {x.numel()} wrong (x, bits, got, want): {pairs}")


def _finite_e4m3_values() -> torch.Tensor:
    """Every finite e4m3fn value, ascending, both zeros included (254 values)."""
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    v = b.view(E4M3).float()
    return v[~torch.isnan(v)].sort().values


def _neighbours(x: torch.Tensor) -> torch.Tensor:
    """``x`` and the fp32 values one ulp below and above it."""
    inf = torch.full_like(x, float("inf"))
    return torch.cat([torch.nextafter(x, -inf), x, torch.nextafter(x, inf)])


def test_every_e4m3_value_round_trips():
    v = _finite_e4m3_values()
    assert v.numel() == 254
    _check(v)
    raw, fp8 = _encode(torch.tensor([0.0, -0.0]))
    assert raw.tolist() == fp8.tolist() == [0x00, 0x80]  # signed zero kept


def test_midpoints_round_to_nearest_even():
    v = _finite_e4m3_values()
    pos = v[v >= 0].unique()  # 0, the subnormals 2^-9 .. 7 * 2^-9, the normals up to 448
    lo, hi = pos[:-1].double(), pos[1:].double()
    mid = ((lo + hi) / 2).float()  # exact in fp32 (e4m3 has 3 mantissa bits)
    assert torch.equal(mid.double(), (lo + hi) / 2)
    x = _neighbours(mid)
    _check(torch.cat([x, -x]))
    # the ties themselves go to the even byte
    raw, _ = _encode(mid)
    assert torch.all(raw & 1 == 0)


def test_everything_between_neighbours_near_each_value():
    v = _finite_e4m3_values()
    x = _neighbours(_neighbours(v))
    _check(x)


def test_saturates_to_448():
    x = torch.cat([torch.linspace(256.0, 448.0, 4097), torch.linspace(448.0, 480.0, 1025),
                   torch.tensor([464.0, 479.9, 480.0, 500.0, 1000.0, 65504.0, 65520.0, 1e10, 3.4028235e38,
                                 float("inf")])])
    x = _neighbours(x)
    _check(torch.cat([x, -x]))
    raw, fp8 = _encode(torch.tensor([300.0, -300.0, 1e30, -float("inf")]))
    assert raw.tolist() == fp8.tolist() == [0x79, 0xF9, 0x7E, 0xFE]  # 288, -288, 448, -448


def test_subnormals_and_tiny_values():
    # below the smallest normal 2^-6: multiples of 2^-9, half the smallest subnormal (2^-10) a tie
    g = torch.Generator().manual_seed(0)
    x = torch.cat([
        torch.rand(20000, generator=g) * 2.0**-5,
        torch.tensor([2.0**-10, 2.0**-11, 3 * 2.0**-11, 2.0**-6, 2.0**-7, 15 * 2.0**-10, 1e-38, 1e-45, 1.4e-45,
                      2.0**-126, 2.0**-149]),
    ])
    x = _neighbours(x)
    _check(torch.cat([x, -x]))


def test_nan_and_inf():
    x = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf")])
    nan_bits = torch.tensor([0x7FC00000, 0x7F800001, 0x7FFFFFFF, -1, -0x00400000], dtype=torch.int32)
    _check(torch.cat([x, nan_bits.view(torch.float32)]))


@triton.jit
def _cast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, fp8_cast(tl.load(x_ptr + i, mask=i < n), y_ptr, True), mask=i < n)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, E4M3])
def test_fp8_cast_of_narrower_inputs(dtype):
    """fp16 / bf16 values go through their exact fp32 value; e4m3 values are copied as they are."""
    v = _finite_e4m3_values()
    x = torch.cat([v, (v[:-1] + v[1:]) / 2, torch.tensor([300.0, 460.0, 1000.0, float("inf"), float("nan")])])
    x = torch.cat([x, -x]).to(dtype)
    y = torch.empty(x.shape, dtype=E4M3, device=DEVICE)
    _cast_kernel[(triton.cdiv(x.numel(), 256),)](x.to(DEVICE), y, x.numel(), BLOCK=256)
    got = y.cpu().view(torch.uint8)
    want = x.view(torch.uint8) if dtype == E4M3 else _expected(x.float())
    nan = torch.isnan(x.float())
    assert torch.equal(got[~nan], want[~nan]) and torch.all(got[nan] & 0x7F == 0x7F)


def test_random_bit_patterns():
    g = torch.Generator().manual_seed(1)
    bits = torch.randint(-2**31, 2**31, (1 << 16,), generator=g, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    # and a dense sample of the finite range that matters (|x| < 2^10)
    y = (torch.rand(1 << 16, generator=g) * 2 - 1) * 2.0 ** torch.randint(-12, 10, (1 << 16,), generator=g)
    _check(torch.cat([x, y]))


# ---- each quantising op, the Intel GPU path forced (device.intel_gpu) ----


class _Launches:
    """Stands in for an ops module's kernel: records each launch's keyword arguments (the
    constexprs), then launches the real kernel."""

    def __init__(self, kernel):
        self.kernel, self.kwargs = kernel, []

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.kwargs.append(kwargs)
            return launch(*args, **kwargs)

        return run

    def __getattr__(self, name):
        return getattr(self.kernel, name)


@pytest.fixture
def intel_path(monkeypatch):
    """The Intel GPU path of every e4m3 quantiser, under the interpreter too; returns a function
    that records the launches of a module's kernel (``record(module, name)``)."""
    monkeypatch.setattr(_device, "intel_gpu", lambda: True)

    def record(module, name):
        rec = _Launches(getattr(module, name))
        monkeypatch.setattr(module, name, rec)
        return rec

    return record


def _quantised_in_kernel(rec) -> None:
    assert rec.kwargs, "the kernel was not launched"
    for kw in rec.kwargs:
        assert kw["INTEL_GPU"] is True
        assert kw.get("QUANT", kw.get("HAS_OUT_SCALE")) is True, "the kernel must quantise itself"


def _hard_values(n: int, scale: float, seed: int) -> torch.Tensor:
    """``n`` fp32 values whose quotients by ``scale`` cover [256, 448] (every e4m3 value there, the
    ties between them, random values), some past 448 and some small ones, both signs."""
    v = _finite_e4m3_values()
    top = v[v >= 256]
    pos = torch.cat([top, (top[:-1] + top[1:]) / 2, torch.tensor([464.0, 470.0, 500.0, 1000.0, 1e6])])
    g = torch.Generator().manual_seed(seed)
    pos = torch.cat([pos, 256 + 192 * torch.rand(n, generator=g), torch.rand(n // 8, generator=g) * 4])
    x = torch.cat([pos, -pos])[torch.randperm(2 * pos.numel(), generator=g)][:n]
    return x * scale


def _want(x: torch.Tensor, scale) -> torch.Tensor:
    """The kernels' contract: ``x / scale`` in fp32, saturated, rounded to nearest even."""
    return (x.float() / torch.as_tensor(scale, dtype=torch.float32)).clamp(-448.0, 448.0).to(E4M3).view(torch.uint8)


def test_reshape_and_cache_flash_stores_e4m3_above_256(intel_path):
    from triton_xpu_attn.ops import kv_cache_store

    rec = intel_path(kv_cache_store, "_reshape_and_cache_flash_kernel")
    # a power-of-two scale: the quotients are exact whatever the division's precision (CUDA's fp32
    # division is approximate; so may an Intel GPU's be), so the bytes test the encoding alone
    T, H, D, scale = 8, 2, 64, 0.5
    key = _hard_values(T * H * D, scale, 1).reshape(T, H, D)
    value = _hard_values(T * H * D, 2 * scale, 2).reshape(T, H, D)
    slots = torch.tensor([5, 0, 9, -1, 3, 14, 7, 2])
    kc = torch.zeros(4, 4, H, D, dtype=torch.uint8, device=DEVICE)
    vc = torch.zeros(4, 4, H, D, dtype=torch.uint8, device=DEVICE)
    tx.reshape_and_cache_flash(key.to(DEVICE), value.to(DEVICE), kc, vc, slots.to(DEVICE), "fp8",
                               torch.tensor([scale], device=DEVICE), torch.tensor([2 * scale], device=DEVICE))
    _quantised_in_kernel(rec)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(kc.cpu()[s // 4, s % 4], _want(key[t], scale))
            assert torch.equal(vc.cpu()[s // 4, s % 4], _want(value[t], 2 * scale))
    assert int((kc.cpu() != 0).sum()) > 0.9 * 7 * H * D  # 7 tokens written


def test_reshape_and_cache_stores_e4m3_above_256(intel_path):
    from triton_xpu_attn.ops import kv_cache_store

    rec = intel_path(kv_cache_store, "_reshape_and_cache_kernel")
    T, H, D, x, scale = 6, 2, 32, 16, 0.5
    key = _hard_values(T * H * D, scale, 3).reshape(T, H, D).half()
    value = _hard_values(T * H * D, scale, 4).reshape(T, H, D).half()
    slots = torch.tensor([4, 1, -1, 7, 2, 6])
    kc = torch.zeros(2, H, D // x, 4, x, dtype=torch.uint8, device=DEVICE)
    vc = torch.zeros(2, H, D, 4, dtype=torch.uint8, device=DEVICE)
    s_t = torch.tensor([scale], device=DEVICE)
    tx.reshape_and_cache(key.to(DEVICE), value.to(DEVICE), kc, vc, slots.to(DEVICE), "fp8_e4m3", s_t, s_t)
    _quantised_in_kernel(rec)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            got_k = kc.cpu()[s // 4, :, :, s % 4, :].reshape(H, D)
            assert torch.equal(got_k, _want(key[t], scale).reshape(H, D))
            assert torch.equal(vc.cpu()[s // 4, :, :, s % 4], _want(value[t], scale).reshape(H, D))


def test_concat_and_cache_mla_stores_e4m3_above_256(intel_path):
    from triton_xpu_attn.ops import kv_cache_store

    rec = intel_path(kv_cache_store, "_concat_and_cache_mla_kernel")
    T, R, P, scale = 5, 128, 32, 0.25
    kv_c = _hard_values(T * R, scale, 5).reshape(T, R).to(torch.bfloat16)
    k_pe = _hard_values(T * P, scale, 6).reshape(T, P).to(torch.bfloat16)
    slots = torch.tensor([3, -1, 0, 6, 5])
    cache = torch.zeros(2, 4, R + P, dtype=torch.uint8, device=DEVICE)
    tx.concat_and_cache_mla(kv_c.to(DEVICE), k_pe.to(DEVICE), cache, slots.to(DEVICE), "fp8",
                            torch.tensor([scale], device=DEVICE))
    _quantised_in_kernel(rec)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(cache.cpu()[s // 4, s % 4], _want(torch.cat([kv_c[t], k_pe[t]]), scale))


@pytest.mark.parametrize("scale_fmt, qbs", [("", 64), ("ue8m0", 128)])
def test_indexer_k_quant_and_cache_stores_e4m3_above_256(intel_path, scale_fmt, qbs):
    from triton_xpu_attn import reference as ref
    from triton_xpu_attn.ops import indexer_cache

    rec = intel_path(indexer_cache, "_indexer_k_quant_and_cache_kernel")
    T, D = 6, 128
    g = torch.Generator().manual_seed(8)
    # |k| in [0.55, 1] x amax, amax = 448 * 2^m: the scale amax / 448 is the power of two 2^m with
    # and without ue8m0's rounding up, so every quotient is exact whatever the division's precision
    # (CUDA's fp32 division is approximate; so may an Intel GPU's be); most land in [256, 448]
    k = (0.55 + 0.45 * torch.rand(T, D, generator=g)) * torch.where(torch.rand(T, D, generator=g) < 0.5, -1.0, 1.0)
    k[:, ::qbs] = 1.0
    k = k * (448 * torch.exp2(torch.randint(-12, -6, (T, 1), generator=g).float()))
    cache = torch.randint(0, 256, (2, 4, D + 4 * (D // qbs)), dtype=torch.uint8, generator=g)
    slots = torch.tensor([5, -1, 0, 7, 2, 3])
    expected = ref.indexer_k_quant_and_cache(k, cache, slots, qbs, scale_fmt)
    out = cache.to(DEVICE)
    tx.indexer_k_quant_and_cache(k.to(DEVICE), out, slots.to(DEVICE), qbs, scale_fmt)
    _quantised_in_kernel(rec)
    assert torch.equal(out.cpu(), expected)
    keys = expected.reshape(2, -1)[:, :4 * D].reshape(-1).view(E4M3).float().abs()  # each block's keys
    assert ((keys > 256) & (keys < 448)).sum() > 100  # the range triton-xpu 3.3 clamps


def test_append_kv_stores_e4m3_above_256(intel_path):
    from triton_xpu_attn import reference as ref
    from triton_xpu_attn.ops import append_kv

    rec = intel_path(append_kv, "_append_kv_kernel")
    B, hk, hq, d, page, scale = 2, 2, 2, 32, 4, 0.5
    g = torch.Generator().manual_seed(9)
    table = torch.tensor([[3, 0, 5], [1, 4, 2]], dtype=torch.int32)
    k_cache = torch.randn(6, page, hk, d, generator=g).to(E4M3)
    v_cache = torch.randn(6, page, hk, d, generator=g).to(E4M3)
    lens = torch.tensor([3, 6], dtype=torch.int32)
    q = torch.randn(B, 3, hq, d, generator=g).half()
    k = _hard_values(B * 3 * hk * d, scale, 10).reshape(B, 3, hk, d).half()
    v = _hard_values(B * 3 * hk * d, scale, 11).reshape(B, 3, hk, d).half()
    _, _, exp_k, exp_v = ref.flash_attn_with_kvcache_append(q, k_cache, v_cache, k, v, cache_seqlens=lens,
                                                            page_table=table, causal=True, k_descale=scale,
                                                            v_descale=scale)
    kc, vc = k_cache.to(DEVICE), v_cache.to(DEVICE)
    tx.flash_attn_with_kvcache(q.to(DEVICE), kc, vc, k.to(DEVICE), v.to(DEVICE), cache_seqlens=lens.to(DEVICE),
                               page_table=table.to(DEVICE), causal=True, k_descale=scale, v_descale=scale)
    _quantised_in_kernel(rec)
    assert torch.equal(kc.cpu().view(torch.uint8), exp_k.view(torch.uint8))
    assert torch.equal(vc.cpu().view(torch.uint8), exp_v.view(torch.uint8))
    # the new keys themselves, against the contract
    for b, start in enumerate(lens.tolist()):
        for i in range(3):
            pos = start + i
            got = kc.cpu()[table[b, pos // page], pos % page].view(torch.uint8)
            assert torch.equal(got, _want(k[b, i], scale))


def test_merge_attn_states_fp8_output_above_256(intel_path):
    from triton_xpu_attn import merge_attn_states
    from triton_xpu_attn.ops import merge_state

    rec = intel_path(merge_state, "_merge_state_kernel")
    T, H, D, scale = 8, 2, 64, 0.37
    g = torch.Generator().manual_seed(12)
    p_out = torch.randn(T, H, D, generator=g).to(torch.bfloat16)
    s_out = _hard_values(T * H * D, scale, 13).reshape(T, H, D).to(torch.bfloat16)
    # merged rows: an empty prefix state (LSE -inf), so the output is the suffix times weight 1
    p_lse = torch.full((H, T), float("-inf"))
    s_lse = torch.randn(H, T, generator=g)
    out = torch.zeros(T, H, D, dtype=E4M3, device=DEVICE)
    merge_attn_states(out, p_out.to(DEVICE), p_lse.to(DEVICE), s_out.to(DEVICE), s_lse.to(DEVICE), None,
                      prefill_tokens_with_context=4, output_scale=torch.tensor([scale], device=DEVICE))
    _quantised_in_kernel(rec)
    assert torch.equal(out.cpu().view(torch.uint8), _want(s_out, scale))


def test_append_kv_copies_fp8_keys_on_the_intel_path(intel_path):
    """Keys / values given in the e4m3 cache's own dtype are copied bit for bit (no encoding)."""
    from triton_xpu_attn import reference as ref
    from triton_xpu_attn.ops import append_kv

    rec = intel_path(append_kv, "_append_kv_kernel")
    g = torch.Generator().manual_seed(14)
    k_cache = torch.randn(4, 4, 1, 16, generator=g).to(E4M3)
    v_cache = torch.randn(4, 4, 1, 16, generator=g).to(E4M3)
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    k = (torch.randn(2, 3, 1, 16, generator=g) * 300).to(E4M3)
    v = (torch.randn(2, 3, 1, 16, generator=g) * 300).to(E4M3)
    lens = torch.tensor([1, 5], dtype=torch.int32)
    kc, vc = k_cache.to(DEVICE), v_cache.to(DEVICE)
    tx.flash_attn_with_kvcache(torch.randn(2, 1, 2, 16).half().to(DEVICE), kc, vc, k.to(DEVICE), v.to(DEVICE),
                               cache_seqlens=lens.to(DEVICE), page_table=table.to(DEVICE), k_descale=0.5)
    assert rec.kwargs and all(kw["INTEL_GPU"] is True and kw["QUANT"] is False for kw in rec.kwargs)
    _, _, exp_k, exp_v = ref.flash_attn_with_kvcache_append(torch.zeros(2, 1, 2, 16), k_cache, v_cache, k, v,
                                                            cache_seqlens=lens, page_table=table)
    assert torch.equal(kc.cpu().view(torch.uint8), exp_k.view(torch.uint8))
    assert torch.equal(vc.cpu().view(torch.uint8), exp_v.view(torch.uint8))
