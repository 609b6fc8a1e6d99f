"""flash_attn_varlen_func: non-paged ragged attention (the paged kernel's contiguous-K/V mode).

Property tests against the float64 reference (``reference.varlen_attention``) over batch, ragged
query and key lengths (q_len > kv_len, zero lengths, empty batches), GQA groups, head dims
(D != Dv), causal / window / softcap / sinks, LSE, strides (k and v as views of one packed buffer,
padded head strides, token strides), seqused_k, split counts and padding rows; bad input; the
custom op; a bf16 GPU test at prefill sizes.
"""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import DEVICE, FLOAT_DTYPES, INTERPRET, KV_LOADS, assert_close, head_dim_pairs, kv_load_config, poison
from test_paged_attention import check_lse
from triton_xpu_attn import custom_ops as C
from triton_xpu_attn import flash_attn_varlen_func, tune
from triton_xpu_attn import reference as ref

GROUPS = [1, 2, 3, 4, 6, 8]
LAYOUTS = ["separate", "packed", "padded", "token_strided"]


def make_kv(total_k, num_kv_heads, head_dim, head_dim_v, dtype, layout, gen):
    """K [total_k, H_kv, D] and V [total_k, H_kv, Dv] in a layout an engine may hand us.

    packed: slices of one buffer (a fused qkv projection when D == Dv; one [.., D + Dv] row per
    head otherwise, as MLA's kv_b output); padded: head stride wider than D; token_strided:
    every other row of a larger buffer."""
    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    if layout == "packed":
        if head_dim == head_dim_v:
            buf = randn(total_k, 3 * num_kv_heads + 1, head_dim)  # [q heads | k | v] of a qkv output
            return buf[:, num_kv_heads + 1 : 2 * num_kv_heads + 1], buf[:, 2 * num_kv_heads + 1 :]
        buf = randn(total_k, num_kv_heads, head_dim + head_dim_v)
        return buf[..., :head_dim], buf[..., head_dim:]
    if layout == "padded":
        return randn(total_k, num_kv_heads, head_dim + 16)[..., :head_dim], randn(total_k, num_kv_heads, head_dim_v + 8)[..., 8:]
    if layout == "token_strided":
        return randn(2 * total_k, num_kv_heads, head_dim)[::2], randn(2 * total_k, num_kv_heads, head_dim_v)[1::2]
    return randn(total_k, num_kv_heads, head_dim), randn(total_k, num_kv_heads, head_dim_v)


