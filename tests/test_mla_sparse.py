"""DeepSeek sparse attention prefill (``flash_mla_sparse_fwd``) against the float64 reference.

Every case poisons what it can: rows of ``kv`` that no counted entry selects hold NaN (rows named
only past a token's ``topk_length`` or by another KV head's list included), outputs passed as
``out=`` / ``max_logits=`` / ``lse=`` start as NaN inside wider buffers whose other elements must
stay NaN. Index lists mix valid rows (duplicates too) with -1, other negatives, ``s_kv`` and
beyond, and the int32 extremes. Under the interpreter d_qk stays DeepSeek's (512 / 576) but the
token, row and list counts are small.
"""
from __future__ import annotations

import contextlib
import inspect
import math
from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import DEVICE, FLOAT_DTYPES, assert_close, capture_graph, replay_without_host_sync, to_device
from triton_xpu_attn import flash_mla_sparse_fwd
from triton_xpu_attn import reference as ref
from triton_xpu_attn import tune
from triton_xpu_attn.ops import index_order
from triton_xpu_attn.ops import mla_sparse as sparse_mod

I32_MIN, I32_MAX = -(2**31), 2**31 - 1

#: kernel configs the property test draws from (None: the launcher's own choice)
CONFIGS = [
    None,
    # NVIDIA's built-in tiles (16 or 32 heads x 32 entries), and 64 x 64
    dict(BLOCK_H=16, BLOCK_N=32, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=8, num_stages=2),
    dict(BLOCK_H=32, BLOCK_N=32, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=8, num_stages=2),
    dict(BLOCK_H=64, BLOCK_N=64, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=8, num_stages=2),
    # held score pieces, output channels split (V read apart from K)
    dict(BLOCK_H=16, BLOCK_N=32, SCORE_CHUNK=0, BLOCK_DV=128, num_warps=4, num_stages=1),
    # the score dot in chunks (the last one partial at d_qk = 576), channels split
    dict(BLOCK_H=16, BLOCK_N=32, SCORE_CHUNK=128, BLOCK_DV=256, num_warps=4, num_stages=1),
]
#: the Intel heuristic's tile (16 x 16, 64-channel chunks, 64 output channels a program)
XPU_CONFIG = dict(sparse_mod._XPU_TILES_CONSTEXPRS, num_warps=8, num_stages=1)


def _config(config):
    return tune.override("mla_sparse", config) if config is not None else contextlib.nullcontext()


def _draw_index(gen, s_kv: int, wide: bool) -> int:
    """One entry of an index list: mostly a valid row, else one of the kinds to skip."""
    kind = int(torch.randint(0, 10, (1,), generator=gen))
    if kind < 5:
        return int(torch.randint(0, s_kv, (1,), generator=gen))
    big = 2**40 if wide else I32_MAX
    return [
        -1,
        -int(torch.randint(2, 1000, (1,), generator=gen)),
        s_kv,
        s_kv + int(torch.randint(1, 10**6, (1,), generator=gen)),
        [I32_MIN, I32_MAX, -big, big][int(torch.randint(0, 4, (1,), generator=gen))],
    ][kind - 5]


def _counted(indices: torch.Tensor, topk_length, s_kv: int):
    """``[s_q, h_kv, topk]`` bool: the entries that count (inside ``topk_length``, a valid row)."""
    s_q, _, topk = indices.shape
    n = torch.full((s_q,), topk) if topk_length is None else topk_length.long().clamp(0, topk)
    inside = torch.arange(topk)[None, None, :] < n[:, None, None]
    return inside & (indices >= 0) & (indices < s_kv)


