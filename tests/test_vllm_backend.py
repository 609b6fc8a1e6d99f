"""vLLM 0.33.0's own XPU attention code (the PyPI wheel's Python files, unedited) running on
triton_xpu_attn through ``triton_xpu_attn.compat.install()`` as ``vllm_xpu_kernels``: the XPU
platform's backend selection, ``FlashAttentionBackend`` (``FlashAttentionMetadataBuilder.build``,
``FlashAttentionImpl.do_kv_cache_update`` -> ``reshape_and_cache_flash``, ``FlashAttentionImpl.forward``),
``XPUFlashAttnMLABackend`` (``XPUFlashAttnMLAMetadataBuilder.build``, ``do_kv_cache_update`` ->
``concat_and_cache_mla``, ``forward_mqa`` decode over the 576/512 latent cache, ``forward_mha``
prefill with context chunks gathered by ``gather_and_maybe_dequant_cache`` and merged) and DeepSeek
sparse attention: the DSA indexer (``DeepseekV32IndexerMetadataBuilder.build``,
``SparseAttnIndexer.forward_xpu`` -> ``torch.ops.vllm.sparse_attn_indexer``: ``indexer_k_quant_and_cache``,
``cp_gather_indexer_k_quant_cache``, ``torch.ops.vllm.xpu_fp8_mqa_logits`` /
``xpu_fp8_paged_mqa_logits`` -> ``_xpu_C.fp8_mqa_logits`` / ``fp8_paged_mqa_logits``,
``_C.top_k_per_row_prefill`` / ``_decode``) and ``XPU_MLA_SPARSE`` (``XPUMLASparseMetadataBuilder.build``,
``do_kv_cache_update`` -> ``concat_and_cache_mla``, ``forward_mqa`` over the indexer's top-k). Outputs
against the float64 reference over each request's logical token sequence (NaN in every cache slot
no request owns, outputs NaN-filled first); the indexer's top-k against float64 logits over its
cache dequantised from the bytes, as sets per row (ties within rounding either way). A spy records
which of our ops ran.

Driven: FlashAttention decode, chunked prefill (prefix + new tokens), a mixed batch, sliding window,
sinks (``s_aux``), softcap, ALiBi slopes, fp8 KV (e4m3, uint8 cache) with k/v scales, both physical cache layouts,
encoder self-attention without paging (with and without a window); XPUFlashAttnMLA decode, prefill
with and without context (a context split into two chunks, one continuation, one request without
context) and a mixed decode + prefill batch; the DSA indexer and XPU_MLA_SPARSE on decode, prefill
with context (one indexer chunk of several requests) and a mixed batch, rows longer and shorter than
``index_topk``; the indexer's prefill split into per-request, one-row chunks that reuse a gathered
request (``skip_kv_gather``); the indexer cache's bytes.

Not driven, and why: DeepSeek-V3.2's ``Indexer`` layer (projections, norm, rope, the fp8 query
quantisation: model code, its file's import chain reaches the weight loaders): the tests give
``SparseAttnIndexer`` the fp8 queries, keys and folded weights that layer passes; XPU_MLA_SPARSE's
attention is vLLM's own Triton kernel (vllm/v1/attention/ops/xpu_mla_sparse.py), as on XPU; an
indexer prefill split by the gather workspace (more than 16 x ``max_model_len`` context rows);
speculative decode (``next_n > 1``: the compat top-k's forms are tested in tests/test_topk.py);
the CUDA/ROCm-only indexer paths (mxfp4 cache, DCP/PCP merges, TP row sharding, candidate blocks);
fp8 MLA caches (vLLM's ``XPUFlashAttnMLAImpl`` and ``XPUMLASparseImpl`` raise
``NotImplementedError`` for them); DCP (the XPU MLA backend refuses it; FlashAttention's needs a
process group); graph capture; fp8 queries (the XPU backend never quantises queries:
``flash_attn_supports_quant_query_input`` is False there).
On XPU vLLM merges context chunks with its own Triton ``merge_attn_states``
(vllm/v1/attention/ops/triton_merge_attn_states.py), not ``torch.ops._C.merge_attn_states``; the
merge runs here as vLLM runs it.

Environment: ``.ci/vllm_env.sh`` builds the site folder; ``TRITON_XPU_ATTN_VLLM_SITE`` names it (CI
sets it). Without it these tests skip.

What is real: vLLM's ``XPUPlatform`` (backend selection), ``VllmConfig`` (defaults), the KV-cache
specs, ``CommonAttentionMetadata``, the metadata builders, the impls, the MLA prefill backend vLLM
selects on XPU (``FlashAttnPrefillBackend``, through ``get_mla_prefill_backend``), ``SparseAttnIndexer``
and its op, vLLM's forward context and workspace manager, ``vllm._xpu_ops`` and ``vllm._custom_ops``.
Stand-ins: the model config (a class with the fields the builders read), the attention layer (a
namespace with the q/k/v scales; for MLA the fields the builder reads and the prefill backend),
``kv_b_proj`` (a linear module), the indexer's key-cache layer (its ``prefix`` and ``kv_cache``),
the platform's host facts (pinned memory, device name, compute units, the dispatch key of vLLM's
ops), ``torch.accelerator.empty_cache`` on a host without an accelerator, and the stubbed server
modules (tests/vllm_harness.py ``STUBS``, each with why).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import vllm_harness
from conftest import DEVICE, INTERPRET
from helpers import assert_close
from triton_xpu_attn import reference

pytestmark = pytest.mark.skipif(
    vllm_harness.site_dir() is None,
    reason=f"vLLM 0.33.0 site folder not built: run .ci/vllm_env.sh and set {vllm_harness.SITE_ENV}",
)

DTYPE = torch.float16
BLOCK = 64  # vLLM's XPU backends ask for block sizes that are multiples of 64


@pytest.fixture
def vl():
    """vLLM's modules; the stubs answer imports for the test's duration only."""
    with vllm_harness.stubbed():
        yield vllm_harness.load_vllm()


@pytest.fixture
def ops_run(monkeypatch):
    """Names of our ops the engine reached (wrapping the package functions compat calls)."""
    import triton_xpu_attn
    from triton_xpu_attn.ops import indexer_cache, kv_cache_gather, kv_cache_store, mqa_logits, paged_latent, topk

    ran = []
    for module, names in (
        (triton_xpu_attn, ("flash_attn_with_kvcache", "flash_attn_varlen_func", "flash_mla_decode", "flash_mla_prefill")),
        # flash_attn_with_kvcache's latent route (vLLM's MLA layout) onto the MLA kernels
        (paged_latent, ("flash_mla_decode", "flash_mla_prefill")),
        (kv_cache_store, ("reshape_and_cache_flash", "concat_and_cache_mla")),
        (kv_cache_gather, ("gather_and_maybe_dequant_cache",)),
        # the DSA indexer: its key cache, logits and top-k
        (indexer_cache, ("indexer_k_quant_and_cache", "cp_gather_indexer_k_quant_cache")),
        (mqa_logits, ("fp8_mqa_logits", "fp8_paged_mqa_logits")),
        (topk, ("fast_topk_v2",)),
    ):
        for name in names:
            real = getattr(module, name)

            def spy(*args, _real=real, _name=name, **kwargs):
                ran.append(_name)
                return _real(*args, **kwargs)

            monkeypatch.setattr(module, name, spy)
    return ran


def _block_table(seq_lens, num_blocks, generator):
    """Each request's blocks, shuffled across the cache (block ids are vLLM's ``block_table``)."""
    need = [-(-n // BLOCK) for n in seq_lens]
    perm = torch.randperm(num_blocks, generator=generator)
    table = torch.zeros(len(seq_lens), max(need), dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[at : at + n]
        at += n
    return table


def _slots(table, b, start, stop):
    j = torch.arange(start, stop)
    return table[b, j // BLOCK].long() * BLOCK + j % BLOCK


# ---------------------------------------------------------------------------------------------
# backend selection


def test_xpu_platform_selects_these_backends(vl):
    """vLLM's own XPU selection: FlashAttention for fp16/bf16 decoders, FlashAttnMLA for MLA (its
    configuration check passes), XPU_MLA_SPARSE for sparse MLA, Triton for fp32; the resolved
    classes (and the DSA indexer's backend) are the ones driven below."""
    select = vl.platform.get_attn_backend_cls
    config = vl.selector.AttentionSelectorConfig
    resolve = vl.import_utils.resolve_obj_by_qualname
    assert resolve(select(None, config(128, torch.bfloat16, "auto", BLOCK))) is vl.flash_attn.FlashAttentionBackend
    assert resolve(select(None, config(128, DTYPE, "fp8", BLOCK, has_sink=True))) is vl.flash_attn.FlashAttentionBackend
    mla = resolve(select(None, config(576, torch.bfloat16, "auto", BLOCK, use_mla=True)))
    assert mla is vl.flashattn_mla.XPUFlashAttnMLABackend
    assert mla.get_impl_cls() is vl.flashattn_mla.XPUFlashAttnMLAImpl
    assert mla.get_builder_cls() is vl.flashattn_mla.XPUFlashAttnMLAMetadataBuilder
    sparse = resolve(select(None, config(576, torch.bfloat16, "auto", BLOCK, use_mla=True, use_sparse=True)))
    assert sparse is vl.xpu_mla_sparse.XPUMLASparseBackend and sparse.get_name() == "XPU_MLA_SPARSE"
    assert sparse.get_impl_cls() is vl.xpu_mla_sparse.XPUMLASparseImpl
    assert sparse.get_builder_cls() is vl.xpu_mla_sparse.XPUMLASparseMetadataBuilder
    indexer = vl.indexer.DeepseekV32IndexerBackend  # the DSA indexer cache's backend (DeepseekV32IndexerCache)
    assert indexer.get_builder_cls() is vl.indexer.DeepseekV32IndexerMetadataBuilder
    assert indexer.get_supported_kernel_block_sizes() == [BLOCK]
    assert "triton_attn" in select(None, config(128, torch.float32, "auto", BLOCK))
    fa = vl.flash_attn.FlashAttentionBackend
    assert fa.supports_head_size(512) and fa.supports_sink() and fa.supports_kv_cache_dtype("fp8")
    assert [m.base for m in fa.get_supported_kernel_block_sizes()] == [BLOCK]
    assert vl.fa_utils.get_flash_attn_version() == 2
    assert vl.fa_utils.flash_attn_varlen_func is vl.xpu_ops.xpu_ops.flash_attn_varlen_func


# ---------------------------------------------------------------------------------------------
# FlashAttentionBackend


class FlashScenario:
    """One batch on vLLM's FlashAttention backend: requests with ``prefix`` cached tokens (written
    by earlier steps through ``do_kv_cache_update``) and ``new`` tokens this step."""

    def __init__(self, vl, *, prefix, new, num_q_heads=4, num_kv_heads=2, head_dim=64, sliding_window=None,
                 softcap=None, sinks=False, cache_dtype="auto", scales=(1.0, 1.0), layout="NHD", seed=0):
        self.vl, self.g = vl, torch.Generator().manual_seed(seed)
        self.prefix, self.new = list(prefix), list(new)
        self.seq_lens = [p + n for p, n in zip(prefix, new)]
        self.hq, self.hk, self.d = num_q_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5
        fp8 = cache_dtype != "auto"
        cache_torch_dtype = torch.uint8 if fp8 else DTYPE
        model = vllm_harness.ModelConfig(num_heads=self.hq, head_size=self.d, dtype=DTYPE)
        self.config = vllm_harness.vllm_config(vl, model, cache_dtype=cache_dtype, block_size=BLOCK)
        spec = vl.kv_cache_interface.FullAttentionSpec(block_size=BLOCK, num_kv_heads=self.hk, head_size=self.d,
                                                       dtype=cache_torch_dtype, sliding_window=sliding_window)
        self.sinks = (torch.randn(self.hq, generator=self.g) * 2).to(DEVICE) if sinks else None
        with vl.config.set_current_vllm_config(self.config):
            self.builder = vl.flash_attn.FlashAttentionMetadataBuilder(spec, ["layer.0"], self.config, torch.device(DEVICE))
            self.impl = vl.flash_attn.FlashAttentionImpl(
                self.hq, self.d, self.scale, self.hk, None, sliding_window, cache_dtype, logits_soft_cap=softcap,
                sinks=self.sinks,
            )
        self.window = (-1, -1) if sliding_window is None else (sliding_window - 1, 0)
        self.softcap = softcap or 0.0
        k_scale, v_scale = scales
        self.layer = SimpleNamespace(_q_scale=torch.tensor(1.0, device=DEVICE), _k_scale=torch.tensor(k_scale, device=DEVICE),
                                     _v_scale=torch.tensor(v_scale, device=DEVICE))
        num_blocks = sum(-(-n // BLOCK) for n in self.seq_lens) + 2
        self.table = _block_table(self.seq_lens, num_blocks, self.g)
        # vLLM's logical [blocks, H_kv, block, 2 * D] view of one buffer: K and V halves of each row
        if layout == "NHD":  # physical [blocks, block, H_kv, 2D]
            buf = torch.empty(num_blocks, BLOCK, self.hk, 2 * self.d, dtype=cache_torch_dtype, device=DEVICE)
            self.kv_cache = buf.permute(0, 2, 1, 3)
        else:  # "HND": physical = logical
            self.kv_cache = torch.empty(num_blocks, self.hk, BLOCK, 2 * self.d, dtype=cache_torch_dtype, device=DEVICE)
        self.kv_cache.view(torch.float8_e4m3fn if fp8 else DTYPE).fill_(float("nan"))
        self.keys = [torch.randn(n, self.hk, self.d, generator=self.g).to(DTYPE) for n in self.seq_lens]
        self.vals = [torch.randn(n, self.hk, self.d, generator=self.g).to(DTYPE) for n in self.seq_lens]
        if fp8:  # what the cache holds: the rows over their scale, in e4m3, times the scale
            def stored(x, s):
                return (x.float() / s).to(torch.float8_e4m3fn).double() * s
            self.ref_keys = [stored(k, k_scale) for k in self.keys]
            self.ref_vals = [stored(v, v_scale) for v in self.vals]
        else:
            self.ref_keys, self.ref_vals = self.keys, self.vals
        self.write(lambda b: (0, self.prefix[b]))  # earlier steps

    def write(self, rows):
        """``do_kv_cache_update`` of rows ``rows(b) = (start, stop)`` of every request; returns the slots."""
        spans = [rows(b) for b in range(len(self.seq_lens))]
        keys = torch.cat([self.keys[b][s:e] for b, (s, e) in enumerate(spans)]).to(DEVICE)
        vals = torch.cat([self.vals[b][s:e] for b, (s, e) in enumerate(spans)]).to(DEVICE)
        slots = torch.cat([_slots(self.table, b, s, e) for b, (s, e) in enumerate(spans)]).to(DEVICE)
        self.impl.do_kv_cache_update(self.layer, keys, vals, self.kv_cache, slots)
        return slots

    def forward(self):
        slots = self.write(lambda b: (self.prefix[b], self.seq_lens[b]))
        meta = vllm_harness.common_metadata(self.vl, query_lens=self.new, seq_lens=self.seq_lens,
                                            block_table=self.table.to(DEVICE), slot_mapping=slots, device=DEVICE)
        attn = self.builder.build(0, meta)
        total = sum(self.new)
        self.q = torch.randn(total, self.hq, self.d, generator=self.g).to(DTYPE)
        out = torch.full((total, self.hq, self.d), float("nan"), dtype=DTYPE, device=DEVICE)
        result = self.impl.forward(self.layer, self.q.to(DEVICE), None, None, self.kv_cache, attn, out)
        assert result is out
        return out

    def reference(self):
        cu_q = torch.tensor([0] + self.new).cumsum(0)
        cu_k = torch.tensor([0] + self.seq_lens).cumsum(0)
        out, _ = reference.varlen_attention(
            self.q, torch.cat(self.ref_keys), torch.cat(self.ref_vals), cu_q, cu_k, causal=True, softmax_scale=self.scale,
            window_size=self.window, softcap=self.softcap, sinks=None if self.sinks is None else self.sinks.cpu())
        return out


FLASH_CASES = {
    "decode": dict(prefix=[5, 70, 129], new=[1, 1, 1]),
    "chunked_prefill": dict(prefix=[0, 60, 100], new=[7, 9, 30]),
    "mixed_batch": dict(prefix=[70, 3, 64], new=[1, 1, 12]),
    "sliding_window": dict(prefix=[70, 2, 90], new=[1, 6, 5], sliding_window=16),
    "sinks": dict(prefix=[40, 0], new=[1, 8], sinks=True),
    "softcap": dict(prefix=[30, 80], new=[4, 1], softcap=5.0),
    "fp8_kv": dict(prefix=[70, 20], new=[1, 5], cache_dtype="fp8", scales=(0.5, 0.25)),
    "fp8_e4m3_kv_hnd": dict(prefix=[10, 65], new=[3, 1], cache_dtype="fp8_e4m3", scales=(2.0, 0.125), layout="HND"),
    "hnd_layout_window_sinks": dict(prefix=[66, 1], new=[2, 4], layout="HND", sliding_window=8, sinks=True,
                                    num_kv_heads=1),
}


@pytest.mark.parametrize("case", list(FLASH_CASES))
def test_flash_attention_backend(vl, ops_run, case):
    sc = FlashScenario(vl, **FLASH_CASES[case])
    out = sc.forward()
    assert_close(out.cpu(), sc.reference(), DTYPE)
    assert ops_run.count("reshape_and_cache_flash") == 2 and ops_run[-1] == "flash_attn_with_kvcache", ops_run


def test_flash_attention_writes_the_cache(vl):
    """``do_kv_cache_update`` (vLLM -> ``torch.ops._C_cache_ops.reshape_and_cache_flash``) puts each
    row at its slot of the K and V halves; slots no request owns keep their NaN."""
    sc = FlashScenario(vl, prefix=[3, 70], new=[0, 0])
    k_cache, v_cache = sc.kv_cache.transpose(1, 2).split(sc.d, dim=-1)
    k_flat = k_cache.reshape(-1, sc.hk, sc.d).cpu()
    v_flat = v_cache.reshape(-1, sc.hk, sc.d).cpu()
    owned = torch.zeros(k_flat.shape[0], dtype=torch.bool)
    for b, n in enumerate(sc.seq_lens):
        slots = _slots(sc.table, b, 0, n)
        assert torch.equal(k_flat[slots], sc.keys[b]) and torch.equal(v_flat[slots], sc.vals[b])
        owned[slots] = True
    assert torch.isnan(k_flat[~owned]).all() and torch.isnan(v_flat[~owned]).all()


@pytest.mark.parametrize("sliding_window", [None, 5])
def test_flash_attention_encoder_without_paging(vl, ops_run, sliding_window):
    """Encoder self-attention (``AttentionType.ENCODER_ONLY``): no KV cache, bidirectional, a window
    symmetric ((W - 1, W - 1)); vLLM calls the ragged ``flash_attn_varlen_func``."""
    g = torch.Generator().manual_seed(3)
    hq, hk, d = 4, 2, 64
    lens = [5, 11, 1]
    model = vllm_harness.ModelConfig(num_heads=hq, head_size=d, dtype=DTYPE)
    config = vllm_harness.vllm_config(vl, model)
    spec = vl.kv_cache_interface.FullAttentionSpec(block_size=BLOCK, num_kv_heads=hk, head_size=d, dtype=DTYPE)
    with vl.config.set_current_vllm_config(config):
        builder = vl.flash_attn.FlashAttentionMetadataBuilder(spec, ["enc.0"], config, torch.device(DEVICE))
        impl = vl.flash_attn.FlashAttentionImpl(hq, d, d**-0.5, hk, None, sliding_window, "auto",
                                                attn_type=vl.backend.AttentionType.ENCODER_ONLY)
    total = sum(lens)
    q = torch.randn(total, hq, d, generator=g).to(DTYPE)
    k = torch.randn(total, hk, d, generator=g).to(DTYPE)
    v = torch.randn(total, hk, d, generator=g).to(DTYPE)
    meta = vllm_harness.common_metadata(vl, query_lens=lens, seq_lens=lens, block_table=torch.zeros(3, 1, dtype=torch.int32,
                                        device=DEVICE), slot_mapping=torch.full((total,), -1, device=DEVICE), device=DEVICE,
                                        causal=False)
    attn = builder.build(0, meta)
    layer = SimpleNamespace(**{f"_{x}_scale": torch.tensor(1.0, device=DEVICE) for x in "qkv"})
    impl.do_kv_cache_update(layer, k.to(DEVICE), v.to(DEVICE), torch.empty(0, device=DEVICE), meta.slot_mapping)
    out = torch.full((total, hq, d), float("nan"), dtype=DTYPE, device=DEVICE)
    impl.forward(layer, q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), torch.empty(0, device=DEVICE), attn, out)
    cu = torch.tensor([0] + lens).cumsum(0)
    window = (-1, -1) if sliding_window is None else (sliding_window - 1, sliding_window - 1)
    ref, _ = reference.varlen_attention(q, k, v, cu, cu, causal=False, window_size=window, softmax_scale=d**-0.5)
    assert_close(out.cpu(), ref, DTYPE)
    assert ops_run == ["flash_attn_varlen_func"]


def test_flash_attention_alibi(vl):
    """ALiBi slopes reach ``flash_attn_varlen_func`` as ``alibi_slopes`` and the output matches
    the reference with a linear bias ``-slope * (query position - key position)``."""
    sc = FlashScenario(vl, prefix=[6, 70], new=[1, 3])
    slopes = [2.0 ** (-(h + 1)) for h in range(sc.hq)]
    with vl.config.set_current_vllm_config(sc.config):
        sc.impl = vl.flash_attn.FlashAttentionImpl(sc.hq, sc.d, sc.scale, sc.hk, slopes, None, "auto")
    out = sc.forward()
    group = sc.hq // sc.hk
    slopes_t = torch.tensor(slopes, dtype=torch.float64)
    at = 0
    for b, (n_new, n_all) in enumerate(zip(sc.new, sc.seq_lens)):
        k = sc.keys[b].double().repeat_interleave(group, dim=1)
        v = sc.vals[b].double().repeat_interleave(group, dim=1)
        q = sc.q[at : at + n_new].double()
        pos_q = torch.arange(n_new)[:, None] + n_all - n_new
        dist = (pos_q - torch.arange(n_all)[None, :]).double()
        s = torch.einsum("qhd,khd->hqk", q, k) * sc.scale - slopes_t[:, None, None] * dist
        s = s.masked_fill(dist < 0, -math.inf)
        ref = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)
        assert_close(out[at : at + n_new].cpu(), ref, DTYPE)
        at += n_new


# ---------------------------------------------------------------------------------------------
# XPUFlashAttnMLA

R, DR, NOPE, DV = 512, 64, 64, 128  # latent 512 + rope 64 = the 576-wide cache row; (64, 64, 128) MHA prefill


class _KvBProj(torch.nn.Module):
    """``kv_b_proj``: latent -> per-head [k_nope | v], returning ``(out, bias)`` as vLLM's linear layers."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, x):
        return x @ self.weight.t(), None


class MLAScenario:
    """One batch on vLLM's XPU FlashAttnMLA backend: ``ctx`` cached tokens and ``new`` tokens per
    request, decodes (one new token) first as vLLM orders the batch."""

    def __init__(self, vl, *, ctx, new, num_heads=2, seed=0):
        self.vl, self.g = vl, torch.Generator().manual_seed(seed)
        self.ctx, self.new = list(ctx), list(new)
        self.seq_lens = [c + n for c, n in zip(ctx, new)]
        self.h = num_heads
        self.scale = (NOPE + DR) ** -0.5
        model = vllm_harness.ModelConfig(num_heads=self.h, head_size=R + DR, dtype=DTYPE, max_model_len=8,
                                         mla=dict(kv_lora_rank=R, qk_nope_head_dim=NOPE, qk_rope_head_dim=DR,
                                                  v_head_dim=DV, q_lora_rank=None))
        self.config = config = vllm_harness.vllm_config(vl, model, block_size=BLOCK)
        config.scheduler_config.max_num_seqs = 1  # with max_model_len 8: a 256-row context workspace
        self.prefill_backend_cls = vl.mla_prefill.get_mla_prefill_backend(config)
        prefill_backend = self.prefill_backend_cls(num_heads=self.h, scale=self.scale, kv_lora_rank=R,
                                                   qk_nope_head_dim=NOPE, qk_rope_head_dim=DR, v_head_dim=DV,
                                                   vllm_config=config)
        config.compilation_config.static_forward_context["mla.0"] = SimpleNamespace(
            q_lora_rank=None, kv_lora_rank=R, qk_nope_head_dim=NOPE, qk_rope_head_dim=DR, v_head_dim=DV,
            prefill_backend=prefill_backend, non_causal_multi_token_decode=False)
        spec = vl.kv_cache_interface.MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=R + DR, dtype=DTYPE)
        self.w = (torch.randn(self.h * (NOPE + DV), R, generator=self.g) / R**0.5).to(DTYPE)
        with vl.config.set_current_vllm_config(config):
            self.builder = vl.flashattn_mla.XPUFlashAttnMLAMetadataBuilder(spec, ["mla.0"], config, torch.device(DEVICE))
            self.impl = vl.flashattn_mla.XPUFlashAttnMLAImpl(
                self.h, R + DR, self.scale, 1, None, None, "auto", None, "decoder", None, q_lora_rank=None,
                kv_lora_rank=R, qk_nope_head_dim=NOPE, qk_rope_head_dim=DR, qk_head_dim=NOPE + DR, v_head_dim=DV,
                kv_b_proj=_KvBProj(self.w.to(DEVICE)))
        num_blocks = sum(-(-n // BLOCK) for n in self.seq_lens) + 2
        self.table = _block_table(self.seq_lens, num_blocks, self.g)
        self.cache = torch.full((num_blocks, BLOCK, R + DR), float("nan"), dtype=DTYPE, device=DEVICE)
        self.kv_c = [torch.randn(n, R, generator=self.g).to(DTYPE) for n in self.seq_lens]
        self.k_pe = [torch.randn(n, 1, DR, generator=self.g).to(DTYPE) for n in self.seq_lens]
        self.k_scale = torch.tensor(1.0, device=DEVICE)
        self.write(lambda b: (0, self.ctx[b]))  # earlier steps
        self.slots = self.write(lambda b: (self.ctx[b], self.seq_lens[b]))
        meta = vllm_harness.common_metadata(vl, query_lens=self.new, seq_lens=self.seq_lens,
                                            block_table=self.table.to(DEVICE), slot_mapping=self.slots, device=DEVICE)
        self.meta = self.builder.build(0, meta)

    def write(self, rows):
        spans = [rows(b) for b in range(len(self.seq_lens))]
        kv_c = torch.cat([self.kv_c[b][s:e] for b, (s, e) in enumerate(spans)]).to(DEVICE)
        k_pe = torch.cat([self.k_pe[b][s:e] for b, (s, e) in enumerate(spans)]).to(DEVICE)
        slots = torch.cat([_slots(self.table, b, s, e) for b, (s, e) in enumerate(spans)]).to(DEVICE)
        self.impl.do_kv_cache_update(kv_c, k_pe, self.cache, slots, "auto", self.k_scale)
        return slots

    @property
    def num_decodes(self):
        return self.meta.num_decodes

    def decode(self):
        """``forward_mqa`` of the decodes (absorbed queries: latent 512 + rope 64) -> latent output."""
        n = self.num_decodes
        self.q_latent = torch.randn(n, self.h, R, generator=self.g).to(DTYPE)
        self.q_rope = torch.randn(n, self.h, DR, generator=self.g).to(DTYPE)
        out, lse = self.impl.forward_mqa((self.q_latent.to(DEVICE), self.q_rope.to(DEVICE)), self.cache, self.meta, None)
        assert lse is None
        return out

    def decode_reference(self):
        n = self.num_decodes
        q = torch.cat([self.q_latent, self.q_rope], -1)
        rows = torch.cat([torch.cat([self.kv_c[b], self.k_pe[b][:, 0]], -1) for b in range(n)])[:, None]
        cu_k = torch.tensor([0] + self.seq_lens[:n]).cumsum(0)
        out, _ = reference.varlen_attention(q, rows, rows[..., :R], torch.arange(n + 1), cu_k, softmax_scale=self.scale)
        return out

    def prefill(self):
        """``forward_mha`` of the prefills (new tokens' latents, context from the cache)."""
        n = self.num_decodes
        total = sum(self.new[n:])
        self.q = torch.randn(total, self.h, NOPE + DR, generator=self.g).to(DTYPE)
        kv_c = torch.cat([self.kv_c[b][self.ctx[b]:] for b in range(n, len(self.new))]).to(DEVICE)
        k_pe = torch.cat([self.k_pe[b][self.ctx[b]:] for b in range(n, len(self.new))]).to(DEVICE)
        out = torch.full((total, self.h * DV), float("nan"), dtype=DTYPE, device=DEVICE)
        self.impl.forward_mha(self.q.to(DEVICE), kv_c, k_pe, self.cache, self.meta, self.k_scale, out)
        return out.view(total, self.h, DV)

    def prefill_reference(self):
        n = self.num_decodes
        keys, vals = [], []
        for b in range(n, len(self.new)):
            kv = (self.kv_c[b].double() @ self.w.double().t()).view(-1, self.h, NOPE + DV)
            keys.append(torch.cat([kv[..., :NOPE], self.k_pe[b].double().expand(-1, self.h, -1)], -1))
            vals.append(kv[..., NOPE:])
        cu_q = torch.tensor([0] + self.new[n:]).cumsum(0)
        cu_k = torch.tensor([0] + self.seq_lens[n:]).cumsum(0)
        out, _ = reference.varlen_attention(self.q, torch.cat(keys), torch.cat(vals), cu_q, cu_k, causal=True,
                                            softmax_scale=self.scale)
        return out


def test_mla_decode(vl, ops_run):
    """``forward_mqa`` over the 576-wide latent cache (V = its first 512 channels): vLLM's
    ``flash_attn_varlen_func(q, cache, cache.narrow(-1, 0, 512), block_table=...)`` ->
    ``flash_mla_decode``; requests span one, two and three 64-token blocks."""
    sc = MLAScenario(vl, ctx=[4, 90, 140], new=[1, 1, 1])
    assert sc.num_decodes == 3 and sc.meta.prefill is None
    out = sc.decode()
    assert out.shape == (3, sc.h, R)
    assert_close(out.cpu(), sc.decode_reference(), DTYPE)
    # flash_attn_with_kvcache takes vLLM's latent layout onto the MLA decode kernel
    assert ops_run == ["concat_and_cache_mla"] * 2 + ["flash_attn_with_kvcache", "flash_mla_decode"], ops_run


def test_mla_writes_the_cache(vl):
    """``do_kv_cache_update`` (-> ``concat_and_cache_mla``) stores ``[kv_c | k_pe]`` at each slot."""
    sc = MLAScenario(vl, ctx=[3, 70], new=[1, 1])
    flat = sc.cache.reshape(-1, R + DR).cpu()
    owned = torch.zeros(flat.shape[0], dtype=torch.bool)
    for b, n in enumerate(sc.seq_lens):
        slots = _slots(sc.table, b, 0, n)
        assert torch.equal(flat[slots], torch.cat([sc.kv_c[b], sc.k_pe[b][:, 0]], -1))
        owned[slots] = True
    assert torch.isnan(flat[~owned]).all()


def test_mla_prefill_with_context_chunks(vl, ops_run):
    """``forward_mha`` with cached context: the new tokens' causal attention (ragged
    ``flash_attn_varlen_func``, V zero-padded to the QK width as vLLM's FA2 path does, with LSE),
    the context gathered by ``gather_and_maybe_dequant_cache`` in two workspace chunks (the second a
    continuation of the first chunk's last request, merged into it), a request without context, and
    the final merge with the new tokens' partial."""
    sc = MLAScenario(vl, ctx=[100, 200, 0], new=[3, 5, 4])
    chunked = sc.meta.prefill.chunked_context
    assert sc.num_decodes == 0 and len(chunked.chunks) == 2 and any(c.is_continuation for c in chunked.chunks)
    assert chunked.empty_token_slices  # the request without context
    assert sc.prefill_backend_cls.__name__ == "FlashAttnPrefillBackend"
    out = sc.prefill()
    assert_close(out.cpu(), sc.prefill_reference(), DTYPE)
    assert ops_run.count("gather_and_maybe_dequant_cache") == 2 and ops_run.count("flash_attn_varlen_func") == 3, ops_run


def test_mla_prefill_without_context(vl, ops_run):
    sc = MLAScenario(vl, ctx=[0, 0], new=[6, 2])
    assert sc.meta.prefill.chunked_context is None
    assert_close(sc.prefill().cpu(), sc.prefill_reference(), DTYPE)
    assert "gather_and_maybe_dequant_cache" not in ops_run


def test_mla_mixed_batch(vl, ops_run):
    """Decodes and prefills in one batch, one metadata: ``forward_mqa`` on the decode rows,
    ``forward_mha`` (with context) on the rest."""
    sc = MLAScenario(vl, ctx=[65, 7, 30, 64], new=[1, 1, 2, 3])
    assert sc.num_decodes == 2 and sc.meta.num_prefills == 2
    assert_close(sc.decode().cpu(), sc.decode_reference(), DTYPE)
    assert_close(sc.prefill().cpu(), sc.prefill_reference(), DTYPE)
    assert "flash_mla_decode" in ops_run and "gather_and_maybe_dequant_cache" in ops_run


# ---------------------------------------------------------------------------------------------
# DeepSeek sparse attention: the DSA indexer (SparseAttnIndexer) and XPU_MLA_SPARSE

IDX_HEADS, IDX_D, IDX_QUANT = 4, 128, 128  # indexer heads (DeepSeek-V3.2: 64), its head dim and fp8 quant block
IDX_ROW = IDX_D + 4 * (IDX_D // IDX_QUANT)  # bytes a cached indexer key takes: fp8 values and one fp32 scale
TOPK = 128  # index_topk: vLLM's top-k -> cache-slot conversion takes multiples of 128 (DeepSeek-V3.2: 2048)
IDX_LAYER, MLA_LAYER = "layers.0.indexer.k_cache", "layers.0.attn"
SENTINEL = -777  # top-k buffer rows beyond the batch: never written
# ties in the top-k, relative to the logits' size: the interpreter's fp32 logits; Hopper's fp8 tensor-core
# products accumulate with fewer bits than fp32 (the compiled indexer kernels use fp8 dots there)
LOGITS_TOL = 1e-5 if INTERPRET else 5e-3


class DSAScenario:
    """One DeepSeek sparse attention step on vLLM's XPU path: ``ctx`` cached tokens (their indexer
    keys written by earlier steps through vLLM's ``indexer_k_quant_and_cache``, their latents through
    ``do_kv_cache_update``) and ``new`` tokens per request, decodes first as vLLM orders the batch.
    vLLM's indexer metadata builder (``DeepseekV32IndexerMetadataBuilder``) and the sparse MLA one
    (``XPUMLASparseMetadataBuilder``) build the step's metadata from one ``CommonAttentionMetadata``;
    ``SparseAttnIndexer`` (the op of DeepSeek-V3.2's ``Indexer`` layer) and ``XPUMLASparseImpl``
    share one top-k buffer, as in the model."""

    def __init__(self, vl, *, ctx, new, num_heads=2, seed=0):
        self.vl, self.g = vl, torch.Generator().manual_seed(seed)
        self.ctx, self.new = list(ctx), list(new)
        self.seq_lens = [c + n for c, n in zip(ctx, new)]
        self.h, self.total = num_heads, sum(new)
        self.scale = (NOPE + DR) ** -0.5
        max_model_len = 256
        model = vllm_harness.ModelConfig(
            num_heads=self.h, head_size=R + DR, dtype=DTYPE, max_model_len=max_model_len,
            mla=dict(kv_lora_rank=R, qk_nope_head_dim=NOPE, qk_rope_head_dim=DR, v_head_dim=DV, q_lora_rank=None,
                     index_topk=TOPK, index_n_heads=IDX_HEADS, index_head_dim=IDX_D))
        self.config = config = vllm_harness.vllm_config(vl, model, block_size=BLOCK)
        if not vl.workspace.is_workspace_manager_initialized():  # vLLM's model runner does this once
            vl.workspace.init_workspace_manager(torch.device(DEVICE))
        num_blocks = sum(-(-n // BLOCK) for n in self.seq_lens) + 2
        self.num_blocks = num_blocks
        self.table = _block_table(self.seq_lens, num_blocks, self.g)
        # bytes 0xFF where no request owns a slot: NaN fp8 keys and NaN fp32 scales
        self.idx_cache = torch.full((num_blocks, BLOCK, IDX_ROW), 0xFF, dtype=torch.uint8, device=DEVICE)
        self.cache = torch.full((num_blocks, BLOCK, R + DR), float("nan"), dtype=DTYPE, device=DEVICE)
        self.keys = [torch.randn(n, IDX_D, generator=self.g).to(DTYPE) for n in self.seq_lens]
        self.latents = [torch.randn(n, R + DR, generator=self.g).to(DTYPE) for n in self.seq_lens]
        self.topk_buffer = torch.full((self.total + 2, TOPK), SENTINEL, dtype=torch.int32, device=DEVICE)
        kv = vl.kv_cache_interface
        with vl.config.set_current_vllm_config(config):
            idx_spec = kv.MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=IDX_ROW, dtype=torch.uint8,
                                           cache_role=kv.SparseCacheRole.INDEXER)
            self.idx_builder = vl.indexer.DeepseekV32IndexerMetadataBuilder(
                idx_spec, [IDX_LAYER], config, torch.device(DEVICE), block_table_width=self.table.shape[1])
            # the indexer's key-cache layer: what SparseAttnIndexer reads of it
            k_cache = SimpleNamespace(prefix=IDX_LAYER, kv_cache=self.idx_cache)
            self.indexer = vl.sparse_attn_indexer.SparseAttnIndexer(
                k_cache, IDX_QUANT, "ue8m0", TOPK, IDX_D, max_model_len, vl.indexer.get_max_prefill_buffer_size(config),
                self.topk_buffer)
            spec = kv.MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=R + DR, dtype=DTYPE)
            self.builder = vl.xpu_mla_sparse.XPUMLASparseMetadataBuilder(spec, [MLA_LAYER], config,
                                                                         torch.device(DEVICE))
            self.impl = vl.xpu_mla_sparse.XPUMLASparseImpl(
                self.h, R + DR, self.scale, 1, None, None, "auto", None, "decoder", None, indexer=self.indexer,
                q_lora_rank=None, kv_lora_rank=R, qk_nope_head_dim=NOPE, qk_rope_head_dim=DR, qk_head_dim=NOPE + DR,
                v_head_dim=DV, kv_b_proj=None)
        # earlier steps
        slots = self._slots(lambda b: (0, self.ctx[b]))
        keys = torch.cat([self.keys[b][: self.ctx[b]] for b in range(len(self.ctx))]).to(DEVICE)
        vl.custom_ops.indexer_k_quant_and_cache(keys, self.idx_cache, slots, IDX_QUANT, "ue8m0")
        self.write_latents(lambda b: (0, self.ctx[b]))
        self.slots = self._slots(lambda b: (self.ctx[b], self.seq_lens[b]))
        meta = vllm_harness.common_metadata(vl, query_lens=self.new, seq_lens=self.seq_lens,
                                            block_table=self.table.to(DEVICE), slot_mapping=self.slots, device=DEVICE)
        self.idx_meta = self.idx_builder.build(0, meta)
        self.meta = self.builder.build(0, meta)
        # each new token: its request and how many positions it sees (its own included)
        self.rows = [(b, c + i + 1) for b, (c, n) in enumerate(zip(self.ctx, self.new)) for i in range(n)]

    def _slots(self, rows):
        return torch.cat([_slots(self.table, b, *rows(b)) for b in range(len(self.ctx))]).to(DEVICE)

    def write_latents(self, rows):
        """``do_kv_cache_update`` (-> ``concat_and_cache_mla``) of rows ``rows(b)`` of every request."""
        spans = [rows(b) for b in range(len(self.ctx))]
        latents = torch.cat([self.latents[b][s:e] for b, (s, e) in enumerate(spans)]).to(DEVICE)
        self.impl.do_kv_cache_update(latents[:, :R], latents[:, None, R:], self.cache, self._slots(rows), "auto",
                                     torch.tensor(1.0, device=DEVICE))

    def index(self):
        """``SparseAttnIndexer.forward_xpu`` with the fp8 queries and folded weights DeepSeek-V3.2's
        ``Indexer`` passes it: the new keys into the indexer cache, the logits, the top-k."""
        self.q_idx = (torch.randn(self.total, IDX_HEADS, IDX_D, generator=self.g) * 2).to(torch.float8_e4m3fn)
        self.weights = torch.randn(self.total, IDX_HEADS, generator=self.g)
        keys = torch.cat([k[c:] for k, c in zip(self.keys, self.ctx)]).to(DEVICE)
        hidden = torch.empty(self.total, 8, dtype=DTYPE, device=DEVICE)  # only its token count is read
        with self.vl.forward_context.set_forward_context({IDX_LAYER: self.idx_meta, MLA_LAYER: self.meta}, self.config):
            result = self.indexer.forward_xpu(hidden, self.q_idx.to(DEVICE), keys, self.weights.to(DEVICE))
        assert result is self.topk_buffer
        return result[: self.total].cpu()

    def cached_keys(self, b):
        """Request ``b``'s keys as the indexer cache holds them, dequantised exactly from its bytes
        (a block holds its ``BLOCK`` keys' fp8 values, then their fp32 scales)."""
        slots = _slots(self.table, b, 0, self.seq_lens[b])
        pages = self.idx_cache.cpu().view(self.num_blocks, BLOCK * IDX_ROW)
        block, offset = slots // BLOCK, slots % BLOCK
        values = pages[block[:, None], offset[:, None] * IDX_D + torch.arange(IDX_D)]
        scales = pages[block[:, None], BLOCK * IDX_D + 4 * offset[:, None] + torch.arange(4)]
        return values.view(torch.float8_e4m3fn).double() * scales.contiguous().view(torch.float32).double()

    def index_logits(self, t):
        """Token ``t``'s float64 indexer logits over the positions it sees:
        ``sum_h weights[t, h] * relu(q[t, h] . key)``."""
        b, n = self.rows[t]
        keys = self.cached_keys(b)[:n]
        dots = torch.einsum("hd,kd->hk", self.q_idx[t].double(), keys).clamp_min(0)
        return (self.weights[t].double()[:, None] * dots).sum(0)

    def attend(self):
        """``do_kv_cache_update`` of the new latents, then ``forward_mqa`` (absorbed queries: latent 512
        + rope 64) over the rows the top-k buffer names -> latent output."""
        self.write_latents(lambda b: (self.ctx[b], self.seq_lens[b]))
        self.q = torch.randn(self.total, self.h, R + DR, generator=self.g).to(DTYPE)
        q = self.q.to(DEVICE)
        out, lse = self.impl.forward_mqa((q[..., :R], q[..., R:]), self.cache, self.meta, None)
        assert lse is None
        return out

    def attend_reference(self, topk):
        """Float64 attention of each token over exactly its selected rows (V: their first 512 channels)."""
        out = torch.empty(self.total, self.h, R, dtype=torch.float64)
        for t, (b, n) in enumerate(self.rows):
            picked = topk[t][topk[t] >= 0].long()
            assert picked.numel() and int(picked.max()) < n
            rows = self.latents[b][picked].double()
            p = torch.softmax(self.q[t].double() @ rows.T * self.scale, dim=-1)
            out[t] = p @ rows[:, :R]
        return out


def assert_topk(scenario, topk):
    """Each token's top-k, as a set: all of the positions it sees when they are ``TOPK`` or fewer
    (then ``-1``), else ``TOPK`` distinct positions whose float64 logits are the largest (ties
    within rounding of the fp32 logits either way)."""
    for t, (_, n) in enumerate(scenario.rows):
        row = topk[t]
        picked = row[row >= 0].long()
        assert picked.unique().numel() == picked.numel() and (row[row < 0] == -1).all(), (t, row)
        if n <= TOPK:
            assert sorted(picked.tolist()) == list(range(n)), (t, n, row)
            continue
        assert picked.numel() == TOPK and int(picked.max()) < n, (t, n, row)
        logits = scenario.index_logits(t)
        rest = torch.ones(n, dtype=torch.bool)
        rest[picked] = False
        tol = LOGITS_TOL * (1 + float(logits.abs().max()))
        assert float(logits[picked].min()) >= float(logits[rest].max()) - tol, (t, n)


DSA_CASES = {
    "decode": dict(ctx=[150, 200, 40], new=[1, 1, 1]),
    "prefill_with_context": dict(ctx=[130, 0, 60], new=[4, 3, 5]),
    "mixed_batch": dict(ctx=[200, 7, 140], new=[1, 1, 3]),
}


@pytest.mark.parametrize("case", list(DSA_CASES))
def test_dsa_indexer(vl, ops_run, case):
    """vLLM's ``SparseAttnIndexer.forward_xpu`` -> ``torch.ops.vllm.sparse_attn_indexer``: the new
    keys into the fp8 indexer cache (``indexer_k_quant_and_cache``); prefill rows gather their
    requests' keys (``cp_gather_indexer_k_quant_cache``), score them with
    ``torch.ops.vllm.xpu_fp8_mqa_logits`` (-> ``_xpu_C.fp8_mqa_logits``) and select with
    ``_C.top_k_per_row_prefill``; decode rows score the paged cache with
    ``xpu_fp8_paged_mqa_logits`` (-> ``_xpu_C.fp8_paged_mqa_logits``) and select with
    ``_C.top_k_per_row_decode`` (vLLM's top-k choice on XPU: ``per_row``). Each token's top-k
    (request-local positions) against its float64 logits over the dequantised cache; rows beyond
    the batch keep their sentinel."""
    sc = DSAScenario(vl, **DSA_CASES[case])
    decodes, prefills = sc.idx_meta.num_decodes, sc.idx_meta.num_prefills
    assert (decodes, prefills) == (sum(n == 1 for n in sc.new), sum(n > 1 for n in sc.new))
    ops_run.clear()  # the earlier steps' writes
    topk = sc.index()
    assert_topk(sc, topk)
    assert (sc.topk_buffer[sc.total:] == SENTINEL).all()
    expected = ["indexer_k_quant_and_cache"]
    if prefills:
        expected += ["cp_gather_indexer_k_quant_cache", "fp8_mqa_logits", "fast_topk_v2"]
    if decodes:
        expected += ["fp8_paged_mqa_logits", "fast_topk_v2"]
    assert ops_run == expected, ops_run


def test_dsa_indexer_prefill_in_row_chunks(vl, ops_run, monkeypatch):
    """With no room for prefill logits (``VLLM_SPARSE_INDEXER_MAX_LOGITS_MB=0``) vLLM's builder
    splits the prefill into one chunk per request, each into one-row sub-chunks: the request's
    keys are gathered once and the later rows of the request reuse them (``skip_kv_gather``)."""
    monkeypatch.setenv("VLLM_SPARSE_INDEXER_MAX_LOGITS_MB", "0")
    sc = DSAScenario(vl, ctx=[140, 3], new=[3, 2])
    chunks = sc.idx_meta.prefill.chunks
    assert len(chunks) == 5 and [c.skip_kv_gather for c in chunks] == [False, True, True, False, True]
    ops_run.clear()
    assert_topk(sc, sc.index())
    assert ops_run.count("cp_gather_indexer_k_quant_cache") == 2 and ops_run.count("fp8_mqa_logits") == 5, ops_run


def test_dsa_indexer_writes_its_cache(vl):
    """vLLM's ``indexer_k_quant_and_cache`` (earlier steps) and the indexer's own insert put every
    key at its slot as fp8 e4m3 with a power-of-two fp32 scale (``"ue8m0"``: ``2^ceil(log2(amax /
    448))``): exactly that under the interpreter (torch quantises there); compiled, the kernel's
    fp32 division may round a scale or a value one step apart, so each key within half an fp8 step
    (of a scale up to twice as large). Slots no request owns keep their 0xFF bytes."""
    sc = DSAScenario(vl, ctx=[70, 0], new=[1, 5])
    sc.index()
    owned = torch.zeros(sc.num_blocks * BLOCK, dtype=torch.bool)
    for b, n in enumerate(sc.seq_lens):
        k = sc.keys[b].double()
        scale = torch.exp2(torch.ceil(torch.log2(k.abs().amax(-1, keepdim=True).clamp_min(1e-4) / 448)))
        cached = sc.cached_keys(b)
        if INTERPRET:
            assert torch.equal(cached, (k / scale).to(torch.float8_e4m3fn).double() * scale), b
        else:  # e4m3: 3 mantissa bits (half a step: 1/16 of the value), subnormal steps of scale / 512
            assert ((cached - k).abs() <= k.abs() / 16 + scale / 256).all(), b
        owned[_slots(sc.table, b, 0, n)] = True
    pages = sc.idx_cache.cpu().view(sc.num_blocks, BLOCK * IDX_ROW)
    values = pages[:, : BLOCK * IDX_D].reshape(-1, IDX_D)
    scales = pages[:, BLOCK * IDX_D:].reshape(-1, 4)
    assert (values[~owned] == 0xFF).all() and (scales[~owned] == 0xFF).all()


@pytest.mark.parametrize("case", list(DSA_CASES))
def test_mla_sparse_backend(vl, ops_run, case):
    """``XPU_MLA_SPARSE`` over the indexer's top-k: ``XPUMLASparseMetadataBuilder.build`` (every token
    routed to the sparse MQA path), ``do_kv_cache_update`` (-> ``concat_and_cache_mla``) and
    ``forward_mqa``, which maps the request-local top-k positions to cache rows through the block
    table (vLLM's Triton ``triton_convert_req_index_to_global_index``) and attends with vLLM's own
    Triton sparse MLA kernel (vllm/v1/attention/ops/xpu_mla_sparse.py: no vllm_xpu_kernels call).
    The output against float64 attention over exactly the selected rows of each request."""
    sc = DSAScenario(vl, **DSA_CASES[case])
    assert sc.meta.num_decode_tokens == sc.total and sc.meta.num_prefills == 0 and sc.meta.topk_tokens == TOPK
    topk = sc.index()
    assert_topk(sc, topk)
    ops_run.clear()
    out = sc.attend()
    assert out.shape == (sc.total, sc.h, R)
    assert_close(out.cpu(), sc.attend_reference(topk), DTYPE)
    assert ops_run == ["concat_and_cache_mla"], ops_run
