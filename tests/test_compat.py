"""triton_xpu_attn.compat: ``install()`` (aliasing, never shadowing a real package unless forced,
idempotence) and the engine-facing modules ``sgl_kernel`` / ``vllm_xpu_kernels`` (signatures,
return conventions, routing, unsupported arguments) against the float64 reference."""
from __future__ import annotations

import importlib
import inspect
import sys

import pytest
import torch

import triton_xpu_attn
import triton_xpu_attn.compat as compat
from conftest import DEVICE
from helpers import assert_close, poison
from triton_xpu_attn import reference

DTYPE = torch.float16


@pytest.fixture
def clean_install():
    """Each install() test starts with nothing installed and leaves the process as it found it."""
    before = compat.installed()
    compat.uninstall()
    yield
    compat.uninstall()
    if before:
        compat.install(list(before))


# ---- install() ----


def test_install_resolves_engine_imports(clean_install):
    report = compat.install()
    assert report == {"sgl_kernel": "installed", "vllm_xpu_kernels": "installed"}
    import sgl_kernel
    from sgl_kernel.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: F401
    from vllm_xpu_kernels.flash_attn_interface import flash_attn_varlen_func as vllm_varlen  # noqa: F401
    import vllm_xpu_kernels._C  # noqa: F401  (vLLM's platform imports it for its side effect)

    assert sgl_kernel is importlib.import_module("triton_xpu_attn.compat.sgl_kernel")
    assert sgl_kernel.merge_state_v2 is triton_xpu_attn.merge_state_v2
    assert sgl_kernel.merge_state is triton_xpu_attn.merge_state  # v1 (base 2)
    assert sgl_kernel.flash_mla_prefill is triton_xpu_attn.flash_mla_prefill
    # the aliased module keeps its own identity
    assert sgl_kernel.__spec__.name == "triton_xpu_attn.compat.sgl_kernel"
    with pytest.raises(ImportError):
        importlib.import_module("sgl_kernel.no_such_module")


def test_install_is_idempotent(clean_install):
    compat.install()
    finders = len(sys.meta_path)
    assert compat.install() == {"sgl_kernel": "already installed", "vllm_xpu_kernels": "already installed"}
    assert len(sys.meta_path) == finders
    assert compat.uninstall() == ["sgl_kernel", "vllm_xpu_kernels"]
    assert "sgl_kernel" not in sys.modules
    with pytest.raises(ImportError):
        importlib.import_module("sgl_kernel")


def test_install_never_shadows_a_real_package_unless_forced(clean_install, tmp_path, monkeypatch):
    real = tmp_path / "sgl_kernel"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    report = compat.install(["sgl_kernel"])
    assert report["sgl_kernel"].startswith("skipped: real package at ") and str(real) in report["sgl_kernel"]
    import sgl_kernel

    assert sgl_kernel.REAL
    report = compat.install(["sgl_kernel"], force=True)
    assert report == {"sgl_kernel": "installed"}
    import sgl_kernel as shadowed

    assert not hasattr(shadowed, "REAL") and shadowed.flash_mla_decode is triton_xpu_attn.flash_mla_decode
    compat.uninstall()
    sys.modules.pop("sgl_kernel", None)


