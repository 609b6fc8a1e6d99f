"""DSA indexer key cache (vLLM's ``_C_cache_ops``): ``indexer_k_quant_and_cache`` and
``cp_gather_indexer_k_quant_cache`` against the references (the block layout: keys, then all of
the block's fp32 scales; fp8 e4m3 with per-group scales, ``ue8m0`` power-of-two scales), with slot
mappings / block tables holding padding, ids past the cache and int extremes (never a write or read
outside the tensors: untouched bytes stay bit-identical), round trips into ``fp8_paged_mqa_logits``
and ``fp8_mqa_logits`` against the float64 logits of the unquantised keys, bad input, the
``torch.ops._C_cache_ops`` registrations and a GPU graph replay."""
from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import triton_xpu_attn as tx
from helpers import DEVICE, INTERPRET
from triton_xpu_attn import reference as ref
from triton_xpu_attn.ops import indexer_cache

FLOATS = [torch.float16, torch.bfloat16, torch.float32]
I64 = torch.iinfo(torch.int64)
I32 = torch.iinfo(torch.int32)


def _poisoned_bytes(shape, gen):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)


def _slots(draw, num_tokens, num_slots):
    """Distinct in-range slots, padding -1, slots past the cache and int64 extremes."""
    bad = st.sampled_from([-1, -1, num_slots, num_slots + 5, I64.max, I64.min, I32.max])
    keep = draw(st.lists(st.booleans(), min_size=num_tokens, max_size=num_tokens))
    good = draw(st.permutations(range(num_slots)))
    return [good[i] if k and i < num_slots else draw(bad) for i, k in enumerate(keep)]


def _decode(cache: torch.Tensor, head_dim: int, groups: int):
    """Block bytes as (keys [blocks, P, D] float, scales [blocks, P, groups] fp32, the rest of each
    block's bytes)."""
    raw = cache.view(torch.uint8).cpu()
    blocks, page, width = raw.shape
    flat = raw.reshape(blocks, page * width)
    keys = flat[:, :page * head_dim].contiguous().view(torch.float8_e4m3fn).float().reshape(blocks, page, head_dim)
    end = page * (head_dim + 4 * groups)
    scales = flat[:, page * head_dim:end].contiguous().view(torch.float32).reshape(blocks, page, groups)
    return keys, scales, flat[:, end:]


def _assert_indexer_cache(out, expected, head_dim, groups):
    """Bitwise under the interpreter (torch quantises there, with the reference's formula). Compiled
    backends quantise in the kernel, whose fp32 division may round differently: each scale within
    2 ulp (or a factor 2 where a ue8m0 scale sits on a power of two), each dequantised key within
    one fp8 step; everything else bitwise."""
    if INTERPRET:
        assert torch.equal(out.view(torch.uint8).cpu(), expected.view(torch.uint8).cpu())
        return
    ko, so, rest_o = _decode(out, head_dim, groups)
    ke, se, rest_e = _decode(expected, head_dim, groups)
    assert torch.equal(rest_o, rest_e)
    # equal values (NaN included: slots no token wrote keep their poisoned bytes in both) or close ones
    same_scale = (so == se) | (so.isnan() & se.isnan())
    ratio = so / se
    assert torch.all(same_scale | ((ratio - 1).abs() <= 2.4e-7) | (ratio == 2) | (ratio == 0.5)), (so, se)
    q = head_dim // groups
    same_key = ((ko == ke) | (ko.isnan() & ke.isnan())) & same_scale.repeat_interleave(q, dim=-1)
    do = ko * so.repeat_interleave(q, dim=-1)
    de = ke * se.repeat_interleave(q, dim=-1)
    step = se.repeat_interleave(q, dim=-1)
    close = (do - de).abs() <= de.abs() * 2.0**-3 + step * 2.0**-8
    assert torch.all(same_key | close), (do - de)[~(same_key | close)]