@st.composite
def varlen_problems(draw, max_batch=3, max_q=6, max_k=12):
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    batch = draw(st.integers(0, max_batch))
    head_dim, head_dim_v = draw(head_dim_pairs())
    causal = draw(st.booleans())
    q_lens = [draw(st.integers(0, max_q)) for _ in range(batch)]
    k_lens = [draw(st.integers(0, max_k)) for _ in range(batch)]  # q_len > kv_len happens
    use_seqused = draw(st.booleans())
    seqused = [draw(st.integers(0, n)) for n in k_lens] if use_seqused else None
    # FlashAttention-3's seqused_q: the first rows of each slice, masks aligned to them
    seqused_q = [draw(st.integers(0, n)) for n in q_lens] if draw(st.booleans()) else None
    return dict(seqused_q=seqused_q,
        dtype=dtype, batch=batch, group=draw(st.sampled_from(GROUPS)), num_kv_heads=draw(st.integers(1, 2)),
        head_dim=head_dim, head_dim_v=head_dim_v, q_lens=q_lens, k_lens=k_lens, seqused=seqused,
        k_offset=draw(st.sampled_from([0, 0, 3])),  # cu_seqlens_k[0] > 0: rows before the first request
        pad_q=draw(st.sampled_from([0, 0, 2])),  # rows of q past cu_seqlens_q[B]
        causal=causal, window=(draw(st.sampled_from([-1, -1, 0, 2, 5])),
                               draw(st.sampled_from([-1, 0])) if causal else draw(st.sampled_from([-1, -1, 0, 3]))),
        softcap=draw(st.sampled_from([0.0, 0.0, 5.0])), sinks=draw(st.booleans()),
        layout=draw(st.sampled_from(LAYOUTS)), q_sliced=draw(st.booleans()),
        num_splits=draw(st.sampled_from([0, 0, 1, 2, 5])), give_max_seqlen_q=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def run_problem(pb, device=DEVICE):
    gen = torch.Generator().manual_seed(pb["seed"])
    dtype = pb["dtype"]
    num_q_heads = pb["group"] * pb["num_kv_heads"]
    cu_q = torch.tensor([0] + torch.tensor(pb["q_lens"], dtype=torch.long).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(pb["k_lens"], dtype=torch.long).cumsum(0).tolist(), dtype=torch.int32)
    cu_k += pb["k_offset"]
    total_q, total_k = int(cu_q[-1]) + pb["pad_q"], int(cu_k[-1]) + 1  # one row past the last request
    k, v = make_kv(total_k, pb["num_kv_heads"], pb["head_dim"], pb["head_dim_v"], dtype, pb["layout"], gen)
    # rows no request owns hold NaN: masking a score is not masking a value
    outside = torch.ones(total_k, dtype=torch.bool)
    for b in range(pb["batch"]):
        used = pb["k_lens"][b] if pb["seqused"] is None else pb["seqused"][b]
        outside[int(cu_k[b]) : int(cu_k[b]) + used] = False
    k[outside] = float("nan")
    v[outside] = float("nan")
    if pb["q_sliced"]:
        q = torch.randn(total_q, num_q_heads + 2, pb["head_dim"], generator=gen).to(dtype)[:, 1 : num_q_heads + 1]
    else:
        q = torch.randn(total_q, num_q_heads, pb["head_dim"], generator=gen).to(dtype)
    sinks = torch.randn(num_q_heads, generator=gen) if pb["sinks"] else None
    seqused = torch.tensor(pb["seqused"], dtype=torch.int32) if pb["seqused"] is not None else None
    options = dict(causal=pb["causal"], window_size=pb["window"], softcap=pb["softcap"], sinks=sinks)
    seqused_q = torch.tensor(pb["seqused_q"], dtype=torch.int32) if pb.get("seqused_q") is not None else None
    out_ref, lse_ref = ref.varlen_attention(q, k, v, cu_q, cu_k, seqused, seqused_q=seqused_q, **options)

    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    out = poison(torch.empty(total_q, num_q_heads, pb["head_dim_v"], dtype=dtype, device=device))
    max_q = max(pb["q_lens"], default=0) if pb["give_max_seqlen_q"] else None
    got, lse = flash_attn_varlen_func(
        to(q), to(k), to(v), to(cu_q), to(cu_k), max_q, max(pb["k_lens"], default=0), seqused_q=to(seqused_q),
        seqused_k=to(seqused),
        return_softmax_lse=True, num_splits=pb["num_splits"], out=out, **{**options, "sinks": to(sinks)},
    )
    assert got is out
    return got, lse, out_ref, lse_ref


@given(pb=varlen_problems())
def test_matches_reference(pb):
    got, lse, out_ref, lse_ref = run_problem(pb)
    assert not torch.isnan(got).any(), "unwritten (poisoned) or NaN output"
    assert_close(got, out_ref, pb["dtype"])
    check_lse(lse, lse_ref, pb["dtype"])


def _problem(**overrides):
    pb = dict(dtype=torch.float32, batch=2, group=2, num_kv_heads=1, head_dim=64, head_dim_v=64, q_lens=[5, 3],
              k_lens=[9, 3], seqused=None, k_offset=0, pad_q=0, causal=True, window=(-1, -1), softcap=0.0, sinks=False,
              layout="separate", q_sliced=False, num_splits=0, give_max_seqlen_q=True, seed=0)
    pb.update(overrides)
    return pb


@pytest.mark.parametrize("kv_load", KV_LOADS)
@pytest.mark.parametrize("block_n", [16, 32])
@pytest.mark.parametrize("limits", [dict(causal=True), dict(causal=True, window=(5, 0)), dict(causal=False, window=(3, 2))])
def test_short_key_tiles(block_n, limits, kv_load):
    """Several key tiles per request (16/32-key tiles over 40-70 keys), so the tiles every row sees
    whole skip the element mask while the others keep it; splits cut the keys too. With
    descriptors (compiled, Triton >= 3.4) whole tiles load through tensor descriptors, the unmasked
    ones in a loop of their own between two masked ones; with block pointers (the XPU path) every
    tile loads its visible rows of the request's slice."""
    pb = _problem(q_lens=[12, 7], k_lens=[70, 41], num_splits=3, sinks=True, **limits)
    with tune.override("paged_attention", dict(BLOCK_N=block_n, BLOCK_M=16, **kv_load_config(kv_load))):
        got, lse, out_ref, lse_ref = run_problem(pb)
    assert_close(got, out_ref, torch.float32)
    check_lse(lse, lse_ref, torch.float32)


@pytest.mark.parametrize("kv_load", KV_LOADS)
@pytest.mark.parametrize("limits", [dict(causal=True), dict(causal=True, window=(5, 0)), dict(causal=False, window=(3, 2))])
def test_seqused_q(limits, kv_load):
    """seqused_q with FlashAttention-3's meaning: request b uses the first seqused_q[b] rows of its
    slice (the causal / window alignment with them), the rest give 0 and LSE -inf; 16-key and
    16-row tiles so a tile holds used and unused rows and the unmasked-tile range must not cover
    the unused ones; splits too. Against the reference (the used rows alone, scattered back)."""
    pb = _problem(q_lens=[12, 7, 5], k_lens=[70, 41, 9], seqused_q=[5, 7, 0], num_splits=3, sinks=True, batch=3, **limits)
    with tune.override("paged_attention", dict(BLOCK_N=16, BLOCK_M=16, **kv_load_config(kv_load))):
        got, lse, out_ref, lse_ref = run_problem(pb)
        assert_close(got, out_ref, torch.float32)
        check_lse(lse, lse_ref, torch.float32)
        # unused rows: exactly 0 and -inf (request 0's rows 5..11, request 2's all)
        assert (got[5:12] == 0).all() and (got[19:24] == 0).all()
        assert torch.isneginf(lse[:, 5:12]).all() and torch.isneginf(lse[:, 19:24]).all()


def test_seqused_q_validate_names_the_request():
    q = torch.zeros(5, 2, 64, device=DEVICE)
    k = torch.zeros(6, 1, 64, device=DEVICE)
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 3, 6], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"seqused_q\[1\] = 4 lies outside \[0, 3\]"):
        flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 3, seqused_q=torch.tensor([1, 4], dtype=torch.int32, device=DEVICE),
                               validate=True)
    with pytest.raises(TypeError, match="seqused_q"):
        flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 3, seqused_q=[1, 2])