def test_install_overlay_keeps_a_real_package_and_replaces_its_attention(clean_install, tmp_path, monkeypatch):
    real = tmp_path / "sgl_kernel"
    real.mkdir()
    (real / "__init__.py").write_text("def rmsnorm():\n    return 'real rmsnorm'\n\ndef merge_state_v2():\n    return 'real'\n")
    (real / "flash_attn.py").write_text("def flash_attn_with_kvcache():\n    return 'real'\n")
    (real / "nsa.py").write_text("def fp8_mqa_logits():\n    return 'real'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    report = compat.install(["sgl_kernel"], overlay=True)
    assert report["sgl_kernel"].startswith(f"overlaid on {real}")
    import sgl_kernel
    import sgl_kernel.flash_attn

    assert sgl_kernel.rmsnorm() == "real rmsnorm"  # the real package's other kernels stay
    assert sgl_kernel.merge_state_v2 is triton_xpu_attn.merge_state_v2
    assert sgl_kernel.flash_mla_prefill is triton_xpu_attn.flash_mla_prefill
    assert sgl_kernel.flash_attn.flash_attn_with_kvcache.__module__ == "triton_xpu_attn.compat.sgl_kernel.flash_attn"
    # DeepSeek sparse attention at the root and in the real nsa submodule; the real package here has
    # no attention / top_k submodules (an older sgl-kernel-xpu): they are skipped, not created
    import sgl_kernel.nsa

    assert sgl_kernel.flash_mla_with_kvcache is triton_xpu_attn.flash_mla_with_kvcache
    assert sgl_kernel.fast_topk_transform_fused is triton_xpu_attn.fast_topk_transform_fused
    assert sgl_kernel.nsa.fp8_mqa_logits.__module__ == "triton_xpu_attn.compat.sgl_kernel.nsa"
    assert "sgl_kernel.top_k" not in report["sgl_kernel"] and "sgl_kernel.nsa.fp8_mqa_logits" in report["sgl_kernel"]
    assert compat.uninstall() == ["sgl_kernel"]
    assert sgl_kernel.nsa.fp8_mqa_logits() == "real"
    assert sgl_kernel.merge_state_v2() == "real" and sgl_kernel.flash_attn.flash_attn_with_kvcache() == "real"
    assert not hasattr(sgl_kernel, "flash_mla_prefill")
    for name in ("sgl_kernel.flash_attn", "sgl_kernel.nsa", "sgl_kernel"):
        sys.modules.pop(name, None)
    with pytest.raises(ValueError, match="force and overlay"):
        compat.install(force=True, overlay=True)


def test_install_rejects_unknown_names(clean_install):
    with pytest.raises(ValueError, match="names"):
        compat.install(["flash_attn"])


# ---- sgl_kernel ----

SGL_KVCACHE_PARAMS = [
    "q", "k_cache", "v_cache", "k", "v", "qv", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
    "cache_leftpad", "page_table", "cu_seqlens_q", "cu_seqlens_k_new", "max_seqlen_q", "max_seqlen_k",
    "rotary_seqlens", "q_descale", "k_descale", "v_descale", "softmax_scale", "sinks", "causal", "window_size",
    "softcap", "rotary_interleaved", "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin",
    "return_softmax_lse", "out", "bidirectional_block_ids", "alibi_slopes",  # the last: keyword only, ours
]


def test_sgl_kernel_signatures():
    from triton_xpu_attn.compat.sgl_kernel import flash_attn as fa

    assert list(inspect.signature(fa.flash_attn_with_kvcache).parameters) == SGL_KVCACHE_PARAMS
    assert list(inspect.signature(fa.flash_attn_varlen_func).parameters)[:7] == [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
    ]


def _paged_case(seed, page_size=4, hq=4, hk=2, d=64, lens=(5, 11), q_lens=(1, 3)):
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // page_size) for n in lens]
    num_pages = sum(pages) + 1
    k_cache = torch.randn(num_pages, page_size, hk, d, generator=g).to(DTYPE)
    v_cache = torch.randn(num_pages, page_size, hk, d, generator=g).to(DTYPE)
    perm = (torch.randperm(num_pages - 1, generator=g) + 1).tolist()
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = torch.tensor(perm[at : at + n])
        at += n
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(DTYPE)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    return [t.to(DEVICE) for t in (q, k_cache, v_cache, table, cu, seqlens)]


def test_sgl_kvcache_lse_tuple_and_bad_input():
    from triton_xpu_attn.compat.sgl_kernel.flash_attn import flash_attn_with_kvcache

    q, k_cache, v_cache, table, cu, seqlens = _paged_case(0)
    result = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, page_table=table, cu_seqlens_q=cu,
                                     max_seqlen_q=3, causal=True, return_softmax_lse=True)
    assert len(result) == 4 and result[2] is None and result[3] is None
    o, lse, *rest = result
    ref, ref_lse = reference.paged_attention(q.cpu(), k_cache.cpu(), v_cache.cpu(), seqlens.cpu(), table.cpu(),
                                             cu.cpu(), causal=True)
    assert_close(o, ref, DTYPE)
    assert_close(lse, ref_lse, DTYPE, what="lse")
    with pytest.raises(ValueError, match="bidirectional_block_ids"):
        flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, page_table=table, cu_seqlens_q=cu,
                                bidirectional_block_ids=torch.zeros(q.shape[0], dtype=torch.int32, device=DEVICE))
    # page_table=None passes through: k_cache is then a contiguous [B_cache, S, H_kv, D] cache
    with pytest.raises(ValueError, match="k_cache has .* rows but there are .* requests"):
        flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, cu_seqlens_q=cu)