@given(data=st.data(), dtype=st.sampled_from(FLOATS), num_tokens=st.integers(0, 9),
       dims=st.sampled_from([(128, 128), (128, 64), (64, 32), (32, 32), (48, 16)]),
       block_size=st.sampled_from([1, 4, 16, 64]), num_blocks=st.integers(1, 3),
       scale_fmt=st.sampled_from(["ue8m0", "", "ue8m0"]), extra_bytes=st.sampled_from([0, 0, 12]),
       gap=st.booleans(), three_d=st.booleans(), k_rows=st.integers(-2, 2), int32_slots=st.booleans(),
       seed=st.integers(0, 2**16))
def test_indexer_k_quant_and_cache(data, dtype, num_tokens, dims, block_size, num_blocks, scale_fmt, extra_bytes,
                                   gap, three_d, k_rows, int32_slots, seed):
    head_dim, qbs = dims
    groups = head_dim // qbs
    gen = torch.Generator().manual_seed(seed)
    slots = _slots(data.draw, num_tokens, num_blocks * block_size)
    if int32_slots:
        slots = [s if I32.min <= s <= I32.max else -1 for s in slots]
    stride = head_dim + 4 * groups + extra_bytes
    # k: rows of a wider projection output (row stride past D); its rows may be fewer or more than the slots
    rows = max(num_tokens + k_rows, 0)
    k = (torch.randn(rows, head_dim + 8, generator=gen) * torch.rand(rows, 1, generator=gen).mul(20)).to(dtype)
    k = k[:, 8:]
    k[:1, :qbs] = 0  # an all-zero group: the amax floor
    whole = _poisoned_bytes((num_blocks + 1, block_size, stride), gen)
    cache = whole[1:] if gap else whole[:num_blocks]  # blocks apart (a per-layer slice) or packed
    before = whole.clone()
    mapping = torch.tensor(slots, dtype=torch.int32 if int32_slots else torch.int64)
    expected = ref.indexer_k_quant_and_cache(k, cache, mapping, qbs, scale_fmt)
    out = whole.to(DEVICE)
    out_cache = out[1:] if gap else out[:num_blocks]
    tx.indexer_k_quant_and_cache(k.to(DEVICE).unsqueeze(1) if three_d else k.to(DEVICE), out_cache,
                                 mapping.to(DEVICE), qbs, scale_fmt)
    _assert_indexer_cache(out_cache, expected, head_dim, groups)
    other = slice(0, 1) if gap else slice(num_blocks, num_blocks + 1)
    assert torch.equal(out.cpu()[other], before[other])  # the block outside the cache view


def test_ue8m0_scales_are_powers_of_two_and_the_layout_is_vllms():
    k = torch.tensor([[3.0] * 64 + [-1000.0] + [0.5] * 63, [0.0] * 128], device=DEVICE)
    cache = torch.zeros(2, 4, 132, dtype=torch.uint8, device=DEVICE)
    tx.indexer_k_quant_and_cache(k, cache, torch.tensor([6, 1], device=DEVICE), 128, "ue8m0")
    page1 = cache[1].reshape(-1).cpu()
    scale = page1[4 * 128 + 4 * 2:4 * 128 + 4 * 3].view(torch.float32)  # token 0 at offset 2 of block 1
    assert scale.item() == 4.0  # 1000 / 448 = 2.23 -> 4
    keys = page1[2 * 128:3 * 128].view(torch.float8_e4m3fn).float()
    assert keys[0].item() == 0.75 and keys[64].item() == -256.0 and keys[65].item() == 0.125
    page0 = cache[0].reshape(-1).cpu()  # token 1 (all zeros) at offset 1 of block 0: scale 1e-4 / 448 -> 2^-22
    assert page0[4 * 128 + 4:4 * 128 + 8].view(torch.float32).item() == 2.0**-22
    assert torch.all(page0[128:256] == 0)