def test_more_queries_than_keys():
    """q_len > kv_len: non-causal rows see every key; causal rows before the first key see none
    (0, LSE -inf), as FlashAttention's bottom-right alignment gives."""
    for causal in (False, True):
        got, lse, out_ref, lse_ref = run_problem(_problem(q_lens=[6, 2], k_lens=[2, 0], causal=causal))
        assert_close(got, out_ref, torch.float32)
        check_lse(lse, lse_ref, torch.float32)
        assert torch.isneginf(lse[:, 6:]).all() and torch.equal(got[6:].cpu(), torch.zeros(2, 2, 64))
        if causal:
            assert torch.isneginf(lse[:, :4]).all() and torch.isfinite(lse[:, 4:6]).all()
        else:
            assert torch.isfinite(lse[:, :6]).all()


def test_seqused_k_takes_the_first_keys_of_each_slice():
    """seqused_k[b] keys from cu_seqlens_k[b] on, the causal alignment on seqused_k[b]; beyond the
    slice it is clamped to the slice (never another request's keys)."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(4, 2, 64, generator=gen)
    k, v = torch.randn(10, 1, 64, generator=gen), torch.randn(10, 1, 64, generator=gen)
    cu_q = torch.tensor([0, 2, 4], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 10], dtype=torch.int32)
    used = torch.tensor([3, 9], dtype=torch.int32)  # request 1: 9 > its 4 keys, clamped
    got = flash_attn_varlen_func(*(t.to(DEVICE) for t in (q, k, v, cu_q, cu_k)), 2, 6, seqused_k=used.to(DEVICE), causal=True)
    # the same as each request's used keys passed as their own slices
    expected = flash_attn_varlen_func(
        q.to(DEVICE), torch.cat([k[:3], k[6:]]).to(DEVICE), torch.cat([v[:3], v[6:]]).to(DEVICE), cu_q.to(DEVICE),
        torch.tensor([0, 3, 7], dtype=torch.int32, device=DEVICE), 2, 4, causal=True,
    )
    assert_close(got, expected.cpu(), torch.float32)
    out_ref, _ = ref.varlen_attention(q, k, v, cu_q, cu_k, used, causal=True)
    assert_close(got, out_ref, torch.float32)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_empty_batches_and_zero_lengths_give_zeros_and_minus_inf(num_splits):
    gen = torch.Generator().manual_seed(2)
    for total_q, total_k, cu_q, cu_k in (
        (0, 0, [0], [0]),  # empty batch
        (3, 0, [0], [0]),  # empty batch, 3 padding rows of q
        (3, 5, [0, 0, 3], [0, 5, 5]),  # a request without queries, one without keys
        (2, 0, [0, 2], [0, 0]),  # no key anywhere (an empty k)
    ):
        q = torch.randn(total_q, 4, 64, generator=gen).to(DEVICE)
        k = torch.randn(total_k, 2, 64, generator=gen).to(DEVICE)
        out = poison(torch.empty(total_q, 4, 64, device=DEVICE))
        cu_q_t = torch.tensor(cu_q, dtype=torch.int32, device=DEVICE)
        cu_k_t = torch.tensor(cu_k, dtype=torch.int32, device=DEVICE)
        got, lse = flash_attn_varlen_func(q, k, k, cu_q_t, cu_k_t, max(cu_q) or None, max(cu_k), sinks=torch.ones(4, device=DEVICE),
                                          causal=True, num_splits=num_splits, return_softmax_lse=True, out=out)
        assert lse.shape == (4, total_q) and not torch.isnan(got).any()
        assert torch.equal(got.cpu(), torch.zeros(total_q, 4, 64)) and torch.isneginf(lse).all()


def test_default_allocation_fp16_and_sglang_style_call():
    """The call sglang's XPU backend makes (keywords, ``out, lse, *rest = ...``), D=192 / Dv=128."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(7, 4, 192, generator=gen).half()
    k = torch.randn(7, 4, 192, generator=gen).half()
    v = torch.randn(7, 4, 128, generator=gen).half()
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    result = flash_attn_varlen_func(
        q=q.to(DEVICE), k=k.to(DEVICE), v=v.to(DEVICE), cu_seqlens_q=cu.to(DEVICE), cu_seqlens_k=cu.to(DEVICE),
        max_seqlen_q=4, max_seqlen_k=4, softmax_scale=0.1, causal=True, return_softmax_lse=True,
    )
    output, lse, *rest = result
    assert output.shape == (7, 4, 128) and output.dtype == torch.float16 and lse.dtype == torch.float32 and not rest
    out_ref, lse_ref = ref.varlen_attention(q, k, v, cu, cu, softmax_scale=0.1, causal=True)
    assert_close(output, out_ref, torch.float16)
    check_lse(lse, lse_ref, torch.float16)
    plain = flash_attn_varlen_func(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cu.to(DEVICE), cu.to(DEVICE), 4, 4,
                                   softmax_scale=0.1, causal=True)
    assert torch.equal(plain, output)


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_kv_with_descales(fp8):
    fp8 = getattr(torch, fp8)
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(5, 4, 64, generator=gen).half()
    k = (torch.randn(9, 2, 64, generator=gen) * 4).to(fp8)
    v = (torch.randn(9, 2, 64, generator=gen) * 4).to(fp8)
    cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 6, 9], dtype=torch.int32)
    k_scale, v_scale = torch.rand(2, 2, generator=gen) + 0.1, torch.tensor(0.5)
    got = flash_attn_varlen_func(*(t.to(DEVICE) for t in (q, k, v, cu_q, cu_k)), 3, 6,
                                 k_descale=k_scale.to(DEVICE), v_descale=v_scale.to(DEVICE), num_splits=2)
    out_ref, _ = ref.varlen_attention(q, k, v, cu_q, cu_k, k_descale=k_scale, v_descale=v_scale)
    assert_close(got, out_ref, torch.float16)