def test_sgl_store_cache_xpu_and_non_attention_stand_ins():
    from triton_xpu_attn.compat import sgl_kernel

    k_cache = poison(torch.empty(6, 8, dtype=DTYPE, device=DEVICE))
    v_cache = poison(torch.empty(6, 8, dtype=DTYPE, device=DEVICE))
    k = torch.randn(3, 8).to(DTYPE).to(DEVICE)
    v = torch.randn(3, 8).to(DTYPE).to(DEVICE)
    sgl_kernel.store_cache_xpu(k, v, k_cache, v_cache, torch.tensor([4, -1, 2], device=DEVICE))
    assert torch.equal(k_cache[4], k[0]) and torch.equal(k_cache[2], k[2]) and torch.equal(v_cache[4], v[0])
    assert torch.equal(k_cache[0], k[1])  # a skipped row lands in sglang's padding slot 0
    assert torch.isnan(k_cache[[1, 3, 5]].float()).all()
    with pytest.raises(NotImplementedError, match="sgl_kernel.rmsnorm"):
        sgl_kernel.rmsnorm(k, None)


# ---- vllm_xpu_kernels ----


def _vllm_varlen():
    from triton_xpu_attn.compat.vllm_xpu_kernels.flash_attn_interface import flash_attn_varlen_func

    return flash_attn_varlen_func


def test_vllm_paged_with_sinks_and_window():
    fn = _vllm_varlen()
    q, k_cache, v_cache, table, cu, seqlens = _paged_case(1)
    sinks = torch.randn(q.shape[1]).to(DEVICE)
    out, lse = fn(q, k_cache, v_cache, 3, cu, 11, seqused_k=seqlens, causal=True, window_size=[4, 0],
                  block_table=table, return_softmax_lse=True, s_aux=sinks)
    ref, ref_lse = reference.paged_attention(q.cpu(), k_cache.cpu(), v_cache.cpu(), seqlens.cpu(), table.cpu(),
                                             cu.cpu(), causal=True, window_size=(4, 0), sinks=sinks.cpu())
    assert_close(out, ref, DTYPE)
    assert lse.shape == (q.shape[1], q.shape[0])
    # host_kv_lens stands in for seqused_k; window None means unbounded
    out = fn(q, k_cache, v_cache, 3, cu, 11, causal=True, block_table=table, host_kv_lens=[5, 11])
    ref, _ = reference.paged_attention(q.cpu(), k_cache.cpu(), v_cache.cpu(), seqlens.cpu(), table.cpu(), cu.cpu(),
                                       causal=True)
    assert_close(out, ref, DTYPE)


def test_vllm_non_paged():
    fn = _vllm_varlen()
    g = torch.Generator().manual_seed(2)
    q = torch.randn(5, 4, 64, generator=g).to(DTYPE).to(DEVICE)
    k = torch.randn(9, 2, 64, generator=g).to(DTYPE).to(DEVICE)
    v = torch.randn(9, 2, 64, generator=g).to(DTYPE).to(DEVICE)
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE)
    out = fn(q, k, v, 3, cu_q, 5, cu_seqlens_k=cu_k, causal=True)
    # reference: each request's keys as a page-size-1 cache
    table = torch.tensor([[0, 1, 2, 3, 0], [4, 5, 6, 7, 8]], dtype=torch.int32)
    ref, _ = reference.paged_attention(q.cpu(), k.cpu()[:, None], v.cpu()[:, None], torch.tensor([4, 5]), table,
                                       cu_q.cpu(), causal=True)
    assert_close(out, ref, DTYPE)


