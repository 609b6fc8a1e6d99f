"""DeepSeek sparse attention decode over paged caches (``flash_mla_with_kvcache``) against the
float64 reference.

Caches come in the three layouts the op reads: rows of q's dtype (DeepSeek-V3.2's 576 channels),
DeepSeek-V4's packed fp8 pages (584-byte view over pages of 576-byte records and UE8M0 scales at
the page end, built here the way upstream's test builds its ``as_strided`` view) and
DeepSeek-V3.2's 656-byte fp8 records. Every case poisons what it can: cache tokens that no counted
entry selects hold NaN (NaN rows, fp8 NaN bytes, NaN scales), tensors the op allocates start NaN
(``torch.empty`` fills them while the op runs), index lists mix valid tokens with -1, other
negatives, out-of-range values and the int32 extremes, and entries past ``topk_length`` name NaN
tokens. Shapes stay tiny under the interpreter.
"""
from __future__ import annotations

import inspect
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import DEVICE, INTERPRET, assert_close, replay_without_host_sync, to_device
from triton_xpu_attn import flash_mla_with_kvcache, get_mla_metadata
from triton_xpu_attn import reference as ref
from triton_xpu_attn import tune
from triton_xpu_attn.ops import mla_sparse_decode as decode_mod

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
HAS_FP8 = hasattr(torch, "float8_e4m3fn")
LAYOUTS = ["plain", "v4", "v32"] if HAS_FP8 else ["plain"]
D_QK = {"plain": 576, "v4": 512, "v32": 576}

#: kernel configs the property test draws from (None: the launcher's own choice); SPLITS forces
#: the split count (split-K partials merged by the combine kernel)
CONFIGS = [
    None,
    dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=4, num_stages=1, SPLITS=1),
    dict(BLOCK_H=16, BLOCK_N=32, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=8, num_stages=2, SPLITS=2),
    dict(BLOCK_H=32, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=8, num_stages=2, SPLITS=3),
    # the Intel tiles: the score dot in 64-channel chunks, 64 output channels a program
    dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=64, BLOCK_DV=64, num_warps=8, num_stages=1, SPLITS=1),
    dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=64, BLOCK_DV=64, num_warps=8, num_stages=1, SPLITS=4),
    # held score pieces, output channels split (V read apart from K)
    dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=128, num_warps=4, num_stages=1, SPLITS=2),
]


@pytest.fixture(autouse=True)
def nan_empty(monkeypatch):
    """Every float tensor ``torch.empty`` makes while a test runs starts NaN: an output element or
    partial the op never writes shows up as NaN."""
    real = torch.empty

    def empty(*args, **kwargs):
        t = real(*args, **kwargs)
        if t.dtype.is_floating_point and t.dtype.itemsize > 1:
            t.fill_(math.nan)
        return t

    monkeypatch.setattr(torch, "empty", empty)


# ---- caches ----