def make_case(gen, s_q, h_q, h_kv, d_qk, s_kv, topk, dtype, *, index_dtype=torch.int32, topk_length=False,
              sink=False, strided=False, lonely_token=False, clean=False):
    """A problem on the host: q, kv (rows no counted entry selects NaN unless ``clean``; inside a
    wider buffer when ``strided``), indices, topk_length, attn_sink."""
    wide = index_dtype == torch.int64
    idx = torch.tensor([_draw_index(gen, s_kv, wide) for _ in range(s_q * h_kv * topk)], dtype=torch.int64)
    idx = idx.view(s_q, h_kv, topk)
    tl_ = None
    if topk_length:
        choices = torch.tensor([-3, 0, topk // 2, topk, topk + 5, I32_MAX, 1, topk - 1])
        tl_ = choices[torch.randint(0, len(choices), (s_q,), generator=gen)].clamp(I32_MIN, I32_MAX).to(torch.int32)
    if lonely_token:
        idx[0] = -1
    idx = idx.clamp(I32_MIN, I32_MAX) if index_dtype == torch.int32 else idx
    idx = idx.to(index_dtype)
    q = torch.randn(s_q, h_q, d_qk, generator=gen).to(dtype)
    clean_rows = torch.randn(s_kv, h_kv, d_qk, generator=gen).to(dtype)
    pad = 8 if strided else 0
    buf = torch.full((s_kv, h_kv, d_qk + pad), float("nan"), dtype=dtype)
    kv = buf[:, :, :d_qk]
    if clean:
        kv.copy_(clean_rows)
    for t, g, i in _counted(idx.long(), tl_, s_kv).nonzero().tolist():
        row = int(idx[t, g, i])
        kv[row, g] = clean_rows[row, g]
    attn_sink = None
    if sink:
        attn_sink = torch.randn(h_q, generator=gen) * 2
        special = torch.rand(h_q, generator=gen)
        attn_sink[special < 0.1] = float("inf")
        attn_sink[(special >= 0.1) & (special < 0.2)] = -float("inf")
    if strided:
        # heads of q apart in memory, the index lists transposed
        q = torch.cat([q, torch.randn(s_q, h_q, d_qk, generator=gen).to(dtype)], 1).view(s_q, 2, h_q, d_qk)[:, 0]
        idx = idx.transpose(1, 2).contiguous().transpose(1, 2)
    return dict(q=q, kv=kv, kv_buf=buf, indices=idx, topk_length=tl_, attn_sink=attn_sink)


def _buckets(buckets):
    """The prefill's lists grouped in ``buckets`` buckets whatever the cache's size (0: as given)."""
    return mock.patch.object(index_order, "locality_buckets", lambda *args: buckets)


def run_and_check(case, sm_scale, d_v, *, config=None, use_out=False, buckets=0):
    """The op against the reference, every element of its outputs checked; returns them.
    ``buckets``: the index lists grouped by cache region first (``index_order.py``)."""
    q, kv, idx, tl_, sink = (case[k] for k in ("q", "kv", "indices", "topk_length", "attn_sink"))
    dtype = q.dtype
    s_q, h_q, _ = q.shape
    kv_dev = case["kv_buf"].to(DEVICE)[:, :, : kv.shape[2]]
    kwargs = {}
    if use_out:
        out_buf = torch.full((s_q, h_q, d_v + 8), float("nan"), dtype=dtype, device=DEVICE)
        stats_buf = torch.full((2, s_q, 2 * h_q), float("nan"), device=DEVICE)
        kwargs = dict(out=out_buf[:, :, :d_v], max_logits=stats_buf[0, :, ::2], lse=stats_buf[1, :, 1::2])
    with _config(config), _buckets(buckets):
        out, max_logits, lse = flash_mla_sparse_fwd(
            to_device(q), kv_dev, to_device(idx), sm_scale, d_v, to_device(sink), to_device(tl_), **kwargs)
    if use_out:
        assert out is kwargs["out"] and max_logits is kwargs["max_logits"] and lse is kwargs["lse"]
        assert torch.isnan(out_buf[:, :, d_v:]).all(), "wrote past d_v"
        assert torch.isnan(stats_buf[0, :, 1::2]).all() and torch.isnan(stats_buf[1, :, ::2]).all(), "wrote between"
    exp_out, exp_max, exp_lse = ref.mla_sparse_fwd(q, kv, idx, sm_scale, d_v, sink, tl_)
    assert out.dtype == dtype and out.shape == (s_q, h_q, d_v)
    assert max_logits.dtype == lse.dtype == torch.float32 and max_logits.shape == lse.shape == (s_q, h_q)
    out, max_logits, lse = out.cpu(), max_logits.cpu().double(), lse.cpu().double()
    assert not torch.isnan(exp_out).any() and not torch.isnan(out).any(), "NaN in the output (unwritten or unselected row)"
    assert_close(out, exp_out, dtype)
    lonely = torch.isinf(exp_lse)
    assert torch.all(out[lonely] == 0), "a token without a valid entry must give 0"
    for name, got, exp in (("max_logits", max_logits, exp_max), ("lse", lse, exp_lse)):
        assert not torch.isnan(got).any(), f"{name}: NaN (unwritten?)"
        finite = torch.isfinite(exp)
        assert torch.equal(torch.isfinite(got), finite) and torch.equal(got[~finite], exp[~finite]), f"{name}: inf pattern"
        err = ((got - exp).abs() / (1 + exp.abs()))[finite]
        assert err.numel() == 0 or err.max() < 2e-4, f"{name}: error {err.max():.2e}"
    return out, max_logits, lse


@given(
    heads=st.sampled_from([(16, 1), (32, 1), (64, 1), (20, 1), (3, 1), (32, 2), (20, 4), (6, 3)]),
    d_qk=st.sampled_from([512, 576]),
    d_v=st.sampled_from([512, 512, 256, 136]),
    dtype=st.sampled_from(FLOAT_DTYPES),
    index_dtype=st.sampled_from([torch.int32, torch.int32, torch.int64]),
    topk_length=st.booleans(),
    sink=st.booleans(),
    strided=st.booleans(),
    use_out=st.booleans(),
    config=st.sampled_from(CONFIGS),
    buckets=st.sampled_from([0, 0, 1, 4, 16]),
    data=st.data(),
)
def test_mla_sparse_matches_reference(heads, d_qk, d_v, dtype, index_dtype, topk_length, sink, strided, use_out,
                                      config, buckets, data):
    h_q, h_kv = heads
    s_q = data.draw(st.integers(1, 4 if h_q <= 20 else 2), label="s_q")
    s_kv = data.draw(st.integers(1, 70), label="s_kv")
    topk = data.draw(st.one_of(st.sampled_from([1, 15, 16, 17, 33, 64, 65]), st.integers(1, 80)), label="topk")
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    case = make_case(gen, s_q, h_q, h_kv, d_qk, s_kv, topk, dtype, index_dtype=index_dtype, topk_length=topk_length,
                     sink=sink, strided=strided, lonely_token=data.draw(st.booleans(), label="lonely"))
    run_and_check(case, d_qk**-0.5, d_v, config=config, use_out=use_out, buckets=buckets)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("d_qk, d_v, h_q", [(576, 512, 16), (512, 512, 20), (576, 200, 16)])
def test_mla_sparse_intel_tile(dtype, d_qk, d_v, h_q):
    """The XPU heuristic's tile: 16 entries, the score dot over 64-channel chunks, 64 (or, for
    d_v = 200, a partial last slice of) output channels a program."""
    gen = torch.Generator().manual_seed(d_qk + d_v + h_q)
    case = make_case(gen, 2, h_q, 1, d_qk, 40, 21, dtype, topk_length=True, sink=True)
    run_and_check(case, d_qk**-0.5, d_v, config=XPU_CONFIG, use_out=True)


@pytest.mark.parametrize("d_qk, d_v", [(8, 8), (16, 8), (72, 64), (200, 136), (1024, 1024)])
def test_mla_sparse_other_head_dims(d_qk, d_v):
    """Head dims beyond DeepSeek's: the held score pieces (power of two + rest) and masked
    channels at every width the launcher accepts."""
    gen = torch.Generator().manual_seed(d_qk)
    case = make_case(gen, 3, 5, 1, d_qk, 30, 19, torch.float32, topk_length=True, sink=True, strided=True)
    run_and_check(case, 0.3, d_v, use_out=True)
    run_and_check(case, 0.3, d_v, config=CONFIGS[-1])


# ---- the reference itself, by hand ----


def test_reference_hand_example():
    # d_qk 2, d_v 1; rows r0 = [1, 0] (logit 1 * 2 = 2), r1 = [0, 1] (logit 0), r2 = NaN (never selected)
    q = torch.tensor([[[2.0, 0.0]]], dtype=torch.float64)  # [s_q 1, h_q 1, 2]
    kv = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[math.nan, math.nan]]], dtype=torch.float64)
    idx = torch.tensor([[[0, 1, -1, 3, 1]]])  # r1 listed twice: counts twice; -1 and 3 (= s_kv) skipped
    out, mx, lse = ref.mla_sparse_fwd(q, kv, idx, 1.0, 1)
    e2 = math.exp(2)
    assert math.isclose(lse.item(), math.log(e2 + 2)) and mx.item() == 2.0
    assert math.isclose(out.item(), e2 / (e2 + 2))  # V = first channel: 1 for r0, 0 for r1
    # a sink scales the output by exp(lse) / (exp(lse) + exp(sink)) and changes neither statistic
    out_s, mx_s, lse_s = ref.mla_sparse_fwd(q, kv, idx, 1.0, 1, attn_sink=torch.tensor([1.5]))
    assert math.isclose(out_s.item(), e2 / (e2 + 2 + math.exp(1.5))) and mx_s.item() == 2.0 and lse_s.item() == lse.item()
    assert ref.mla_sparse_fwd(q, kv, idx, 1.0, 1, attn_sink=torch.tensor([math.inf]))[0].item() == 0.0
    assert ref.mla_sparse_fwd(q, kv, idx, 1.0, 1, attn_sink=torch.tensor([-math.inf]))[0].item() == out.item()
    # topk_length 1: r0 alone
    out_1, mx_1, lse_1 = ref.mla_sparse_fwd(q, kv, idx, 1.0, 1, topk_length=torch.tensor([1]))
    assert out_1.item() == 1.0 and lse_1.item() == 2.0
    # no valid entry (or topk_length 0): out 0, max_logits -inf, lse +inf (FlashMLA's tests/ref.py)
    for case in (dict(indices=torch.tensor([[[-1, 3, -7]]])), dict(indices=idx, topk_length=torch.tensor([0]))):
        o, m, s = ref.mla_sparse_fwd(q, kv, case["indices"], 1.0, 1, topk_length=case.get("topk_length"),
                                     attn_sink=torch.tensor([0.5]))
        assert o.item() == 0.0 and m.item() == -math.inf and s.item() == math.inf
    # two KV heads: query heads 0-1 read head 0's list and rows, 2-3 head 1's
    kv2 = torch.randn(4, 2, 8, dtype=torch.float64)
    q2 = torch.randn(1, 4, 8, dtype=torch.float64)
    idx2 = torch.tensor([[[0, 2], [1, 3]]])
    out2, _, lse2 = ref.mla_sparse_fwd(q2, kv2, idx2, 0.5, 8)
    for h in range(4):
        g = h // 2
        z = torch.stack([q2[0, h] @ kv2[i, g] for i in idx2[0, g]]) * 0.5
        assert torch.allclose(out2[0, h], torch.softmax(z, 0) @ kv2[idx2[0, g], g])
        assert math.isclose(lse2[0, h].item(), torch.logsumexp(z, 0).item())