def test_reference_is_paged_attention_over_one_token_pages():
    # hand example: one query, keys with logits 0 and log(3) (scale 1): weights 1/4, 3/4
    q = torch.tensor([[[1.0, 0.0]]])
    k = torch.tensor([[[5.0, 5.0]], [[0.0, 0.0]], [[math.log(3), 0.0]]])  # row 0 belongs to no request
    v = torch.tensor([[[9.0, 9.0]], [[4.0, 0.0]], [[8.0, 4.0]]])
    out, lse = ref.varlen_attention(q, k, v, torch.tensor([0, 1]), torch.tensor([1, 3]), softmax_scale=1.0)
    assert torch.allclose(out, torch.tensor([[[7.0, 3.0]]], dtype=torch.float64))
    assert lse.item() == pytest.approx(math.log(4))


def _valid_args():
    return dict(
        q=torch.zeros(3, 4, 64), k=torch.zeros(5, 2, 64), v=torch.zeros(5, 2, 64),
        cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32), cu_seqlens_k=torch.tensor([0, 2, 5], dtype=torch.int32),
        max_seqlen_q=2, max_seqlen_k=3,
    )


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(q=torch.zeros(3, 4, 64, dtype=torch.int32)), TypeError, "q must have dtype"),
        (dict(q=torch.zeros(1, 3, 4, 64)), ValueError, "q must have 3 dimensions"),
        (dict(k=torch.zeros(5, 2, 64, dtype=torch.float16)), TypeError, "k must have dtype"),
        (dict(v=torch.zeros(5, 2, 64, dtype=torch.float16)), TypeError, "v must have dtype"),
        (dict(k=torch.zeros(5, 1, 2, 64)), ValueError, "k must have 3 dimensions"),
        (dict(q=lambda: torch.zeros(3, 4, 128, device=DEVICE)[..., ::2]), ValueError, r"q must be contiguous in its last dimension"),
        (dict(k=lambda: torch.zeros(5, 2, 128, device=DEVICE)[..., ::2]), ValueError, r"k must be contiguous in its last dimension"),
        (dict(v=lambda: torch.zeros(5, 2, 128, device=DEVICE)[..., ::2]), ValueError, r"v must be contiguous in its last dimension"),
        (dict(v=torch.zeros(4, 2, 64)), ValueError, r"v must have shape \[5, 2, Dv\] like k"),
        (dict(q=torch.zeros(3, 4, 128)), ValueError, r"q's head dim \(128\) must equal k's \(64\)"),
        (dict(q=torch.zeros(3, 3, 64)), ValueError, "multiple of the KV heads"),
        (dict(q=torch.zeros(3, 4, 44), k=torch.zeros(5, 2, 44), v=torch.zeros(5, 2, 44)), ValueError,
         "head dim D must be a multiple of 8 from 8 to 576"),
        (dict(v=torch.zeros(5, 2, 260)), ValueError, "value head dim Dv must be a multiple of 8 from 8 to 512"),
        (dict(cu_seqlens_q=torch.tensor([0, 1, 3])), TypeError, "cu_seqlens_q must have dtype"),
        (dict(cu_seqlens_q=torch.zeros(0, dtype=torch.int32)), ValueError, "cu_seqlens_q must have B"),
        (dict(cu_seqlens_k=torch.tensor([0, 5], dtype=torch.int32)), ValueError, r"cu_seqlens_k must have shape \[3\]"),
        (dict(cu_seqlens_k=torch.tensor([0, 2, 5])), TypeError, "cu_seqlens_k must have dtype"),
        (dict(seqused_k=torch.ones(3, dtype=torch.int32)), ValueError, r"seqused_k must have shape \[2\]"),
        (dict(seqused_q=torch.ones(3, dtype=torch.int32)), ValueError, "seqused_q must have shape"),
        (dict(qv=torch.zeros(3, 4, 64)), ValueError, "qv: "),
        (dict(q_descale=torch.ones(1)), ValueError, "q_descale: "),
        (dict(max_seqlen_q=torch.tensor(2.0)), TypeError, "max_seqlen_q must be an int"),
        (dict(max_seqlen_k=2.5), TypeError, "max_seqlen_k must be an int"),
        (dict(max_seqlen_q=-1), ValueError, "max_seqlen_q must be >= 0"),
        (dict(window_size=(-2, 0)), ValueError, "window_size"),
        (dict(softcap=-1.0), ValueError, "softcap"),
        (dict(sinks=torch.zeros(3)), ValueError, "sinks"),
        (dict(k_descale=torch.ones(2, 3)), ValueError, "k_descale"),
        (dict(out=torch.zeros(3, 4, 32)), ValueError, "out must have shape"),
        (dict(num_splits=-1), ValueError, "num_splits"),
        (dict(cu_seqlens_k=torch.tensor([0, 2, 5], dtype=torch.int32, device="meta")), ValueError, "on one device"),
    ],
)
def test_rejects_bad_input(change, error, match):
    args = _valid_args()
    args.update(change)
    # tensors move to the device; a callable makes its (strided) tensor there, since .to() would
    # copy a strided view contiguous
    args = {k: (v() if callable(v) else v.to(DEVICE) if isinstance(v, torch.Tensor) and v.device.type != "meta" else v)
            for k, v in args.items()}
    with pytest.raises(error, match=match):
        flash_attn_varlen_func(**args)