def _page_bytes(page_size: int) -> int:
    """DeepSeek-V4 page: page_size 576-byte records, page_size 8-byte scale records, padded to 576."""
    return page_size * 576 + -(-page_size * 8 // 576) * 576


def pack_fp8(rows: torch.Tensor, layout: str) -> torch.Tensor:
    """``rows [num_pages, page_size, d]`` as a packed fp8 cache view ``[num_pages, page_size, 1, 584 | 656]``
    (float8_e4m3fn) over a uint8 buffer whose unused bytes are 0xFF (NaN in every field)."""
    num_pages, page_size, _ = rows.shape
    nope, tile = (448, 64) if layout == "v4" else (512, 128)
    x = rows.float()
    tiles = x[..., :nope].reshape(num_pages, page_size, nope // tile, tile)
    amax = tiles.abs().amax(-1).clamp_min(1e-4)
    if layout == "v4":
        exponent = torch.ceil(torch.log2(amax / 448.0)).clamp(-120, 120)
        scale = torch.pow(2.0, exponent)
    else:
        scale = amax / 448.0
    fp8 = (tiles / scale[..., None]).reshape(num_pages, page_size, nope).to(torch.float8_e4m3fn).view(torch.uint8)
    rope = x[..., nope:].to(torch.bfloat16).contiguous().view(torch.uint8)
    if layout == "v4":
        raw = torch.full((num_pages, _page_bytes(page_size)), 0xFF, dtype=torch.uint8)
        data = raw[:, : page_size * 576].view(num_pages, page_size, 576)
        data[..., :448], data[..., 448:] = fp8, rope
        scales = raw[:, page_size * 576: page_size * 584].view(num_pages, page_size, 8)
        scales[..., :7] = (exponent + 127).to(torch.uint8)
        view = raw.as_strided((num_pages, page_size, 1, 584), (raw.stride(0), 584, 584, 1))
    else:
        # one spare record per page (the pages are apart by page_size + 1 records)
        raw = torch.full((num_pages, page_size + 1, 656), 0xFF, dtype=torch.uint8)
        data = raw[:, :page_size]
        data[..., :512], data[..., 528:] = fp8, rope
        data[..., 512:528] = scale.float().contiguous().view(torch.uint8).view(num_pages, page_size, 16)
        view = data[:, :, None, :]
    return view.view(torch.float8_e4m3fn)


def poison_tokens(cache: torch.Tensor, layout: str, tokens) -> None:
    """Overwrite whole tokens (flat ``page * page_size + slot``) of a cache with NaN."""
    page_size = cache.shape[1]
    if layout == "plain":
        for t in tokens:
            cache[t // page_size, t % page_size] = math.nan
        return
    raw = cache.view(torch.uint8)
    flat = torch.as_strided(raw, (raw.untyped_storage().nbytes() - raw.storage_offset(),), (1,))
    for t in tokens:
        p, s = divmod(t, page_size)
        if layout == "v4":
            flat[p * raw.stride(0) + s * 576:][:576] = 0xFF
            flat[p * raw.stride(0) + page_size * 576 + s * 8:][:8] = 0xFF
        else:
            flat[p * raw.stride(0) + s * raw.stride(1):][:656] = 0xFF


def make_cache(gen, layout: str, num_pages: int, page_size: int, dtype, strided: bool = False):
    d = D_QK[layout]
    rows = torch.randn(num_pages, page_size, d, generator=gen) * 2
    if layout != "plain":
        return pack_fp8(rows, layout)
    if strided:  # pages and tokens apart in memory (one layer of a wider pool)
        buf = torch.full((num_pages, page_size, 2, d + 8), math.nan, dtype=dtype)
        buf[:, :, 0, :d] = rows.to(dtype)
        return buf[:, :, :1, :d]
    return rows.to(dtype)[:, :, None, :].clone()


def _draw_index(gen, num_tokens: int, wide: bool) -> int:
    kind = int(torch.randint(0, 10, (1,), generator=gen))
    if kind < 6:
        return int(torch.randint(0, num_tokens, (1,), generator=gen))
    big = 2**40 if wide else I32_MAX
    return [-1, -int(torch.randint(2, 1000, (1,), generator=gen)), num_tokens,
            [I32_MIN, I32_MAX, -big, big, num_tokens + 7][int(torch.randint(0, 5, (1,), generator=gen))]][kind - 6]


def make_indices(gen, B, s_q, topk, num_tokens, index_dtype=torch.int32):
    wide = index_dtype == torch.int64
    idx = torch.tensor([_draw_index(gen, num_tokens, wide) for _ in range(B * s_q * topk)], dtype=torch.int64)
    idx = idx.view(B, s_q, topk)
    return (idx.clamp(I32_MIN, I32_MAX) if not wide else idx).to(index_dtype)


def make_lengths(gen, B, topk):
    choices = torch.tensor([-3, 0, topk // 2, topk, topk + 5, I32_MAX, 1, max(topk - 1, 0)])
    return choices[torch.randint(0, len(choices), (B,), generator=gen)].to(torch.int32)


def counted_tokens(indices, lengths, num_tokens):
    """Flat tokens that some counted entry names."""
    B, s_q, topk = indices.shape
    n = torch.full((B,), topk) if lengths is None else lengths.long().clamp(0, topk)
    inside = torch.arange(topk)[None, None, :] < n[:, None, None]
    ok = inside & (indices >= 0) & (indices < num_tokens)
    return set(indices[ok].long().tolist())


def poison_uncounted(cache: torch.Tensor, layout: str, indices, lengths) -> None:
    """NaN in every token of ``cache`` that no counted entry of ``indices`` names."""
    num_tokens = cache.shape[0] * cache.shape[1]
    poison_tokens(cache, layout, sorted(set(range(num_tokens)) - counted_tokens(indices, lengths, num_tokens)))


def make_case(gen, *, B, s_q, h_q, layout, dtype, page_size, num_pages, topk, extra=None, topk_length=False,
              sink=False, index_dtype=torch.int32, strided=False, lonely=False):
    """A problem on the host; every cache token no counted entry names is NaN."""
    d = D_QK[layout]
    q = torch.randn(B, s_q, h_q, d, generator=gen).to(dtype)
    cache = make_cache(gen, layout, num_pages, page_size, dtype, strided)
    n_tok = num_pages * page_size
    idx = make_indices(gen, B, s_q, topk, n_tok, index_dtype)
    if lonely:
        idx[0] = -1
    lengths = make_lengths(gen, B, topk) if topk_length else None
    poison_uncounted(cache, layout, idx, lengths)
    case = dict(q=q, k_cache=cache, indices=idx, topk_length=lengths, layout=layout, attn_sink=None,
                extra_k_cache=None, extra_indices_in_kvcache=None, extra_topk_length=None)
    if sink:
        s = torch.randn(h_q, generator=gen) * 2
        special = torch.rand(h_q, generator=gen)
        s[special < 0.1] = math.inf
        s[(special >= 0.1) & (special < 0.2)] = -math.inf
        case["attn_sink"] = s
    if extra is not None:
        x_pages, x_page_size, x_topk, x_length = extra
        x_cache = make_cache(gen, layout, x_pages, x_page_size, dtype)
        x_tok = x_pages * x_page_size
        x_idx = make_indices(gen, B, s_q, x_topk, x_tok, index_dtype)
        x_len = make_lengths(gen, B, x_topk) if x_length else None
        poison_uncounted(x_cache, layout, x_idx, x_len)
        case.update(extra_k_cache=x_cache, extra_indices_in_kvcache=x_idx, extra_topk_length=x_len)
    return case


_OP_KEYS = ("q", "k_cache", "indices", "attn_sink", "extra_k_cache", "extra_indices_in_kvcache", "topk_length",
            "extra_topk_length")


def run_op(case, sm_scale=None, head_dim_v=512, config=None, **over):
    args = {k: to_device(case[k]) for k in _OP_KEYS}
    args.update(over)
    ctx = tune.override("mla_sparse_decode", config) if config is not None else _null()
    with ctx:
        return flash_mla_with_kvcache(head_dim_v=head_dim_v, softmax_scale=sm_scale,
                                      is_fp8_kvcache=case["layout"] != "plain", **args)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def check_case(case, sm_scale=None, head_dim_v=512, config=None):
    """The op against the reference, every element of both outputs; returns them on the host."""
    q = case["q"]
    B, s_q, h_q, _ = q.shape
    out, lse = run_op(case, sm_scale, head_dim_v, config)
    # DeepSeek-V3.2 records scale fp8 by any fp32 factor: compiled, the key is dequantised into a
    # 16-bit q's dtype (rounded) before the dot, so the reference reads it rounded the same way
    # (V4's UE8M0 scales are powers of two, exact; the interpreter runs 16-bit inputs in fp32)
    caches, fp8 = (case["k_cache"], case["extra_k_cache"]), case["layout"] != "plain"
    if case["layout"] == "v32" and q.dtype != torch.float32 and not INTERPRET:
        caches = tuple(None if c is None else ref.dequantize_fp8_kv_cache(c).to(q.dtype).unsqueeze(2) for c in caches)
        fp8 = False
    exp_out, exp_lse = ref.mla_sparse_decode(
        q, caches[0], case["indices"], head_dim_v, sm_scale, fp8, case["attn_sink"],
        caches[1], case["extra_indices_in_kvcache"], case["topk_length"], case["extra_topk_length"])
    assert out.shape == (B, s_q, h_q, head_dim_v) and out.dtype == q.dtype
    assert lse.shape == (B, h_q, s_q) and lse.dtype == torch.float32
    out, lse = out.cpu(), lse.cpu().double()
    assert not torch.isnan(exp_out).any() and not torch.isnan(out).any(), "NaN in the output"
    assert_close(out, exp_out, q.dtype)
    lonely = torch.isinf(exp_lse)  # [B, h_q, s_q]
    assert torch.all(out.permute(0, 2, 1, 3)[lonely] == 0), "a query with nothing to attend to must give 0"
    assert not torch.isnan(lse).any(), "lse: NaN (unwritten?)"
    assert torch.equal(torch.isinf(lse), lonely) and torch.all(lse[lonely] == math.inf), "lse: +inf pattern"
    err = ((lse - exp_lse).abs() / (1 + exp_lse.abs()))[~lonely]
    assert err.numel() == 0 or err.max() < 2e-4, f"lse: error {err.max():.2e}"
    return out, lse


@given(
    layout=st.sampled_from(LAYOUTS),
    dtype=st.sampled_from([torch.bfloat16, torch.bfloat16, torch.float16, torch.float32]),
    h_q=st.sampled_from([16, 16, 3, 20, 32, 64]),
    s_q=st.integers(1, 2),
    page_size=st.sampled_from([1, 2, 3, 4, 16, 48, 64]),  # powers of two take shifts, the others divisions
    topk_length=st.booleans(),
    sink=st.booleans(),
    with_extra=st.booleans(),
    index_dtype=st.sampled_from([torch.int32, torch.int32, torch.int64]),
    config=st.sampled_from(CONFIGS),
    data=st.data(),
)
def test_sparse_decode_matches_reference(layout, dtype, h_q, s_q, page_size, topk_length, sink, with_extra,
                                         index_dtype, config, data):
    if layout != "plain":
        dtype = torch.bfloat16  # upstream's q dtype with fp8 caches
    B = data.draw(st.integers(1, 3 if h_q <= 20 else 2), label="B")
    num_pages = data.draw(st.integers(1, max(1, 48 // page_size)), label="num_pages")
    topk = data.draw(st.one_of(st.sampled_from([1, 15, 16, 17, 33, 64]), st.integers(1, 70)), label="topk")
    extra = None
    if with_extra:
        extra = (data.draw(st.integers(1, 4), label="x_pages"), data.draw(st.sampled_from([1, 2, 3, 64]), label="x_ps"),
                 data.draw(st.sampled_from([1, 9, 16, 40]), label="x_topk"), data.draw(st.booleans(), label="x_len"))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    case = make_case(gen, B=B, s_q=s_q, h_q=h_q, layout=layout, dtype=dtype, page_size=page_size,
                     num_pages=num_pages, topk=topk, extra=extra, topk_length=topk_length, sink=sink,
                     index_dtype=index_dtype, strided=data.draw(st.booleans(), label="strided"),
                     lonely=data.draw(st.booleans(), label="lonely"))
    head_dim_v = data.draw(st.sampled_from([512, 512, 256]), label="head_dim_v")
    check_case(case, data.draw(st.sampled_from([None, 0.05]), label="sm_scale"), head_dim_v, config)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("s_q", [1, 2])
def test_deepseek_v4_shapes_small(layout, s_q):
    """V4's call as sglang makes it (64 heads, a 256-token page, an extra cache of 64-token pages
    with extra_topk_length, sinks), at small list widths; automatic splits."""
    gen = torch.Generator().manual_seed(s_q)
    case = make_case(gen, B=2, s_q=s_q, h_q=64, layout=layout, dtype=torch.bfloat16, page_size=256, num_pages=1,
                     topk=40, extra=(2, 64, 24, True), topk_length=True, sink=True)
    check_case(case, 512**-0.5 if layout == "v4" else None)


@pytest.mark.parametrize("config, cache", [
    (dict(BLOCK_H=64, BLOCK_N=64, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=8, num_stages=1), "fp8_v4"),
    (dict(BLOCK_H=64, BLOCK_N=64, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=8, num_stages=1), "plain"),
    (dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=64, BLOCK_DV=64, num_warps=8, num_stages=1), "fp8_v4"),
    (dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=128, num_warps=4, num_stages=1), "fp8_v4"),
])
def test_d512_tiles_hold_one_512_wide_piece(config, cache):
    """d_qk 512 has no tail piece, whatever the layout: DeepSeek-V4's held score dot reads its 448
    fp8 channels and 64 rope channels as one 512-wide K tile (the rope its last 64 channels)."""
    from triton_xpu_attn.ops.mla_sparse import sparse_tiles
    with tune.override("mla_sparse_decode", config):
        tiles = sparse_tiles(64, 1, 512, 512, torch.bfloat16, torch.device("cpu"), op="mla_sparse_decode",
                             cache=cache)
    assert (tiles["BLOCK_MAIN"], tiles["BLOCK_TAIL"]) == (512, 0)


@pytest.mark.parametrize("config, cache, refused", [
    (dict(BLOCK_H=64, BLOCK_N=128, SCORE_CHUNK=0, BLOCK_DV=0), "fp8_v4", "at most 64"),
    (dict(BLOCK_H=64, BLOCK_N=32, SCORE_CHUNK=64, BLOCK_DV=0), "fp8_v4", "at least 64"),
    (dict(BLOCK_H=64, BLOCK_N=16, SCORE_CHUNK=64, BLOCK_DV=256), "fp8_v4", "at least 64"),
    (dict(BLOCK_H=128, BLOCK_N=32, SCORE_CHUNK=128, BLOCK_DV=0), "fp8_v32", "at least 64"),
    (dict(BLOCK_H=64, BLOCK_N=32, SCORE_CHUNK=64, BLOCK_DV=0), "plain", None),
    (dict(BLOCK_H=64, BLOCK_N=64, SCORE_CHUNK=64, BLOCK_DV=256), "fp8_v4", None),
    (dict(BLOCK_H=32, BLOCK_N=32, SCORE_CHUNK=64, BLOCK_DV=256), "fp8_v4", None),
    (dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=64, BLOCK_DV=64), "fp8_v32", None),
    (dict(BLOCK_H=64, BLOCK_N=32, SCORE_CHUNK=0, BLOCK_DV=0), "fp8_v4", None),
])
def test_fp8_tiles_sm90_compiles_wrongly_are_refused_on_cuda(monkeypatch, config, cache, refused):
    """On CUDA the fp8-cache tiles that sm_90 compiles to wrong outputs or illegal memory accesses
    raise ``ValueError`` naming ``BLOCK_N`` before anything launches (64 heads x 128 entries; 64+
    heads x 16 / 32 entries with the score dot in chunks); their neighbours, the same tiles over
    bf16 rows and other backends take them."""
    from triton_xpu_attn import device as _device
    from triton_xpu_attn.ops.mla_sparse import sparse_tiles

    d_qk = 512 if cache == "fp8_v4" else 576

    def tiles():
        return sparse_tiles(64, 1, d_qk, 512, torch.bfloat16, torch.device("cpu"), op="mla_sparse_decode",
                            cache=cache)

    with tune.override("mla_sparse_decode", dict(config, num_warps=8, num_stages=1)):
        if _device.backend() != "cuda":
            assert tiles()["BLOCK_N"] == config["BLOCK_N"]
        monkeypatch.setattr(_device, "backend", lambda: "cuda")
        if refused:
            with pytest.raises(ValueError, match=rf"^BLOCK_N must be {refused} for fp8 caches on CUDA"):
                tiles()
        else:
            assert tiles()["BLOCK_N"] == config["BLOCK_N"]


# ---- hand examples ----


def test_fp8_dequantisation_by_hand():
    """One V4 token and one V3.2 token with chosen bytes: fp8 e4m3 values (normal, subnormal,
    negative) times their tile scale, and the bf16 rope channels, as the reference and the op read
    them (d_v 512 with one token: out = V)."""
    for layout in LAYOUTS[1:]:
        rows = torch.zeros(1, 1, D_QK[layout])
        cache = pack_fp8(rows, layout)
        raw = cache.view(torch.uint8)
        flat = torch.as_strided(raw, (raw.untyped_storage().nbytes() - raw.storage_offset(),), (1,))
        # channel 0: 0x38 = 1.0; channel 1: 0x01 = 2^-9 (subnormal); channel 2: 0xC4 = -3.0 (1.5 * 2^1, negative)
        flat[0:3] = torch.tensor([0x38, 0x01, 0xC4], dtype=torch.uint8)
        rope_at = 448 if layout == "v4" else 528
        flat[rope_at: rope_at + 2] = torch.tensor([1.5], dtype=torch.bfloat16).view(torch.uint8)
        if layout == "v4":
            flat[576] = 127 + 3  # tile 0 scale 2^3
            expected = {0: 8.0, 1: 2.0**-6, 2: -24.0, 448: 1.5}
        else:
            flat[512:516] = torch.tensor([0.25]).view(torch.uint8)
            expected = {0: 0.25, 1: 2.0**-11, 2: -0.75, 512: 1.5}
        deq = ref.dequantize_fp8_kv_cache(cache)[0, 0]
        for c, v in expected.items():
            assert deq[c].item() == v, (layout, c, deq[c].item(), v)
        q = torch.zeros(1, 1, 16, D_QK[layout], dtype=torch.bfloat16)
        out, lse = flash_mla_with_kvcache(to_device(q), to_device(cache), None, None, 512, None, None, 1.0, False, True,
                                          to_device(torch.tensor([[[0, -1]]], dtype=torch.int32)))
        got = out[0, 0, 0].cpu().double()
        for c, v in expected.items():
            if c < 512:
                assert got[c].item() == v, (layout, c, got[c].item(), v)
        assert torch.all(lse.cpu() == 0.0)  # one key, logit 0


def test_extra_cache_joins_the_softmax_by_hand():
    """Two tokens in k_cache, one in the extra cache: one softmax over all three."""
    d = 16
    kc = torch.zeros(1, 2, 1, d)
    kc[0, 0, 0, 0], kc[0, 1, 0, 1] = 1.0, 1.0
    xk = torch.full((2, 1, 1, d), math.nan)
    xk[1, 0, 0] = 0.0
    xk[1, 0, 0, 2] = 1.0
    q = torch.zeros(1, 1, 1, d)
    q[..., 0], q[..., 2] = 2.0, 1.0  # logits: k0 2, k1 0, extra token 1: 1
    out, lse = flash_mla_with_kvcache(to_device(q), to_device(kc), None, None, 8, None, None, 1.0,
                                      indices=to_device(torch.tensor([[[0, 1, 5, -1]]], dtype=torch.int32)),
                                      extra_k_cache=to_device(xk),
                                      extra_indices_in_kvcache=to_device(torch.tensor([[[1, 2, -7]]],
                                                                                      dtype=torch.int32)))
    z = torch.tensor([2.0, 0.0, 1.0], dtype=torch.float64)
    w = torch.softmax(z, 0)
    assert math.isclose(lse.item(), torch.logsumexp(z, 0).item(), rel_tol=1e-6)
    assert torch.allclose(out[0, 0, 0, :3].cpu().double(), w, atol=1e-6)
    assert torch.all(out[0, 0, 0, 3:].cpu() == 0)


# ---- semantics ----


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("splits", [1, 3])
def test_queries_without_a_valid_entry(layout, splits):
    """Every way of having nothing to attend to gives out 0 and lse +inf (sinks notwithstanding),
    never NaN; the other queries are unaffected."""
    gen = torch.Generator().manual_seed(5)
    case = make_case(gen, B=5, s_q=2, h_q=16, layout=layout, dtype=torch.bfloat16, page_size=4, num_pages=3,
                     topk=20, extra=(2, 2, 6, False), sink=True)
    n_tok = 12
    idx = case["indices"]
    idx[0] = -1
    idx[1] = torch.tensor([I32_MIN, I32_MAX, n_tok, -2, n_tok + 100] * 4)
    idx[2, 0] = -1
    case["topk_length"] = torch.tensor([20, 20, 20, 0, 20], dtype=torch.int32)
    x_idx = case["extra_indices_in_kvcache"]
    x_idx[:4] = -1  # batches 0-3 have no extra entry; batch 4 keeps its own
    case["extra_topk_length"] = torch.tensor([6, 6, 6, 6, 6], dtype=torch.int32)
    poison_uncounted(case["k_cache"], layout, idx, case["topk_length"])
    config = dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=4, num_stages=1, SPLITS=splits)
    out, lse = check_case(case, 0.05, config=config)
    assert torch.all(out[:2] == 0) and torch.all(out[3] == 0) and torch.all(out[2, 0] == 0)
    assert torch.all(lse[:2] == math.inf) and torch.all(lse[3] == math.inf) and torch.all(lse[2, :, 0] == math.inf)
    assert torch.isfinite(lse[2, :, 1]).all() and torch.isfinite(lse[4]).all()


def test_split_count_does_not_change_the_result():
    """1, 2, 3, 4 and the automatic split count agree (to fp32 rounding of the merge)."""
    gen = torch.Generator().manual_seed(11)
    case = make_case(gen, B=1, s_q=2, h_q=16, layout="plain", dtype=torch.float32, page_size=2, num_pages=40,
                     topk=70, extra=(3, 4, 30, True), topk_length=True, sink=True)
    base = None
    for splits in (1, 2, 3, 4, 0):
        config = dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=4, num_stages=1, SPLITS=splits)
        out, lse = check_case(case, 0.05, config=config)
        if base is None:
            base = (out, lse)
        assert torch.allclose(out, base[0], atol=1e-5) and torch.allclose(lse, base[1], atol=1e-5)


def test_nan_in_a_selected_row_is_not_dropped_by_the_combine():
    """A cache token holding NaN that token 0's list names reaches token 0's output however the
    list is split (the combine merges the split that read it, not only its LSE); token 1, which
    does not name it, keeps the reference's result."""
    gen = torch.Generator().manual_seed(17)
    case = make_case(gen, B=2, s_q=1, h_q=16, layout="plain", dtype=torch.float32, page_size=2, num_pages=40,
                     topk=48)
    idx = case["indices"]
    bad = int(idx[0, 0, 40])
    assert 0 <= bad < 80
    idx[1][idx[1] == bad] = -1
    poisoned = dict(case, k_cache=case["k_cache"].clone())
    poison_tokens(poisoned["k_cache"], "plain", [bad])
    exp_out, _ = ref.mla_sparse_decode(case["q"], case["k_cache"], idx, 512, 0.05, False)
    for splits in (1, 2, 3, 4):
        config = dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=4, num_stages=1, SPLITS=splits)
        out, _ = run_op(poisoned, 0.05, config=config)
        out = out.cpu()
        assert torch.isnan(out[0]).all(), f"{splits} splits: the NaN token was dropped"
        assert_close(out[1], exp_out[1], torch.float32)


def two_list_cases(seed, layout, lengths):
    """Two-request problems over a main and an extra cache whose first request counts ``n_main`` /
    ``n_extra`` entries of its lists (40 / 33 listed), for each ``(n_main, n_extra)`` of
    ``lengths``; every cache token no counted entry names holds NaN."""
    gen = torch.Generator().manual_seed(seed)
    for n_main, n_extra in lengths:
        case = make_case(gen, B=2, s_q=1, h_q=16, layout=layout, page_size=2, num_pages=24, topk=40,
                         dtype=torch.bfloat16 if layout != "plain" else torch.float32, extra=(4, 4, 33, False))
        case["topk_length"] = torch.tensor([n_main, 40 - n_main], dtype=torch.int32)
        case["extra_topk_length"] = torch.tensor([n_extra, 33], dtype=torch.int32)
        poison_uncounted(case["k_cache"], layout, case["indices"], case["topk_length"])
        poison_uncounted(case["extra_k_cache"], layout, case["extra_indices_in_kvcache"], case["extra_topk_length"])
        yield case


@pytest.mark.parametrize("layout", ["plain", "v4"])
def test_splits_across_the_two_lists(layout):
    """The kernel walks the main list's tiles, then the extra list's: a split's share of the joined
    list may end, start or lie inside either, the main list may end mid-tile or be empty, the extra
    one too. Counted lengths 0 / 1 / 15-17 against 16-entry tiles, 1 to 4 splits: the reference's
    result each time (uncounted cache tokens of either list hold NaN)."""
    for case in two_list_cases(5, layout, ((0, 33), (17, 0), (1, 17), (16, 1), (15, 33), (40, 16))):
        for splits in (1, 2, 3, 4):
            config = dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=4, num_stages=1, SPLITS=splits)
            check_case(case, 0.05, config=config)


@pytest.mark.parametrize("layout", ["plain", "v4"])
def test_entries_loaded_a_tile_ahead(layout):
    """``prefetch_from_tiles``: walks of at least that many tiles load each tile's index entries
    while the tile before it is worked on; across both lists, mid-tile ends and splits, the result
    is the reference's (uncounted cache tokens hold NaN)."""
    for case in two_list_cases(23, layout, ((15, 33), (40, 16), (0, 33), (17, 0))):
        for splits in (1, 3):
            config = dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=4, num_stages=1, SPLITS=splits,
                          prefetch_from_tiles=1)
            check_case(case, 0.05, config=config)