def test_kernel_hand_example():
    """The hand example through the kernel (d_qk 16, d_v 8; the other channels 0)."""
    q = torch.zeros(1, 1, 16)
    q[0, 0, 0] = 2.0
    kv = torch.zeros(3, 1, 16)
    kv[0, 0, 0], kv[1, 0, 1] = 1.0, 1.0
    kv[2] = float("nan")
    idx = torch.tensor([[[0, 1, -1, 3, 1]]], dtype=torch.int32)
    out, mx, lse = flash_mla_sparse_fwd(to_device(q), to_device(kv), to_device(idx), 1.0, 8)
    e2 = math.exp(2)
    expected = torch.zeros(8)
    expected[0], expected[1] = e2 / (e2 + 2), 2 / (e2 + 2)  # V: r0's channel 0, r1's channel 1 (listed twice)
    assert torch.allclose(out[0, 0].cpu(), expected, atol=1e-6)
    assert math.isclose(mx.item(), 2.0, rel_tol=1e-6) and math.isclose(lse.item(), math.log(e2 + 2), rel_tol=1e-6)


# ---- semantics, bit for bit ----


def _small_case(seed=0, dtype=torch.float32, **kw):
    gen = torch.Generator().manual_seed(seed)
    args = dict(s_q=3, h_q=16, h_kv=1, d_qk=576, s_kv=40, topk=37)
    args.update(kw)
    return make_case(gen, args.pop("s_q"), args.pop("h_q"), args.pop("h_kv"), args.pop("d_qk"), args.pop("s_kv"),
                     args.pop("topk"), dtype, clean=True)