def test_in_kernel_quantisation_matches_the_reference(monkeypatch):
    """The kernel's own quantisation (the compiled path) run under the interpreter too, on keys whose
    scaled values are exact in e4m3 (the interpreter's fp32 -> fp8 cast is wrong only when it
    rounds): scales, their power-of-two rounding, the fp8 values and the layout equal the reference."""
    monkeypatch.setattr(indexer_cache, "_quant_in_kernel", lambda: True)
    gen = torch.Generator().manual_seed(7)
    e4m3 = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # every finite positive
    for scale_fmt, qbs in (("ue8m0", 64), ("", 32), ("ue8m0", 128)):
        vals = e4m3[torch.randint(0, 127, (6, 128), generator=gen)]
        vals = vals * torch.where(torch.rand(6, 128, generator=gen) < 0.5, -1.0, 1.0)
        vals[:, ::qbs] = 448.0  # each group's amax: 448 * 2^e, so the scale is 2^e exactly
        k = vals * torch.exp2(torch.randint(-6, 6, (6, 1), generator=gen).float())
        k[2] = 0
        cache = torch.randint(0, 256, (3, 4, 128 + 4 * (128 // qbs)), dtype=torch.uint8, generator=gen)
        slots = torch.tensor([5, -1, 0, 11, 7, 2])
        expected = ref.indexer_k_quant_and_cache(k, cache, slots, qbs, scale_fmt)
        out = cache.to(DEVICE)
        tx.indexer_k_quant_and_cache(k.to(DEVICE), out, slots.to(DEVICE), qbs, scale_fmt)
        assert torch.equal(out.cpu(), expected), scale_fmt


def _gather_problem(draw, num_blocks, batch, max_blocks):
    lens = [draw(st.integers(0, 9)) for _ in range(batch)]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    ids = st.one_of(st.integers(0, num_blocks - 1), st.sampled_from([-1, num_blocks, I32.max, I32.min]))
    return cu, [[draw(ids) for _ in range(max_blocks)] for _ in range(batch)]


@given(data=st.data(), dims=st.sampled_from([(128, 128), (128, 64), (32, 32), (48, 16)]),
       block_size=st.sampled_from([1, 4, 16]), num_blocks=st.integers(1, 4), batch=st.integers(0, 4),
       max_blocks=st.integers(1, 3), index_dtype=st.sampled_from([torch.int32, torch.int64]),
       extra_rows=st.integers(-3, 3), fp8_dst=st.booleans(), gap=st.booleans(), seed=st.integers(0, 2**16))
def test_cp_gather_indexer_k_quant_cache(data, dims, block_size, num_blocks, batch, max_blocks, index_dtype,
                                         extra_rows, fp8_dst, gap, seed):
    head_dim, qbs = dims
    sb = 4 * (head_dim // qbs)
    gen = torch.Generator().manual_seed(seed)
    cu, table = _gather_problem(data.draw, num_blocks, batch, max_blocks)
    whole = _poisoned_bytes((num_blocks + 1, block_size, head_dim + sb + (8 if gap else 0)), gen)
    cache = whole[1:] if gap else whole[:num_blocks]
    rows = max(cu[-1] + extra_rows, 0)
    dst_k, dst_scale = _poisoned_bytes((rows, head_dim), gen), _poisoned_bytes((rows, sb), gen)
    table_t = torch.tensor(table, dtype=index_dtype).reshape(batch, max_blocks)
    cu_t = torch.tensor(cu, dtype=index_dtype)
    exp_k, exp_s = ref.cp_gather_indexer_k_quant_cache(cache, dst_k, dst_scale, table_t, cu_t)
    out_k, out_s = dst_k.to(DEVICE), dst_scale.to(DEVICE)
    tx.cp_gather_indexer_k_quant_cache(cache.to(DEVICE), out_k.view(torch.float8_e4m3fn) if fp8_dst else out_k,
                                       out_s, table_t.to(DEVICE), cu_t.to(DEVICE))
    assert torch.equal(out_k.cpu(), exp_k) and torch.equal(out_s.cpu(), exp_s)


def _paged_problem(gen, lens, block_size, head_dim, dtype=torch.bfloat16):
    """Keys of requests with ``lens`` tokens on shuffled blocks of one cache: (keys per request,
    block table, the slot of each of the concatenated keys)."""
    blocks_per = [-(-n // block_size) for n in lens]
    perm = torch.randperm(sum(blocks_per) + 2, generator=gen)
    table = torch.full((len(lens), max(blocks_per + [1])), -1, dtype=torch.int32)
    slots, at = [], 0
    for b, n in enumerate(lens):
        table[b, :blocks_per[b]] = perm[at:at + blocks_per[b]].int()
        at += blocks_per[b]
        slots += [int(table[b, j // block_size]) * block_size + j % block_size for j in range(n)]
    keys = [torch.randn(n, head_dim, generator=gen).mul(2).to(dtype) for n in lens]
    return keys, table, torch.tensor(slots, dtype=torch.int64), len(perm)


def _logits_bound(q, k, w):
    """Per-logit bound of the fp8 key quantisation error: |k - dequant(k)| <= |k| * 2^-4 (+ the
    e4m3 subnormal step), so each dot moves by at most 2^-4 * |q| . |k| (+), summed with |w|."""
    qa, ka = q.double().abs(), k.double().abs()
    dots = torch.einsum("ihd,jd->ihj", qa, ka * 2.0**-4 + ka.amax() * 2.0**-9)
    return (dots * w.double().abs()[:, :, None]).sum(dim=1) + 1e-6


@pytest.mark.parametrize("next_n, block_size, scale_fmt", [(1, 4, "ue8m0"), (2, 16, ""), (1, 1, "ue8m0")])
def test_round_trip_into_fp8_paged_mqa_logits(next_n, block_size, scale_fmt):
    """Keys written by indexer_k_quant_and_cache (vLLM's layout, quant_block_size = D) and read by
    fp8_paged_mqa_logits (``kv_cache.unsqueeze(-2)``, the default "page" layout): the logits of the
    float64 unquantised keys within the fp8 quantisation bound."""
    gen = torch.Generator().manual_seed(next_n * 10 + block_size)
    h, d, lens = 4, 64, [5, 9, 1]
    keys, table, slots, blocks = _paged_problem(gen, lens, block_size, d)
    cache = torch.randint(0, 256, (blocks, block_size, d + 4), dtype=torch.uint8, generator=gen).to(DEVICE)
    tx.indexer_k_quant_and_cache(torch.cat(keys).to(DEVICE), cache, slots.to(DEVICE), d, scale_fmt)
    q = torch.randn(len(lens), next_n, h, d, generator=gen).to(torch.float8_e4m3fn)
    w = torch.rand(len(lens) * next_n, h, generator=gen)
    max_len = max(lens) + 2
    out = tx.fp8_paged_mqa_logits(q.to(DEVICE), cache.unsqueeze(-2), w.to(DEVICE), torch.tensor(lens).int().to(DEVICE),
                                  table.to(DEVICE), None, max_len, True).cpu()
    for b, n in enumerate(lens):
        for r in range(next_n):
            row, seen = b * next_n + r, n - next_n + r + 1
            q_row = q[b, r:r + 1].float()
            exact = ref.fp8_mqa_logits(q_row, keys[b].float(), torch.ones(n), w[row:row + 1], torch.zeros(1),
                                       torch.full((1,), max(seen, 0)))[0]
            bound = _logits_bound(q_row, keys[b].float(), w[row:row + 1])[0]
            assert torch.all((out[row, :n].double() - exact).abs()[:max(seen, 0)] <= bound[:max(seen, 0)])
            assert torch.all(out[row, max(seen, 0):] == float("-inf"))


def test_round_trip_through_cp_gather_into_fp8_mqa_logits():
    """indexer_k_quant_and_cache -> cp_gather_indexer_k_quant_cache -> fp8_mqa_logits (vLLM's
    prefill indexer): the gathered rows are each request's quantised keys in order (bitwise, the
    reference quantisation), the logits those of the unquantised keys within the fp8 bound."""
    gen = torch.Generator().manual_seed(3)
    h, d, block_size, lens = 2, 128, 4, [6, 0, 3]
    keys, table, slots, blocks = _paged_problem(gen, lens, block_size, d, torch.float32)
    cache = torch.zeros(blocks, block_size, d + 4, dtype=torch.uint8, device=DEVICE)
    tx.indexer_k_quant_and_cache(torch.cat(keys).to(DEVICE), cache, slots.to(DEVICE), d, "ue8m0")
    cu = torch.tensor([0, 6, 6, 9], dtype=torch.int32)
    dst_k = torch.full((11, d), 0x7F, dtype=torch.uint8, device=DEVICE).view(torch.float8_e4m3fn)  # NaN: unwritten
    dst_scale = torch.full((11, 4), 0x7F, dtype=torch.uint8, device=DEVICE)
    tx.cp_gather_indexer_k_quant_cache(cache, dst_k, dst_scale, table.to(DEVICE), cu.to(DEVICE))
    q8, scales = ref.indexer_k_quantize(torch.cat(keys), d, "ue8m0")
    if INTERPRET:
        assert torch.equal(dst_k[:9].view(torch.uint8).cpu(), q8.view(torch.uint8))
        assert torch.equal(dst_scale[:9].cpu().view(torch.float32), scales)
    assert torch.all(dst_scale[9:].cpu() == 0x7F)  # rows past the last request untouched
    q = torch.randn(4, h, d, generator=gen).to(torch.float8_e4m3fn)
    w = torch.rand(4, h, generator=gen)
    ks, ke = torch.tensor([0, 0, 6, 6], dtype=torch.int32), torch.tensor([3, 6, 8, 9], dtype=torch.int32)
    out = tx.fp8_mqa_logits(q.to(DEVICE), (dst_k[:9], dst_scale[:9].view(torch.float32).reshape(9)), w.to(DEVICE),
                            ks.to(DEVICE), ke.to(DEVICE), clean_logits=True).cpu()
    flat = torch.cat(keys).float()
    exact = ref.fp8_mqa_logits(q.float(), flat, torch.ones(9), w, ks, ke, True)
    bound = _logits_bound(q.float(), flat, w)
    seen = exact > float("-inf")
    assert torch.equal(out > float("-inf"), seen)
    assert torch.all((out.double() - exact).abs()[seen] <= bound[seen])


def test_bad_input():
    z = lambda *s, **k: torch.zeros(*s, **k, device=DEVICE)  # noqa: E731
    u8 = torch.uint8
    slots = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(TypeError, match="k must have dtype"):
        tx.indexer_k_quant_and_cache(z(2, 64, dtype=torch.int32), z(2, 4, 68, dtype=u8), slots, 64, "ue8m0")
    with pytest.raises(ValueError, match="k must have shape"):
        tx.indexer_k_quant_and_cache(z(2, 2, 64), z(2, 4, 68, dtype=u8), slots, 64, "ue8m0")
    with pytest.raises(ValueError, match="quant_block_size must divide"):
        tx.indexer_k_quant_and_cache(z(2, 64), z(2, 4, 68, dtype=u8), slots, 48, "ue8m0")
    with pytest.raises(ValueError, match="quant_block_size must be"):
        tx.indexer_k_quant_and_cache(z(2, 64), z(2, 4, 68, dtype=u8), slots, 0, "ue8m0")
    with pytest.raises(ValueError, match="kv_cache must have at least D"):
        tx.indexer_k_quant_and_cache(z(2, 64), z(2, 4, 68, dtype=u8), slots, 32, "ue8m0")
    with pytest.raises(TypeError, match="kv_cache must have dtype"):
        tx.indexer_k_quant_and_cache(z(2, 64), z(2, 4, 68), slots, 64, "ue8m0")
    with pytest.raises(ValueError, match="each block's bytes must be contiguous"):
        tx.indexer_k_quant_and_cache(z(2, 64), z(2, 4, 136, dtype=u8)[..., ::2], slots, 64, "ue8m0")
    with pytest.raises(TypeError, match="slot_mapping must have dtype"):
        tx.indexer_k_quant_and_cache(z(2, 64), z(2, 4, 68, dtype=u8), slots.float(), 64, "ue8m0")
    with pytest.raises(TypeError, match="scale_fmt must be a str"):
        tx.indexer_k_quant_and_cache(z(2, 64), z(2, 4, 68, dtype=u8), slots, 64, 1)
    table, cu = z(2, 2, dtype=torch.int32), z(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="dst_scale must have shape"):
        tx.cp_gather_indexer_k_quant_cache(z(2, 4, 68, dtype=u8), z(5, 64, dtype=u8), z(4, 4, dtype=u8), table, cu)
    with pytest.raises(TypeError, match="dst_scale must have dtype"):
        tx.cp_gather_indexer_k_quant_cache(z(2, 4, 68, dtype=u8), z(5, 64, dtype=u8), z(5, 1), table, cu)
    with pytest.raises(ValueError, match="dst_scale must hold 4 bytes per scale"):
        tx.cp_gather_indexer_k_quant_cache(z(2, 4, 68, dtype=u8), z(5, 64, dtype=u8), z(5, 12, dtype=u8), table, cu)
    with pytest.raises(TypeError, match="dst_k must have dtype"):
        tx.cp_gather_indexer_k_quant_cache(z(2, 4, 68, dtype=u8), z(5, 64), z(5, 4, dtype=u8), table, cu)
    with pytest.raises(ValueError, match="cu_seq_lens must be contiguous with at least"):
        tx.cp_gather_indexer_k_quant_cache(z(2, 4, 68, dtype=u8), z(5, 64, dtype=u8), z(5, 4, dtype=u8), table,
                                           cu[:2])


def test_empty_inputs_write_nothing():
    cache = torch.full((2, 4, 68), 0xAB, dtype=torch.uint8, device=DEVICE)
    tx.indexer_k_quant_and_cache(torch.zeros(0, 64, device=DEVICE), cache, torch.zeros(0, dtype=torch.int64,
                                 device=DEVICE), 64, "ue8m0")
    tx.indexer_k_quant_and_cache(torch.ones(3, 64, device=DEVICE), cache[:0], torch.tensor([0, 1, 2], device=DEVICE),
                                 64, "ue8m0")
    assert torch.all(cache == 0xAB)
    dst_k = torch.full((3, 64), 0xAB, dtype=torch.uint8, device=DEVICE)
    tx.cp_gather_indexer_k_quant_cache(cache, dst_k, torch.zeros(3, 4, dtype=torch.uint8, device=DEVICE),
                                       torch.zeros(0, 2, dtype=torch.int32, device=DEVICE),
                                       torch.zeros(1, dtype=torch.int32, device=DEVICE))
    assert torch.all(dst_k == 0xAB)


def test_registered_with_vllm_xpu_kernels_schemas():
    importlib.import_module("triton_xpu_attn.compat.vllm_xpu_kernels._C")
    ops = torch.ops._C_cache_ops
    assert str(ops.indexer_k_quant_and_cache.default._schema).replace("SymInt", "int") == (
        "_C_cache_ops::indexer_k_quant_and_cache(Tensor k, Tensor(a1!) kv_cache, Tensor slot_mapping, "
        "int quant_block_size, str scale_fmt) -> ()")
    assert str(ops.cp_gather_indexer_k_quant_cache.default._schema) == (
        "_C_cache_ops::cp_gather_indexer_k_quant_cache(Tensor kv_cache, Tensor(a1!) dst_k, Tensor(a2!) dst_scale, "
        "Tensor block_table, Tensor cu_seq_lens) -> ()")
    gen = torch.Generator().manual_seed(2)
    k = torch.randn(3, 128, generator=gen).bfloat16().to(DEVICE)
    slots = torch.tensor([5, -1, 2], device=DEVICE)
    caches = [torch.zeros(2, 4, 132, dtype=torch.uint8, device=DEVICE) for _ in range(2)]
    ops.indexer_k_quant_and_cache(k, caches[0], slots, 128, "ue8m0")
    tx.indexer_k_quant_and_cache(k, caches[1], slots, 128, "ue8m0")
    assert torch.equal(caches[0], caches[1])
    table, cu = torch.tensor([[0, 1]], dtype=torch.int32, device=DEVICE), torch.tensor([0, 6], dtype=torch.int32,
                                                                                        device=DEVICE)
    outs = [(torch.zeros(6, 128, dtype=torch.uint8, device=DEVICE), torch.zeros(6, 4, dtype=torch.uint8,
                                                                                device=DEVICE)) for _ in range(2)]
    ops.cp_gather_indexer_k_quant_cache(caches[0], *outs[0], table, cu)
    tx.cp_gather_indexer_k_quant_cache(caches[0], *outs[1], table, cu)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    q8, scales = ref.indexer_k_quantize(k.cpu()[[2, 0]], 128, "ue8m0")
    if INTERPRET:  # token 2 at slot 2, token 0 at slot 5 (request position 5)
        assert torch.equal(outs[1][0][[2, 5]].cpu(), q8.view(torch.uint8))
        assert torch.equal(outs[1][1][[2, 5]].cpu().view(torch.float32), scales)


@pytest.mark.parametrize("name", ["indexer_k_quant_and_cache", "cp_gather_indexer_k_quant_cache"])
def test_custom_op_opcheck(name):
    gen = torch.Generator().manual_seed(1)
    args = {
        "indexer_k_quant_and_cache": (torch.randn(3, 64, generator=gen).to(DEVICE),
                                      torch.zeros(2, 4, 72, dtype=torch.uint8, device=DEVICE),
                                      torch.tensor([1, -1, 6], device=DEVICE), 32, "ue8m0"),
        "cp_gather_indexer_k_quant_cache": (torch.randint(0, 256, (2, 4, 72), dtype=torch.uint8, generator=gen).to(
            DEVICE), torch.zeros(5, 64, dtype=torch.uint8, device=DEVICE), torch.zeros(5, 8, dtype=torch.uint8,
            device=DEVICE), torch.tensor([[1, 0], [0, 1]], dtype=torch.int32, device=DEVICE),
            torch.tensor([0, 3, 5], dtype=torch.int32, device=DEVICE)),
    }[name]
    result = torch.library.opcheck(getattr(torch.ops.triton_xpu_attn, name), args)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.gpu
def test_graph_replay_without_host_sync():
    """Both ops captured in one device graph, replayed with new keys / slots / tables: the cache and
    the gathered rows equal the references (DeepSeek-V3.2 shapes: D = Q = 128, block 64)."""
    from helpers import capture_graph, replay_without_host_sync

    api = torch.cuda if torch.cuda.is_available() else torch.xpu
    gen = torch.Generator().manual_seed(13)
    t, d, blocks, bs = 96, 128, 6, 64

    def values():
        slots = torch.randperm(blocks * bs, generator=gen)[:t]
        slots[::7] = -1
        table = torch.randint(-1, blocks + 1, (3, 2), generator=gen, dtype=torch.int32)
        return torch.randn(t, d, generator=gen).mul(4).bfloat16(), slots, table

    k, slots, table = (x.to(DEVICE) for x in values())
    cache = torch.zeros(blocks, bs, d + 4, dtype=torch.uint8, device=DEVICE)
    cu = torch.tensor([0, 70, 70, 128], dtype=torch.int32, device=DEVICE)
    dst_k = torch.zeros(130, d, dtype=torch.float8_e4m3fn, device=DEVICE)
    dst_scale = torch.zeros(130, 4, dtype=torch.uint8, device=DEVICE)

    def run():
        tx.indexer_k_quant_and_cache(k, cache, slots, d, "ue8m0")
        tx.cp_gather_indexer_k_quant_cache(cache, dst_k, dst_scale, table, cu)

    graph, _ = capture_graph(api, run)
    cache.zero_()
    for new, old in zip(values(), (k, slots, table)):
        old.copy_(new)
    replay_without_host_sync(api, graph)
    expected = ref.indexer_k_quant_and_cache(k.cpu(), torch.zeros(blocks, bs, d + 4, dtype=torch.uint8), slots.cpu(),
                                             d, "ue8m0")
    _assert_indexer_cache(cache, expected, d, 1)
    exp_k, exp_s = ref.cp_gather_indexer_k_quant_cache(cache.cpu(), dst_k.cpu(), dst_scale.cpu(), table.cpu(), cu.cpu())
    assert torch.equal(dst_k.view(torch.uint8).cpu(), exp_k) and torch.equal(dst_scale.cpu(), exp_s)