@pytest.mark.parametrize("combine_elements", [2048, 32])
def test_combine_block_covers_rows_and_blocks(monkeypatch, combine_elements):
    """The combine merges whole rows where splits are few (one program a token and head) and
    channel blocks where they are many; both give the unsplit result."""
    assert decode_mod._combine_block_dv(512, 2) == 512 and decode_mod._combine_block_dv(512, 4) == 512
    assert decode_mod._combine_block_dv(512, 32) == 64 and decode_mod._combine_block_dv(512, 64) == 32
    assert decode_mod._combine_block_dv(40, 2) == 64 and decode_mod._combine_block_dv(16, 2048) == 16
    monkeypatch.setattr(decode_mod, "COMBINE_ELEMENTS", combine_elements)
    gen = torch.Generator().manual_seed(12)
    case = make_case(gen, B=2, s_q=1, h_q=16, layout="plain", dtype=torch.float32, page_size=4, num_pages=30,
                     topk=50, extra=None, topk_length=False, sink=True)
    blocks = []
    real = decode_mod._sparse_combine_kernel

    class Spy:
        def __getitem__(self, grid):
            blocks.append(grid[2])
            return real[grid]

    monkeypatch.setattr(decode_mod, "_sparse_combine_kernel", Spy())
    results = []
    for splits in (1, 4):
        config = dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=4, num_stages=1, SPLITS=splits)
        results.append(check_case(case, 0.05, config=config))
    assert blocks == [1 if combine_elements == 2048 else 512 // 16], blocks  # splits 4: 2048 / 4, 32 / 4 -> 16
    assert torch.allclose(results[0][0], results[1][0], atol=1e-5)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-5)