def _call(case, **over):
    args = dict(q=case["q"], kv=case["kv_buf"][:, :, : case["q"].shape[2]], indices=case["indices"], sm_scale=0.05,
                d_v=512, attn_sink=case["attn_sink"], topk_length=case["topk_length"])
    args.update(over)
    return flash_mla_sparse_fwd(**{k: to_device(v) for k, v in args.items()})


def _equal(a, b):
    return all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b))


def test_tokens_without_a_valid_entry():
    """Every way of having no valid entry gives out 0, max_logits -inf, lse +inf (sinks
    notwithstanding), never NaN; the other tokens are unaffected."""
    case = _small_case(s_q=6)
    idx = case["indices"].clone()
    idx[0] = -1
    idx[1] = torch.tensor([I32_MIN, I32_MAX, 40, -2] * 10)[:37]  # all out of range
    tl_ = torch.tensor([37, 37, 0, -5, 37, 37], dtype=torch.int32)  # tokens 2 and 3: empty lists
    idx[4, 0, 0] = 3  # token 4 keeps one valid entry
    idx[4, 0, 1:] = -1
    sinks = torch.tensor([0.0, math.inf, -math.inf, 3.0] * 4)
    for sink in (None, sinks):
        out, mx, lse = _call(case, indices=idx, topk_length=tl_, attn_sink=sink)
        out, mx, lse = out.cpu(), mx.cpu(), lse.cpu()
        assert torch.all(out[:4] == 0) and torch.all(mx[:4] == -math.inf) and torch.all(lse[:4] == math.inf)
        assert not torch.isnan(out).any() and torch.isfinite(mx[4:]).all() and torch.isfinite(lse[4:]).all()
        exp = ref.mla_sparse_fwd(case["q"], case["kv"], idx, 0.05, 512, sink, tl_)
        assert_close(out[4:], exp[0][4:], torch.float32)
        assert torch.allclose(lse[4], exp[2][4].float()) and torch.allclose(mx[4], exp[1][4].float())
    # a whole call without any valid entry, and the shapes that launch nothing
    out, mx, lse = _call(case, indices=torch.full_like(idx, -1))
    assert torch.all(out == 0) and torch.all(mx == -math.inf) and torch.all(lse == math.inf)
    for over in (dict(indices=idx[:, :, :0]), dict(kv=torch.zeros(0, 1, 576))):
        out, mx, lse = _call(case, **over)
        assert torch.all(out == 0) and torch.all(mx == -math.inf) and torch.all(lse == math.inf)
    out, mx, lse = _call(case, q=case["q"][:0], indices=idx[:0], topk_length=None)
    assert out.shape == (0, 16, 512) and mx.shape == lse.shape == (0, 16)