def test_validate():
    args = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in _valid_args().items()}
    flash_attn_varlen_func(**args, validate=True)  # valid: no error
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=DEVICE)  # noqa: E731
    for change, match in (
        (dict(cu_seqlens_q=i32([0, 2, 1])), "cu_seqlens_q must be non-decreasing"),
        (dict(cu_seqlens_k=i32([0, 2, 6])), r"cu_seqlens_k must be non-decreasing from >= 0 up to at most 5"),
        (dict(max_seqlen_q=1), "max_seqlen_q = 1 but request 1 has 2 queries"),
        (dict(seqused_k=i32([1, 4])), r"seqused_k\[1\] = 4 lies outside \[0, 3\]"),
    ):
        with pytest.raises(ValueError, match=match):
            flash_attn_varlen_func(**{**args, **change}, validate=True)


def _custom_args():
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(5, 4, 64, generator=gen).to(DEVICE)
    k = torch.randn(7, 2, 64, generator=gen).to(DEVICE)
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 3, 7], dtype=torch.int32, device=DEVICE)
    return (q, k, k, cu_q, cu_k, 3, 4), dict(causal=True, window_left=2, sinks=torch.ones(4, device=DEVICE),
                                             return_softmax_lse=True, num_splits=2)


def test_custom_op_opcheck_and_equals_public_function():
    args, kwargs = _custom_args()
    result = torch.library.opcheck(C.flash_attn_varlen_func, args, kwargs)
    assert all(v == "SUCCESS" for v in result.values()), result
    out, lse = torch.ops.triton_xpu_attn.flash_attn_varlen_func(*args, **kwargs)
    expected = flash_attn_varlen_func(*args, causal=True, window_size=(2, -1), sinks=kwargs["sinks"], num_splits=2,
                                      return_softmax_lse=True)
    assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])
    # empty batch, no LSE: the fake and the op agree
    q, k = args[0][:0], args[1][:0]
    z = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    result = torch.library.opcheck(C.flash_attn_varlen_func, (q, k, k, z, z, None, None), {})
    assert all(v == "SUCCESS" for v in result.values()), result