def test_split_plan():
    """Splits only where the grid is thin; at most MAX_SPLITS, whole key tiles each."""
    assert decode_mod._splits(1000, 2048, 32, 132, 0) == (1, 32)
    splits, length = decode_mod._splits(2, 2048 + 512, 32, 132, 0)
    assert 1 < splits <= decode_mod.MAX_SPLITS and length % 32 == 0 and splits * length >= 2560
    assert decode_mod._splits(2, 40, 16, 132, 0)[0] == 1  # too short to split
    assert decode_mod._splits(2, 40, 16, 132, 3) == (3, 16)
    assert decode_mod._splits(2, 0, 16, 132, 0) == (1, 16)
    # a config's waves: programs per compute unit the split count aims at
    assert decode_mod._splits(200, 2048, 32, 132, 0, waves=1) == (1, 32)
    assert decode_mod._splits(100, 2048, 32, 132, 0)[0] == 2  # 200 programs: within 2 x 132
    assert decode_mod._splits(64, 2048, 32, 132, 0, waves=1)[0] == 2  # 128 programs, not 192
    # a config's min_split_tokens: the shortest split (640 entries: 3 of >= 256; of 64-entry tiles, 5 of 128 within 132 programs or 10 of 64)
    assert decode_mod._splits(16, 640, 64, 132, 0, waves=1)[0] == 3
    assert decode_mod._splits(16, 640, 64, 132, 0, waves=1, min_entries=64) == (5, 128)  # whole tiles
    assert decode_mod._splits(1, 640, 64, 132, 0, waves=1, min_entries=64) == (10, 64)
    assert decode_mod._splits(1, 640, 64, 132, 0, waves=1, min_entries=16) == (10, 64)
    assert decode_mod._splits(16, 2048, 32, 132, 0, waves=1)[0] == 8