def test_unselected_rows_are_never_read():
    """NaN and inf in every row no counted entry names (rows named only past topk_length, or by
    the other KV head's list, among them) never reach any output."""
    gen = torch.Generator().manual_seed(7)
    s_q, h_q, h_kv, d_qk, s_kv, topk = 3, 8, 2, 576, 30, 20
    q = torch.randn(s_q, h_q, d_qk, generator=gen)
    clean = torch.randn(s_kv, h_kv, d_qk, generator=gen)
    idx = torch.randint(0, s_kv, (s_q, h_kv, topk), generator=gen, dtype=torch.int32)
    tl_ = torch.tensor([5, 20, 11], dtype=torch.int32)
    counted = _counted(idx.long(), tl_, s_kv)
    kv = torch.full_like(clean, float("nan"))
    kv[:, 1, ::2] = float("inf")
    for t, g, i in counted.nonzero().tolist():
        kv[idx[t, g, i], g] = clean[idx[t, g, i], g]
    named_past_length = {(int(idx[t, g, i]), g) for t in range(s_q) for g in range(h_kv) for i in range(tl_[t], topk)}
    assert named_past_length - {(int(idx[t, g, i]), g) for t, g, i in counted.nonzero().tolist()}, "case too dense"
    got = flash_mla_sparse_fwd(to_device(q), to_device(kv), to_device(idx), 0.05, 512, None, to_device(tl_))
    exp = ref.mla_sparse_fwd(q, clean, idx, 0.05, 512, None, tl_)  # the clean rows: only the selected ones matter
    assert all(torch.isfinite(x.cpu()).all() for x in got)
    assert_close(got[0], exp[0], torch.float32)
    assert torch.allclose(got[2].cpu().double(), exp[2], atol=1e-5)


def test_nan_in_a_selected_row_stays_in_its_token():
    """A selected row holding NaN may make its token's results NaN; the other tokens keep theirs."""
    case = _small_case(s_q=3)
    kv = case["kv_buf"].clone()
    idx = case["indices"].clone()
    idx[1, 0, :] = -1
    idx[1, 0, 5] = 11
    kv[11] = float("nan")
    idx[0][idx[0] == 11] = -1
    idx[2][idx[2] == 11] = -1
    got = _call(case, kv=kv, indices=idx)
    exp = ref.mla_sparse_fwd(case["q"], case["kv"], idx, 0.05, 512)
    for t in (0, 2):
        assert_close(got[0][t], exp[0][t], torch.float32)


def test_sink_limits_and_topk_length_bounds_are_exact():
    case = _small_case(s_q=4)
    base = _call(case, attn_sink=None, topk_length=None)
    # -inf sinks change nothing; +inf sinks zero the output but neither statistic
    assert _equal(_call(case, attn_sink=torch.full((16,), -math.inf)), base)
    out, mx, lse = _call(case, attn_sink=torch.full((16,), math.inf))
    assert torch.all(out.cpu() == 0) and _equal((mx, lse), base[1:])
    # a sink changes neither statistic; finite sinks scale by exp(lse) / (exp(lse) + exp(sink))
    sink = torch.linspace(-2, 4, 16)
    out_s, mx_s, lse_s = _call(case, attn_sink=sink)
    assert _equal((mx_s, lse_s), base[1:])
    scale = torch.sigmoid(base[2].cpu() - sink)[..., None]
    assert torch.allclose(out_s.cpu(), base[0].cpu() * scale, atol=1e-6)
    # topk_length >= topk (int32 max too) is the whole list; k < topk is the list cut at k
    for n in (37, 38, I32_MAX):
        assert _equal(_call(case, topk_length=torch.full((4,), n, dtype=torch.int32)), base)
    cut = _call(case, topk_length=torch.tensor([3, 16, 17, 30], dtype=torch.int32))
    for t, k in enumerate([3, 16, 17, 30]):
        alone = _call(case, indices=case["indices"][t : t + 1, :, :k].contiguous(), q=case["q"][t : t + 1],
                      topk_length=None)
        assert all(torch.equal(c[t].cpu(), a[0].cpu()) for c, a in zip(cut, alone))
    # int64 lists and any skipped value give the results of -1
    idx = case["indices"]
    as_minus_one = torch.where((idx >= 0) & (idx < 40), idx, torch.full_like(idx, -1))
    assert _equal(_call(case, indices=idx.to(torch.int64)), base)
    assert _equal(_call(case, indices=as_minus_one), base)
    wide = as_minus_one.to(torch.int64)
    wide[wide < 0] = -(2**40)
    wide[0, 0, -1] = 2**40
    assert _equal(_call(case, indices=wide), _call(case, indices=torch.where(wide.abs() < 2**31, wide, -1)))


def test_kv_heads_map_to_query_head_groups():
    """h_kv = 2: each half of the query heads equals a call over its own KV head alone."""
    gen = torch.Generator().manual_seed(3)
    case = make_case(gen, 3, 40, 2, 576, 33, 29, torch.float32, topk_length=True, sink=True)
    got = run_and_check(case, 0.04, 512)
    for g in range(2):
        heads = slice(20 * g, 20 * (g + 1))
        alone = flash_mla_sparse_fwd(
            to_device(case["q"][:, heads]), to_device(case["kv_buf"][:, g : g + 1]),
            to_device(case["indices"][:, g : g + 1]), 0.04, 512,
            to_device(case["attn_sink"][heads]), to_device(case["topk_length"]))
        assert all(torch.equal(x[:, heads], y.cpu().to(x.dtype)) for x, y in zip(got, alone))


def test_repeated_runs_are_bitwise_equal():
    case = _small_case(seed=5, dtype=torch.bfloat16)
    first = _call(case)
    for _ in range(3):
        assert _equal(_call(case), first)