def _far_end(total_k, dtype, num_splits, hkv=2, d=64, group=2):
    """Two requests over the last 300 rows of a K/V pair of ``total_k`` rows (packed in one
    buffer): their element offsets pass 2^31 when total_k * 2 * hkv * d does."""
    gen = torch.Generator().manual_seed(6)
    buf = torch.empty(total_k, 2, hkv, d, dtype=dtype, device=DEVICE)
    small = torch.randn(300, 2, hkv, d, generator=gen).to(dtype)
    buf[total_k - 300 :] = small.to(DEVICE)
    cu_k = torch.tensor([total_k - 300, total_k - 120, total_k], dtype=torch.int32)
    cu_q = torch.tensor([0, 40, 70], dtype=torch.int32)
    q = torch.randn(70, hkv * group, d, generator=gen).to(dtype)
    got = flash_attn_varlen_func(q.to(DEVICE), buf[:, 0], buf[:, 1], cu_q.to(DEVICE), cu_k.to(DEVICE), 40, 180,
                                 causal=True, num_splits=num_splits)
    out_ref, _ = ref.varlen_attention(q, small[:, 0], small[:, 1], cu_q, cu_k - (total_k - 300), causal=True)
    assert_close(got, out_ref, dtype)


@pytest.mark.parametrize("num_splits", [1, 0])
def test_far_end_harness_small(num_splits):
    _far_end(320, torch.float32 if INTERPRET else torch.bfloat16, num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 0])