# ---- dense path (block_table + cache_seqlens) ----


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s_q", [1, 2])
def test_dense_path_matches_reference(causal, s_q):
    """Through flash_mla_decode: FlashMLA's layout ([B, h_q, s_q] lse, +inf for a query without
    keys), causal honoured for s_q > 1; pages past each length hold NaN."""
    gen = torch.Generator().manual_seed(3 + s_q)
    B, h_q, page, pages = 3, 16, 4, 4
    cache = torch.full((12, page, 1, 576), math.nan)
    table = torch.randperm(12, generator=gen)[: B * pages].view(B, pages).to(torch.int32)
    lens = torch.tensor([13, 0, 1], dtype=torch.int32)
    for b in range(B):
        for j in range(int(lens[b])):
            cache[table[b, j // page], j % page] = torch.randn(1, 576, generator=gen)
    q = torch.randn(B, s_q, h_q, 576, generator=gen)
    out, lse = flash_mla_with_kvcache(to_device(q), to_device(cache), to_device(table), to_device(lens), 512,
                                      None, None, 0.07, causal)
    exp_out, exp_lse = ref.mla_decode(q[..., :512], q[..., 512:], cache, lens, table, 0.07, causal=causal)
    exp_lse = torch.where(exp_lse == -math.inf, math.inf, exp_lse).transpose(1, 2)
    assert out.shape == (B, s_q, h_q, 512) and lse.shape == (B, h_q, s_q)
    assert_close(out.cpu(), exp_out, torch.float32)
    assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(exp_lse))
    assert torch.allclose(lse.cpu().double()[~torch.isinf(exp_lse)], exp_lse[~torch.isinf(exp_lse)], atol=1e-4)
    assert torch.all(out[1].cpu() == 0) and torch.all(lse[1].cpu() == math.inf)


# ---- scheduler metadata, placeholders ----


def test_get_mla_metadata_placeholder_is_honoured():
    gen = torch.Generator().manual_seed(1)
    case = make_case(gen, B=1, s_q=1, h_q=16, layout="plain", dtype=torch.float32, page_size=2, num_pages=4,
                     topk=5)
    meta, second = get_mla_metadata(torch.zeros(1), 16, 1)  # the older arguments are accepted and unused
    assert second is None and not meta.have_initialized
    first = run_op(case, tile_scheduler_metadata=meta)
    assert meta.have_initialized
    again = run_op(case, tile_scheduler_metadata=meta)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(first, again))
    wider = make_case(gen, B=1, s_q=1, h_q=16, layout="plain", dtype=torch.float32, page_size=2, num_pages=4,
                      topk=6)
    with pytest.raises(ValueError, match=r"^tile_scheduler_metadata\b"):
        run_op(wider, tile_scheduler_metadata=meta)