@pytest.mark.parametrize("q_lens", [(1, 1), (1, 3)])
def test_vllm_mla_latent_cache(q_lens):
    """vLLM's MLA call: head dim 576, k the latent cache with one head, v = k[..., :512]."""
    fn = _vllm_varlen()
    g = torch.Generator().manual_seed(3)
    page_size, lens, heads = 4, (6, 9), 2
    num_pages = 6
    cache = torch.randn(num_pages, page_size, 1, 576, generator=g).to(DTYPE).to(DEVICE)
    table = torch.tensor([[3, 1, 0], [2, 5, 4]], dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(q_lens), heads, 576, generator=g).to(DTYPE).to(DEVICE)
    cu = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=DEVICE)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    out = poison(torch.empty(q.shape[0], heads, 512, dtype=DTYPE, device=DEVICE))
    result = fn(q, cache, cache[..., :512], max(q_lens), cu, max(lens), seqused_k=seqlens, causal=True,
                block_table=table, softmax_scale=192**-0.5, out=out)
    assert result is out
    for b in range(2):
        qb = q[cu[b] : cu[b + 1]].cpu()[None]
        ref, _ = reference.mla_decode(qb[..., :512], qb[..., 512:], cache.cpu()[:, :, 0], [lens[b]], table.cpu()[b:b + 1],
                                      192**-0.5)
        assert_close(out[cu[b] : cu[b + 1]], ref[0], DTYPE, what=f"request {b}")
    # sinks (which the MLA kernels lack): the paged kernel at D = 576
    sinks = torch.randn(heads, generator=g)
    got = fn(q, cache, cache[..., :512], max(q_lens), cu, max(lens), seqused_k=seqlens, causal=True, block_table=table,
             softmax_scale=192**-0.5, s_aux=sinks.to(DEVICE))
    ref, _ = reference.paged_attention(q.cpu(), cache.cpu(), cache.cpu()[..., :512], seqlens.cpu(), table.cpu(), cu.cpu(),
                                       softmax_scale=192**-0.5, causal=True, sinks=sinks)
    assert_close(got, ref, DTYPE)


@pytest.mark.parametrize("name, value", [
    ("q_v", "tensor"), ("dropout_p", 0.1), ("return_attn_probs", True),
    ("scheduler_metadata", "tensor"), ("fa_version", 3),
])
def test_vllm_unsupported_arguments_are_named(name, value):
    fn = _vllm_varlen()
    q, k_cache, v_cache, table, cu, seqlens = _paged_case(4)
    value = torch.zeros(1, device=DEVICE) if value == "tensor" else value
    with pytest.raises(ValueError, match=name):
        fn(q, k_cache, v_cache, 3, cu, 11, seqused_k=seqlens, block_table=table, **{name: value})


def test_vllm_paged_needs_lengths_and_non_paged_needs_cu_seqlens_k():
    fn = _vllm_varlen()
    q, k_cache, v_cache, table, cu, seqlens = _paged_case(5)
    with pytest.raises(ValueError, match="seqused_k"):
        fn(q, k_cache, v_cache, 3, cu, 11, block_table=table)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        fn(q, k_cache, v_cache, 3, cu, 11, seqused_k=seqlens)


def test_vllm_non_attention_stand_ins():
    from triton_xpu_attn.compat.vllm_xpu_kernels import fused_moe_interface, rotary

    with pytest.raises(NotImplementedError, match="apply_rotary_emb"):
        rotary.apply_rotary_emb(None, None, None, True)
    with pytest.raises(NotImplementedError, match="XpuFusedMoe"):
        fused_moe_interface.XpuFusedMoe()