def test_keys_beyond_2_pow_31_elements(num_splits):
    hkv, d = 8, 128
    total_k = 2**31 // (2 * hkv * d) + 4096  # 2^31 + 8M elements in the packed K/V buffer
    need = total_k * 2 * hkv * d * 2
    free = torch.cuda.mem_get_info()[0] if DEVICE.type == "cuda" else torch.xpu.mem_get_info()[0]
    if free < need + 2**30:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free device memory")
    _far_end(total_k, torch.bfloat16, num_splits, hkv=hkv, d=d)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(32, 8, 128, 128), (16, 16, 192, 128), (8, 1, 256, 256)])
def test_gpu_prefill_sizes_bf16(shape):
    """Compiled only: two requests of 1-2k tokens (prefill tiles, many key tiles), bf16."""
    hq, hkv, d, dv = shape
    for seed, (causal, window, q_lens, k_lens) in enumerate((
        (True, (-1, -1), [1536, 2048], [1536, 2048]),  # full prefill
        (False, (-1, -1), [700, 1200], [2048, 1024]),  # extend over a prefix chunk, LSE for merging
        (True, (511, 0), [1024, 333], [2000, 1500]),  # sliding window over a prefix
    )):
        pb = _problem(dtype=torch.bfloat16, batch=2, group=hq // hkv, num_kv_heads=hkv, head_dim=d, head_dim_v=dv,
                      q_lens=q_lens, k_lens=k_lens, causal=causal, window=window, sinks=seed == 2,
                      layout=LAYOUTS[seed % len(LAYOUTS)], seed=seed)
        got, lse, out_ref, lse_ref = run_problem(pb)
        assert_close(got, out_ref, torch.bfloat16)
        check_lse(lse, lse_ref, torch.bfloat16)


@pytest.mark.parametrize("max_q, family", [(1, "decode"), (4, "draft"), (32, "varlen")])
def test_config_bucket_family(monkeypatch, max_q, family):
    """Prefill-sized varlen calls look up their own "varlen" buckets (page field 256 by
    convention), falling back to a file's "prefill" buckets; decode-sized ones share decode's."""
    from triton_xpu_attn.ops import paged_launch as pa_mod

    asked = []
    real = tune.lookup

    def recording(op, fields, heuristic, **kw):
        asked.append((fields["q"], fields["p"], kw.get("fallback")))
        return real(op, fields, heuristic, **kw)

    monkeypatch.setattr(pa_mod.tune, "lookup", recording)
    q = torch.randn(2 * max_q, 4, 64, device=DEVICE, dtype=torch.float16)
    k = torch.randn(2 * max_q, 1, 64, device=DEVICE, dtype=torch.float16)
    cu = torch.tensor([0, max_q, 2 * max_q], dtype=torch.int32, device=DEVICE)
    flash_attn_varlen_func(q, k, k, cu, cu, max_q, max_q, causal=True)
    fallback = {"draft": {"q": "decode"}, "varlen": {"q": "prefill"}}.get(family)
    assert asked == [(family, 256, fallback)]


@pytest.mark.gpu
def test_graph_capture_replays_new_lengths_without_host_sync():
    """Captured once, replayed after new values and new request boundaries are written into the
    captured inputs: equal to eager; and no call syncs with the host (CUDA's sync debug mode)."""
    from test_hardening import _capture, _graph_api

    api = _graph_api()
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(96, 8, 128, generator=gen).to(DEVICE, torch.bfloat16)
    k = torch.randn(160, 2, 128, generator=gen).to(DEVICE, torch.bfloat16)
    v = torch.randn(160, 2, 128, generator=gen).to(DEVICE, torch.bfloat16)
    cu_q = torch.tensor([0, 40, 96], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 60, 160], dtype=torch.int32, device=DEVICE)
    call = lambda: flash_attn_varlen_func(q, k, v, cu_q, cu_k, 64, 100, causal=True, return_softmax_lse=True)  # noqa: E731
    graph, (out, lse) = _capture(api, call)
    for new_q, new_k in (([0, 64, 96], [0, 100, 160]), ([0, 10, 70], [0, 20, 150])):
        cu_q.copy_(torch.tensor(new_q, dtype=torch.int32))
        cu_k.copy_(torch.tensor(new_k, dtype=torch.int32))
        q.copy_(torch.randn(96, 8, 128, generator=gen))
        graph.replay()
        api.synchronize()
        expected, expected_lse = call()
        assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    if DEVICE.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