def test_as_sgl_kernel_xpu_tests_call_it():
    """sgl-kernel-xpu's test pattern: token t attends to a permutation of rows [0, max(1, t)), the
    rest of its list s_kv; topk_length in [1, topk]; per-head fp32 sinks; bf16; keywords."""
    gen = torch.Generator().manual_seed(88)
    s_q, h_q, s_kv, topk, d_qk = 6, 16, 64, 6, 576
    q = torch.randn(s_q, h_q, d_qk, generator=gen).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, d_qk, generator=gen).to(torch.bfloat16)
    idx = torch.full((s_q, 1, topk), s_kv, dtype=torch.int32)
    for t in range(s_q):
        chosen = torch.randperm(max(1, t), generator=gen)[:topk]
        idx[t, 0, : len(chosen)] = chosen.to(torch.int32)
    tl_ = torch.randint(1, topk + 1, (s_q,), generator=gen, dtype=torch.int32)
    sink = torch.randn(h_q, generator=gen)
    out, mx, lse = flash_mla_sparse_fwd(q=to_device(q), kv=to_device(kv), indices=to_device(idx), sm_scale=192**-0.5,
                                        d_v=512, attn_sink=to_device(sink), topk_length=to_device(tl_))
    exp = ref.mla_sparse_fwd(q, kv, idx, 192**-0.5, 512, sink, tl_)
    assert out.shape == (s_q, h_q, 512) and mx.shape == lse.shape == (s_q, h_q)
    assert_close(out, exp[0], torch.bfloat16)
    assert torch.allclose(lse.cpu().double(), exp[2], atol=1e-3) and torch.allclose(mx.cpu().double(), exp[1], atol=1e-3)


# ---- bad input: one case each, the message names the argument ----


def _valid_args():
    return dict(q=torch.zeros(2, 4, 64), kv=torch.zeros(5, 1, 64), indices=torch.zeros(2, 1, 3, dtype=torch.int32),
                sm_scale=0.1, d_v=64)


@pytest.mark.parametrize(
    "change, error, name",
    [
        (dict(q=torch.zeros(2, 4, 64, dtype=torch.int32)), TypeError, "q"),
        (dict(q=torch.zeros(2, 64)), ValueError, "q"),
        (dict(q=[[[0.0]]]), TypeError, "q"),
        (dict(q=torch.zeros(2, 4, 20), kv=torch.zeros(5, 1, 20), d_v=16), ValueError, "q"),  # d_qk not a multiple of 8
        (dict(q=torch.zeros(2, 4, 1032), kv=torch.zeros(5, 1, 1032)), ValueError, "q"),  # d_qk above 1024
        (dict(q=torch.zeros(2, 3, 64), kv=torch.zeros(5, 2, 64), indices=torch.zeros(2, 2, 3, dtype=torch.int32)),
         ValueError, "q"),  # heads not a multiple of the KV heads
        (dict(kv=torch.zeros(5, 1, 64, dtype=torch.float16)), TypeError, "kv"),
        (dict(kv=torch.zeros(5, 64)), ValueError, "kv"),
        (dict(kv=torch.zeros(5, 1, 72)), ValueError, "kv"),
        # (made on the test's device: a copy to a GPU would be contiguous)
        (dict(kv=lambda dev: torch.zeros(5, 1, 128, device=dev)[:, :, ::2]), ValueError, "kv"),
        (dict(kv=torch.zeros(5, 0, 64), indices=torch.zeros(2, 0, 3, dtype=torch.int32)), ValueError, "kv"),
        (dict(indices=torch.zeros(2, 1, 3)), TypeError, "indices"),
        (dict(indices=torch.zeros(2, 1, 3, dtype=torch.int16)), TypeError, "indices"),
        (dict(indices=torch.zeros(2, 3, dtype=torch.int32)), ValueError, "indices"),
        (dict(indices=torch.zeros(3, 1, 3, dtype=torch.int32)), ValueError, "indices"),
        (dict(indices=torch.zeros(2, 2, 3, dtype=torch.int32)), ValueError, "indices"),
        (dict(indices=torch.zeros(2, 1, 3, dtype=torch.int32, device="meta")), ValueError, "indices"),
        (dict(sm_scale="0.1"), TypeError, "sm_scale"),
        (dict(sm_scale=None), TypeError, "sm_scale"),
        (dict(sm_scale=float("nan")), ValueError, "sm_scale"),
        (dict(d_v=64.0), TypeError, "d_v"),
        (dict(d_v=72), ValueError, "d_v"),
        (dict(d_v=12), ValueError, "d_v"),
        (dict(d_v=0), ValueError, "d_v"),
        (dict(attn_sink=torch.zeros(3)), ValueError, "attn_sink"),
        (dict(attn_sink=torch.zeros(4, dtype=torch.int32)), TypeError, "attn_sink"),
        (dict(attn_sink=[0.0] * 4), TypeError, "attn_sink"),
        (dict(topk_length=torch.zeros(2)), TypeError, "topk_length"),
        (dict(topk_length=torch.zeros(3, dtype=torch.int32)), ValueError, "topk_length"),
        (dict(out=torch.zeros(2, 4, 64, dtype=torch.float16)), TypeError, "out"),
        (dict(out=torch.zeros(2, 4, 32)), ValueError, "out"),
        (dict(out=torch.zeros(2, 64, 4).transpose(1, 2)), ValueError, "out"),
        (dict(max_logits=torch.zeros(2, 4, dtype=torch.float64)), TypeError, "max_logits"),
        (dict(lse=torch.zeros(4, 2)), ValueError, "lse"),
        (dict(lse=torch.zeros(2, 4, device="meta")), ValueError, "lse"),
    ],
)
def test_bad_input_names_the_argument(change, error, name):
    args = _valid_args()
    args.update(change)
    args = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) and not v.is_meta else v) for k, v in args.items()}
    args = {k: (v(DEVICE) if callable(v) else v) for k, v in args.items()}
    with pytest.raises(error, match=rf"^{name}\b"):
        flash_mla_sparse_fwd(**args)