def _valid():
    gen = torch.Generator().manual_seed(0)
    case = make_case(gen, B=2, s_q=1, h_q=4, layout="plain", dtype=torch.float32, page_size=2, num_pages=3, topk=3)
    return {k: case[k] for k in ("q", "k_cache", "indices")}


_V4 = (lambda: pack_fp8(torch.zeros(2, 2, 512), "v4")) if HAS_FP8 else None


@pytest.mark.parametrize(
    "change, error, name",
    [
        (dict(q=torch.zeros(2, 1, 4, 576, dtype=torch.int32)), TypeError, "q"),
        (dict(q=torch.zeros(2, 4, 576)), ValueError, "q"),
        (dict(q=torch.zeros(2, 1, 4, 20)), ValueError, "q"),
        (dict(k_cache=torch.zeros(3, 2, 1, 576, dtype=torch.float16)), TypeError, "k_cache"),
        (dict(k_cache=torch.zeros(3, 2, 576)), ValueError, "k_cache"),
        (dict(k_cache=torch.zeros(3, 2, 2, 576)), ValueError, "k_cache"),
        (dict(k_cache=torch.zeros(3, 2, 1, 512)), ValueError, "k_cache"),
        # (made on the test's device: a copy to a GPU would be contiguous)
        (dict(k_cache=lambda dev: torch.zeros(3, 2, 1, 1152, device=dev)[..., ::2]), ValueError, "k_cache"),
        (dict(is_fp8_kvcache=True), TypeError, "k_cache"),  # fp32 cache with is_fp8_kvcache
        (dict(is_fp8_kvcache="yes"), TypeError, "is_fp8_kvcache"),
        (dict(indices=torch.zeros(2, 1, 3)), TypeError, "indices"),
        (dict(indices=torch.zeros(2, 2, 3, dtype=torch.int32)), ValueError, "indices"),
        (dict(indices=torch.zeros(2, 3, dtype=torch.int32)), ValueError, "indices"),
        (dict(topk_length=torch.zeros(3, dtype=torch.int32)), ValueError, "topk_length"),
        (dict(topk_length=torch.zeros(2)), TypeError, "topk_length"),
        (dict(attn_sink=torch.zeros(3)), ValueError, "attn_sink"),
        (dict(attn_sink=torch.zeros(4, dtype=torch.int32)), TypeError, "attn_sink"),
        (dict(extra_k_cache=torch.zeros(3, 2, 1, 576)), ValueError, "extra_indices_in_kvcache"),
        (dict(extra_indices_in_kvcache=torch.zeros(2, 1, 3, dtype=torch.int32)), ValueError, "extra_k_cache"),
        (dict(extra_k_cache=torch.zeros(3, 2, 1, 512), extra_indices_in_kvcache=torch.zeros(2, 1, 3, dtype=torch.int32)),
         ValueError, "extra_k_cache"),
        (dict(extra_k_cache=torch.zeros(3, 2, 1, 576), extra_indices_in_kvcache=torch.zeros(2, 2, 3, dtype=torch.int32)),
         ValueError, "extra_indices_in_kvcache"),
        (dict(extra_topk_length=torch.zeros(2, dtype=torch.int32)), ValueError, "extra_topk_length"),
        (dict(head_dim_v=600), ValueError, "head_dim_v"),
        (dict(head_dim_v=12), ValueError, "head_dim_v"),
        (dict(head_dim_v=512.0), TypeError, "head_dim_v"),
        (dict(softmax_scale="0.1"), TypeError, "softmax_scale"),
        (dict(softmax_scale=math.nan), ValueError, "softmax_scale"),
        (dict(num_splits=torch.zeros(3, dtype=torch.int32)), ValueError, "num_splits"),
        (dict(tile_scheduler_metadata=torch.zeros(4, 8, dtype=torch.int32)), ValueError, "tile_scheduler_metadata"),
        (dict(tile_scheduler_metadata="meta"), TypeError, "tile_scheduler_metadata"),
        (dict(causal=True), ValueError, "causal"),
        (dict(causal=1), TypeError, "causal"),
        (dict(block_table=torch.zeros(2, 3, dtype=torch.int32)), ValueError, "block_table"),
        (dict(indices=None), ValueError, "indices"),
        (dict(indices=None, block_table=torch.zeros(2, 3, dtype=torch.int32)), ValueError, "cache_seqlens"),
        (dict(indices=None, block_table=torch.zeros(2, 3, dtype=torch.int32),
              cache_seqlens=torch.zeros(2, dtype=torch.int32), attn_sink=torch.zeros(4)), ValueError, "attn_sink"),
        (dict(indices=None, block_table=torch.zeros(2, 3, dtype=torch.int32),
              cache_seqlens=torch.zeros(3, dtype=torch.int32)), ValueError, "cache_seqlens"),
        (dict(indices=None, block_table=torch.zeros(2, 3, dtype=torch.int32),
              cache_seqlens=torch.zeros(2, dtype=torch.int32), is_fp8_kvcache=True), ValueError, "is_fp8_kvcache"),
        (dict(indices=torch.zeros(2, 1, 3, dtype=torch.int32, device="meta")), ValueError, "indices"),
    ] + ([
        (dict(q=torch.zeros(2, 1, 4, 576), k_cache="v4", is_fp8_kvcache=True), ValueError, "k_cache"),
        (dict(q=torch.zeros(2, 1, 4, 512), k_cache="v4", is_fp8_kvcache=True, head_dim_v=520), ValueError,
         "head_dim_v"),
        (dict(q=torch.zeros(2, 1, 4, 512), k_cache="v4", is_fp8_kvcache=True,
              extra_k_cache=torch.zeros(3, 2, 1, 512), extra_indices_in_kvcache=torch.zeros(2, 1, 3, dtype=torch.int32)),
         TypeError, "extra_k_cache"),
    ] if HAS_FP8 else []),
)
def test_bad_input_names_the_argument(change, error, name):
    args = _valid()
    args.update(change)
    if isinstance(args.get("k_cache"), str):
        args["k_cache"] = _V4()
    args = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) and not v.is_meta else v) for k, v in args.items()}
    args = {k: (v(DEVICE) if callable(v) else v) for k, v in args.items()}
    with pytest.raises(error, match=rf"^{name}\b"):
        flash_mla_with_kvcache(**args)