def test_cpu_inputs_under_a_gpu_backend_raise(monkeypatch):
    """CPU tensors while the kernels would run on a GPU: ``ValueError`` naming q and both devices
    (nothing launches)."""
    from triton_xpu_attn import device as _device

    monkeypatch.setattr(_device, "backend", lambda: "cuda")
    monkeypatch.setattr(_device, "default_device", lambda: torch.device("cuda"))
    args = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in _valid_args().items()}
    with pytest.raises(ValueError, match=r"^q is on cpu but kernels run on cuda here \(the cuda backend\)"):
        flash_mla_sparse_fwd(**args)


# ---- custom op, compat module ----


def _op_args():
    case = _small_case(seed=2, s_q=2, h_q=16, s_kv=20, topk=19)
    case["attn_sink"] = torch.randn(16)
    case["topk_length"] = torch.tensor([4, 40], dtype=torch.int32)
    return tuple(to_device(case[k]) for k in ("q", "kv", "indices")), dict(
        sm_scale=0.05, d_v=512, attn_sink=to_device(case["attn_sink"]), topk_length=to_device(case["topk_length"]))


def test_custom_op_opcheck_and_equals_the_function():
    from triton_xpu_attn import custom_ops as C

    args, kwargs = _op_args()
    result = torch.library.opcheck(C.flash_mla_sparse_fwd, args, kwargs)
    assert all(v == "SUCCESS" for v in result.values()), result
    expected = flash_mla_sparse_fwd(*args, **kwargs)
    assert _equal(torch.ops.triton_xpu_attn.flash_mla_sparse_fwd(*args, **kwargs), expected)
    assert "flash_mla_sparse_fwd" in C.OPS
    # empty batch: the fake and the op agree on shapes
    q, kv, idx = args
    result = torch.library.opcheck(C.flash_mla_sparse_fwd, (q[:0], kv, idx[:0]), dict(sm_scale=0.1, d_v=256))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_compiled_call_has_no_graph_break():
    args, kwargs = _op_args()

    torch._dynamo.reset()

    @torch.compile(fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    def step(q, kv, idx, sink, tl_):
        out, _, lse = torch.ops.triton_xpu_attn.flash_mla_sparse_fwd(q, kv, idx, 0.05, 512, sink, tl_)
        return out * 2, lse

    got = step(*args, kwargs["attn_sink"], kwargs["topk_length"])
    eager = flash_mla_sparse_fwd(*args, **kwargs)
    assert torch.equal(got[0], eager[0] * 2) and torch.equal(got[1], eager[2])


def test_sgl_kernel_compat_names():
    from triton_xpu_attn.compat import sgl_kernel
    from triton_xpu_attn.compat.sgl_kernel import attention

    assert sgl_kernel.flash_mla_sparse_fwd is flash_mla_sparse_fwd
    assert attention.flash_mla_sparse_fwd is flash_mla_sparse_fwd
    assert "flash_mla_sparse_fwd" in sgl_kernel.__all__
    # sgl-kernel-xpu's (and FlashMLA's) parameters, in order; ours are keyword-only after them
    params = inspect.signature(flash_mla_sparse_fwd).parameters
    assert list(params)[:7] == ["q", "kv", "indices", "sm_scale", "d_v", "attn_sink", "topk_length"]
    assert params["d_v"].default == 512 and params["sm_scale"].default is inspect.Parameter.empty
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(params.values())[7:])


# ---- GPU: DeepSeek sizes, 64-bit offsets, graphs ----


@pytest.mark.gpu
@pytest.mark.parametrize("h_q", [16, 64, 128])
def test_mla_sparse_deepseek_bf16(h_q):
    """2048-entry lists over 8k rows at DeepSeek's widths (the reference on the GPU)."""
    gen = torch.Generator(device=DEVICE).manual_seed(h_q)
    s_q, s_kv, topk = 64, 8192, 2048
    q = torch.randn(s_q, h_q, 576, generator=gen, device=DEVICE).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, 576, generator=gen, device=DEVICE).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(s_kv, generator=gen, device=DEVICE)[:topk] for _ in range(s_q)])[:, None]
    idx = idx.to(torch.int32)
    idx[::3, :, -100:] = -1
    tl_ = torch.randint(1, topk + 1, (s_q,), generator=gen, device=DEVICE, dtype=torch.int32)
    sink = torch.randn(h_q, generator=gen, device=DEVICE)
    out, mx, lse = flash_mla_sparse_fwd(q, kv, idx, 576**-0.5, 512, sink, tl_)
    exp = ref.mla_sparse_fwd(q, kv, idx.cpu(), 576**-0.5, 512, sink, tl_.cpu())
    assert_close(out, exp[0], torch.bfloat16)
    assert (lse.double() - exp[2]).abs().max() < 1e-3 and (mx.double() - exp[1]).abs().max() < 1e-3


@pytest.mark.gpu
def test_mla_sparse_lists_grouped_over_a_cache_beyond_l2():
    """A cache larger than the L2 cache (75 MiB) and more lists than compute units: the prefill
    groups the lists by cache region (``index_order.py``); the result matches the reference and the
    call with the lists as given."""
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    s_q, h_q, s_kv, topk = 512, 16, 65536, 2048
    q = torch.randn(s_q, h_q, 576, generator=gen, device=DEVICE).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, 576, generator=gen, device=DEVICE).to(torch.bfloat16)
    idx = torch.randint(-3, s_kv + 3, (s_q, 1, topk), generator=gen, device=DEVICE, dtype=torch.int32)
    tl_ = torch.randint(0, topk + 20, (s_q,), generator=gen, device=DEVICE, dtype=torch.int32)
    assert index_order.locality_buckets(s_kv, 576 * 2, s_q, topk, DEVICE) > 0
    out, mx, lse = flash_mla_sparse_fwd(q, kv, idx, 576**-0.5, 512, None, tl_)
    with _buckets(0):
        as_given = flash_mla_sparse_fwd(q, kv, idx, 576**-0.5, 512, None, tl_)
    tokens = torch.tensor([0, 1, 200, 511])
    exp = ref.mla_sparse_fwd(q[tokens], kv, idx[tokens].cpu(), 576**-0.5, 512, None, tl_[tokens].cpu())
    assert_close(out[tokens], exp[0], torch.bfloat16)
    assert (lse[tokens].double() - exp[2]).abs().max() < 1e-3 and (mx[tokens].double() - exp[1]).abs().max() < 1e-3
    assert_close(out, as_given[0].double(), torch.bfloat16)
    assert torch.allclose(mx, as_given[1], rtol=0, atol=1e-5) and torch.allclose(lse, as_given[2], rtol=0, atol=1e-4)


@pytest.mark.gpu
def test_mla_sparse_rows_beyond_2_pow_31_elements():
    """kv of 2^31 + 2^20 elements, bf16; the lists name rows at its far end (64-bit offsets)."""
    d_qk = 576
    s_kv = (2**31 + 2**20) // d_qk + 1
    kv = torch.empty(s_kv, 1, d_qk, dtype=torch.bfloat16, device=DEVICE)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    far = torch.arange(s_kv - 300, s_kv, device=DEVICE)
    kv[far] = torch.randn(300, 1, d_qk, generator=gen, device=DEVICE).to(torch.bfloat16)
    q = torch.randn(4, 16, d_qk, generator=gen, device=DEVICE).to(torch.bfloat16)
    idx = far[torch.randint(0, 300, (4, 1, 100), generator=gen, device=DEVICE)].to(torch.int32)
    out, mx, lse = flash_mla_sparse_fwd(q, kv, idx, d_qk**-0.5, 512)
    exp = ref.mla_sparse_fwd(q, kv, idx.cpu(), d_qk**-0.5, 512)
    assert_close(out, exp[0], torch.bfloat16)
    assert (lse.double() - exp[2]).abs().max() < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("buckets", [0, 4])
def test_mla_sparse_graph_replay_without_host_sync(buckets):
    """Captured in a device graph, replayed with new values (no host sync allowed): equals eager;
    ``buckets``: with the lists grouped by cache region first."""
    api = torch.cuda if torch.cuda.is_available() else torch.xpu
    gen = torch.Generator(device=DEVICE).manual_seed(9)
    s_q, h_q, s_kv, topk = 8, 64, 500, 300

    def values():
        return (torch.randn(s_q, h_q, 576, generator=gen, device=DEVICE).to(torch.bfloat16),
                torch.randint(-5, s_kv + 5, (s_q, 1, topk), generator=gen, device=DEVICE, dtype=torch.int32),
                torch.randint(-2, topk + 50, (s_q,), generator=gen, device=DEVICE, dtype=torch.int32))

    q, idx, tl_ = values()
    kv = torch.randn(s_kv, 1, 576, generator=gen, device=DEVICE).to(torch.bfloat16)
    sink = torch.randn(h_q, generator=gen, device=DEVICE)

    def run():
        with _buckets(buckets):
            return flash_mla_sparse_fwd(q, kv, idx, 0.05, 512, sink, tl_)

    graph, outputs = capture_graph(api, run)
    for new, old in zip(values(), (q, idx, tl_)):
        old.copy_(new)
    replay_without_host_sync(api, graph)
    assert _equal(outputs, run())