def test_empty_batch_and_empty_lists():
    gen = torch.Generator().manual_seed(2)
    case = make_case(gen, B=2, s_q=2, h_q=16, layout="plain", dtype=torch.float32, page_size=2, num_pages=2, topk=3)
    out, lse = run_op({**case, "q": case["q"][:0], "indices": case["indices"][:0]})
    assert out.shape == (0, 2, 16, 512) and lse.shape == (0, 16, 2)
    out, lse = run_op({**case, "indices": case["indices"][:, :, :0]})
    assert torch.all(out.cpu() == 0) and torch.all(lse.cpu() == math.inf)


# ---- custom op, compat modules ----


def _op_args():
    gen = torch.Generator().manual_seed(4)
    case = make_case(gen, B=2, s_q=2, h_q=16, layout="plain", dtype=torch.float32, page_size=2, num_pages=6,
                     topk=19, extra=(2, 4, 7, True), topk_length=True, sink=True)
    return (to_device(case["q"]), to_device(case["k_cache"])), dict(
        softmax_scale=0.05, indices=to_device(case["indices"]), attn_sink=to_device(case["attn_sink"]),
        extra_k_cache=to_device(case["extra_k_cache"]),
        extra_indices_in_kvcache=to_device(case["extra_indices_in_kvcache"]),
        topk_length=to_device(case["topk_length"]), extra_topk_length=to_device(case["extra_topk_length"]))


def test_custom_op_opcheck_and_equals_the_function(monkeypatch):
    from triton_xpu_attn import custom_ops as C

    monkeypatch.undo()  # opcheck's own tensors: plain torch.empty
    args, kwargs = _op_args()
    result = torch.library.opcheck(C.flash_mla_with_kvcache, args, kwargs)
    assert all(v == "SUCCESS" for v in result.values()), result
    expected = flash_mla_with_kvcache(*args, **kwargs)
    got = torch.ops.triton_xpu_attn.flash_mla_with_kvcache(*args, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert "flash_mla_with_kvcache" in C.OPS


def test_sgl_kernel_compat_names():
    import triton_xpu_attn
    from triton_xpu_attn.compat import sgl_kernel
    from triton_xpu_attn.compat.sgl_kernel import attention, flash_mla

    assert sgl_kernel.flash_mla_with_kvcache is flash_mla_with_kvcache is triton_xpu_attn.flash_mla_with_kvcache
    assert attention.flash_mla_with_kvcache is flash_mla_with_kvcache
    assert flash_mla.flash_mla_with_kvcache is flash_mla_with_kvcache and flash_mla.get_mla_metadata is get_mla_metadata
    assert "flash_mla_with_kvcache" in sgl_kernel.__all__ and "flash_mla_with_kvcache" in attention.__all__
    # sgl-kernel-xpu's (and FlashMLA's) parameters, in order, with its defaults
    params = inspect.signature(flash_mla_with_kvcache).parameters
    assert list(params) == [
        "q", "k_cache", "block_table", "cache_seqlens", "head_dim_v", "tile_scheduler_metadata", "num_splits",
        "softmax_scale", "causal", "is_fp8_kvcache", "indices", "attn_sink", "extra_k_cache",
        "extra_indices_in_kvcache", "topk_length", "extra_topk_length"]
    assert params["head_dim_v"].default == 512 and params["causal"].default is False
    assert all(params[n].default is None for n in ("block_table", "cache_seqlens", "tile_scheduler_metadata",
                                                   "num_splits", "softmax_scale", "indices"))


# ---- GPU: DeepSeek sizes, graphs ----


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("B, s_q, h_q", [(1, 1, 64), (4, 2, 128), (33, 1, 16)])
def test_sparse_decode_deepseek_sizes(layout, B, s_q, h_q):
    """2048-entry lists over 64-token pages (bf16 / V3.2) or V4's 256-token pages with a
    512-entry extra cache; the reference on the host over the selected tokens."""
    gen = torch.Generator().manual_seed(B + h_q)
    page = 256 if layout == "v4" else 64
    num_pages = 40
    topk = 2048 if layout != "v4" else 128
    q = torch.randn(B, s_q, h_q, D_QK[layout], generator=gen).to(torch.bfloat16)
    cache = make_cache(gen, layout, num_pages, page, torch.bfloat16)
    n_tok = num_pages * page
    idx = torch.stack([torch.randperm(n_tok, generator=gen)[:topk] for _ in range(B * s_q)]).view(B, s_q, topk)
    idx = idx.to(torch.int32)
    idx[:, :, -50:] = -1
    case = dict(q=q, k_cache=cache, indices=idx, layout=layout, topk_length=None, extra_k_cache=None,
                extra_indices_in_kvcache=None, extra_topk_length=None,
                attn_sink=torch.randn(h_q, generator=gen))
    if layout == "v4":
        x_cache = make_cache(gen, layout, 20, 64, torch.bfloat16)
        x_idx = torch.stack([torch.randperm(1280, generator=gen)[:512] for _ in range(B * s_q)]).view(B, s_q, 512)
        case.update(extra_k_cache=x_cache, extra_indices_in_kvcache=x_idx.to(torch.int32),
                    extra_topk_length=torch.randint(0, 513, (B,), generator=gen, dtype=torch.int32),
                    topk_length=torch.randint(0, topk + 1, (B,), generator=gen, dtype=torch.int32))
    check_case(case, None)


@pytest.mark.gpu
def test_sparse_decode_graph_replay_without_host_sync(monkeypatch):
    """Captured in a device graph (split-K path included), replayed with new values, no host sync."""
    monkeypatch.undo()
    api = torch.cuda if torch.cuda.is_available() else torch.xpu
    gen = torch.Generator().manual_seed(9)
    B, s_q, h_q = 2, 2, 64
    case = make_case(gen, B=B, s_q=s_q, h_q=h_q, layout="v4" if HAS_FP8 else "plain", dtype=torch.bfloat16,
                     page_size=64, num_pages=8, topk=300, extra=(4, 64, 100, True), topk_length=True, sink=True)
    dev = {k: to_device(v) for k, v in case.items()}

    def run():
        return flash_mla_with_kvcache(dev["q"], dev["k_cache"], None, None, 512, None, None, None, False,
                                      case["layout"] != "plain", dev["indices"], dev["attn_sink"],
                                      dev["extra_k_cache"], dev["extra_indices_in_kvcache"], dev["topk_length"],
                                      dev["extra_topk_length"])

    from test_hardening import _capture

    graph, outputs = _capture(api, run)
    dev["q"].copy_(torch.randn(dev["q"].shape, device=DEVICE).to(dev["q"].dtype))
    dev["topk_length"].copy_(dev["topk_length"] // 2)  # fewer entries: never a poisoned token
    replay_without_host_sync(api, graph)
    assert all(torch.equal(a, b) for a, b in zip(outputs, run()))
