"""Which load path and which launch options each Intel Triton generation gets, and that the paths
it gets compute the right numbers.

Each generation is simulated under the interpreter by changing what the probes see
(``device.language_builds`` calls ``triton.language``'s builtins; ``device.xpu_option_fields``
reads the Intel backend's options dataclass), with the launchers believing they run on XPU:

* ``xpu-3.3``: block pointers build, no ``tl.make_tensor_descriptor``; options ``threads_per_warp``
  and ``grf_mode`` ``'small'``/``'large'`` (triton-xpu 3.3.0b1, the last Intel Triton on PyPI);
* ``xpu-3.7``: both build; options ``warp_size`` and ``grf_mode`` ``'128'``/``'256'``/``'512'``
  (torch's XPU wheels: torch 2.11 pins triton-xpu 3.7.0, torch 2.13 3.7.2);
* ``xpu-main``: ``make_block_ptr`` / ``advance`` present but raising ``NotImplementedError`` (Intel's
  main, 3.8.0, since 2026-07-23), descriptors build;
* ``no-2d``: descriptors absent, block pointers raising: pointer loads.

Launches are spied on (the constexprs and options the kernel gets) and compared with the float64
references. The interpreter (Triton 3.9) has no block pointers, so the ``xpu-3.3`` launches are
checked for their chosen path only, and run where the installed Triton builds block pointers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import types

import pytest
import torch
import triton.language as tl
from triton.backends import backends

from helpers import DEVICE, INTERPRET, assert_close
from triton_xpu_attn import _common
from triton_xpu_attn import device as _device
from triton_xpu_attn import flash_attn_with_kvcache, flash_mla_decode, flash_mla_prefill
from triton_xpu_attn import reference as ref
from triton_xpu_attn import tune
from triton_xpu_attn.ops import mla, mla_decode, mla_prefill, paged_attention, paged_launch

pytestmark = pytest.mark.skipif(not INTERPRET, reason="simulates XPU launches under the interpreter")

#: what the real Triton here builds, before any test changes it
REAL_BLOCK_POINTERS = _device.block_pointers()
REAL_DESCRIPTORS = _device.language_builds("make_tensor_descriptor")


@tl.core.builtin
def _working_block_ptr(base, shape, strides, offsets, block_shape, order, _semantic=None):
    """A block-pointer builtin that builds (as in Triton 3.3-3.8): it hands its arguments on."""
    return _semantic.make_block_ptr(base, shape, strides, offsets, block_shape, order)


@tl.core.builtin
def _working_advance(base, offsets, _semantic=None):
    return _semantic.advance(base, offsets)


@tl.core.builtin
def _removed_block_ptr(base, shape, strides, offsets, block_shape, order, _semantic=None):
    """Upstream 3.9's and Intel main's ``make_block_ptr``."""
    raise NotImplementedError("Block pointers have been removed in favor of the tensor descriptor API")


@tl.core.builtin
def _removed_advance(base, offsets, _semantic=None):
    raise NotImplementedError("Block pointers have been removed in favor of the tensor descriptor API")


@dataclasses.dataclass(frozen=True)
class _Options33:
    """triton-xpu 3.3.0b1's XPUOptions, the fields that matter here."""
    num_warps: int = 4
    num_stages: int = 2
    threads_per_warp: int = 32
    grf_mode: tuple = ("small", "large", "auto", "default")
    generate_native_code: bool = False


@dataclasses.dataclass(frozen=True)
class _Options37:
    """Intel's Triton 3.6+ XPUOptions (``threads_per_warp`` renamed ``warp_size``)."""
    num_warps: int = 4
    num_stages: int = 2
    warp_size: int = 32
    grf_mode: str = "default"
    generate_native_code: bool = False


def _intel_backend(options_cls):
    """A stand-in for ``triton.backends.backends['intel']`` whose compiler's ``parse_options``
    sees ``options_cls`` as ``XPUOptions`` (where ``device.xpu_option_fields`` reads it)."""
    def parse_options(self, opts):
        return XPUOptions(**opts)  # noqa: F821  (resolved in the globals below)

    fn = types.FunctionType(parse_options.__code__, {"XPUOptions": options_cls}, "parse_options")
    return types.SimpleNamespace(compiler=type("XPUBackend", (), {"parse_options": fn}))


#: generation -> (version, block pointers: "build" / "raise" / "absent", descriptors, options class,
#: expected tile loads, sub-group option, 256-GRF spelling)
GENERATIONS = {
    "xpu-3.3": ("3.3.0b1", "build", False, _Options33, "block_ptr", "threads_per_warp", "large"),
    "xpu-3.7": ("3.7.2", "build", True, _Options37, "descriptor", "warp_size", "256"),
    "xpu-main": ("3.8.0", "raise", True, _Options37, "descriptor", "warp_size", "256"),
    "no-2d": ("3.8.0", "absent", False, _Options37, "pointer", "warp_size", "256"),
}
#: KV_LOAD of a one-page key tile in each generation's tile loads
KV_LOAD = {"block_ptr": 2, "descriptor": 3, "pointer": 0}


@pytest.fixture(params=list(GENERATIONS))
def generation(request, monkeypatch):
    """Make the probes see ``request.param``'s Triton and the launchers believe they run on XPU."""
    version, block_ptrs, descriptors, options, *_ = GENERATIONS[request.param]
    if block_ptrs == "build":
        monkeypatch.setattr(tl, "make_block_ptr", _working_block_ptr)
        monkeypatch.setattr(tl, "advance", _working_advance, raising=False)
    elif block_ptrs == "raise":
        monkeypatch.setattr(tl, "make_block_ptr", _removed_block_ptr)
        monkeypatch.setattr(tl, "advance", _removed_advance, raising=False)
    else:
        monkeypatch.delattr(tl, "make_block_ptr", raising=False)
        monkeypatch.delattr(tl, "advance", raising=False)
    if not descriptors:
        monkeypatch.delattr(tl, "make_tensor_descriptor", raising=False)
    monkeypatch.setitem(backends, "intel", _intel_backend(options))
    monkeypatch.setattr(_device, "triton_version", lambda: version)
    monkeypatch.setattr(_device, "backend", lambda: "xpu")
    monkeypatch.setattr(_common, "check_kernel_device", lambda name, device: None)  # CPU tensors, "XPU" launches
    _device.forget_probes()
    tune.clear_cache()
    yield request.param
    _device.forget_probes()  # before monkeypatch restores the real Triton: the next probe reads it
    tune.clear_cache()


class _Spy:
    """Stands in for a kernel: records each launch's keyword arguments, then launches the real
    kernel (``run=False``: records only)."""

    def __init__(self, kernel, run=True):
        self.kernel, self.run, self.launches = kernel, run, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(kwargs)
            if self.run:
                return self.kernel[grid](*args, **kwargs)
        return launch


def _runs(name: str) -> bool:
    """Whether this generation's launches can run under the installed interpreter (the block
    pointers of ``xpu-3.3`` need a Triton that builds them: not 3.9)."""
    return GENERATIONS[name][4] != "block_ptr" or REAL_BLOCK_POINTERS


def test_probe_reads_what_each_generation_builds(generation):
    """``language_builds`` / ``block_pointers`` / ``device_descriptors`` / ``xpu_tile_loads``
    follow what the builtins do, not their presence: a ``make_block_ptr`` that raises is absent."""
    _, block_ptrs, descriptors, _, loads, sub_group, large = GENERATIONS[generation]
    assert _device.block_pointers() == (block_ptrs == "build")
    assert _device.language_builds("make_block_ptr") == (block_ptrs == "build")
    assert _device.device_descriptors() == descriptors
    assert _device.xpu_tile_loads() == loads
    assert _device.xpu_sub_group_option() == sub_group
    assert _device.xpu_large_grf_mode() == large
    assert not _device.language_builds("no_such_builtin")


def test_probe_of_the_installed_triton():
    """Upstream Triton 3.9 (the interpreter here) keeps ``make_block_ptr`` as a raising stub and
    has no ``tl.advance``: no block pointers; descriptors build. A probe never raises."""
    import triton

    major_minor = tuple(int(x) for x in triton.__version__.split(".")[:2])
    if major_minor >= (3, 9):
        assert hasattr(tl, "make_block_ptr") and not REAL_BLOCK_POINTERS
        assert REAL_DESCRIPTORS
    assert _device.language_builds("dot") and _device.language_builds("load")


@pytest.mark.parametrize("decode_like, head_dim, page_size, fp8", [
    (True, 64, 32, False), (True, 128, 64, False), (False, 128, 16, False), (True, 256, 64, True),
    (True, 64, 1, False), (False, 64, 0, False),
])
def test_xpu_configs_choose_the_generations_load_path(generation, decode_like, head_dim, page_size, fp8):
    """The XPU heuristic's tiles (``xpu_tiles``, also the shipped files' rules) read one-page key
    tiles through device-side descriptors where Triton builds them, block pointers where only
    they exist, pointers otherwise; pages shorter than a tile always gather. fp8 decode's score
    chunks and one-query decode's 16-head q / out blocks follow either 2D path. A shipped file,
    which asks for block pointers only (``kv_block_ptr``), still gets the heuristic's descriptor
    request (file entries override the heuristic's keys); one that sets ``kv_device_desc`` false
    gets block pointers where they build."""
    loads = GENERATIONS[generation][4]
    cfg = paged_attention.xpu_tiles(decode_like, head_dim, page_size, fp8)
    block_n = cfg["BLOCK_N"]
    in_page = page_size == 0 or page_size >= block_n
    k = torch.zeros(4, max(page_size, 1), 2, head_dim)
    expected = KV_LOAD[loads] if in_page else 0
    kv_load = paged_attention._kv_load(page_size, cfg, None, (k, k))
    assert kv_load == expected
    # a config file may opt out of descriptors (``kv_device_desc: false``): block pointers where they build
    opted_out = paged_attention._kv_load(page_size, {**cfg, "kv_device_desc": False}, None, (k, k))
    assert opted_out == (2 if in_page and _device.block_pointers() else 0)
    assert paged_attention.score_chunk(cfg, kv_load, head_dim) == (128 if fp8 and kv_load else 0)
    heads = paged_attention.query_heads_per_block(4, 1 if decode_like else None, cfg)
    assert heads == (16 if decode_like and in_page else (1 if head_dim > 128 and not decode_like else 4))
    unaligned = torch.zeros(k.numel() + 1)[1:].view(k.shape)  # base 4 bytes past a 16-byte boundary
    if kv_load == 3:  # descriptor rows need 16-byte aligned bases and pitches; XPU block pointers 64: gathers
        assert paged_attention._kv_load(page_size, cfg, None, (unaligned, unaligned)) == 0


def test_block_pointer_tiles_need_64_byte_aligned_bases_on_xpu(generation):
    """triton-xpu 3.3 reads a 2D block from a base off 64 bytes at the wrong columns (BMG), so on
    XPU block-pointer K/V (``kv_block_ptr``) take only caches whose base and strides are 64-byte
    aligned: a 16-bit head of 80 or 400 channels (160 / 800 bytes) or a base 32 bytes in gathers;
    128 channels keep their 2D reads."""
    cfg = dict(BLOCK_N=16, kv_block_ptr=True)
    two_d = 2 if _device.block_pointers() else 0
    for head_dim, offset, expected in ((128, 0, two_d), (64, 0, two_d), (80, 0, 0), (400, 0, 0), (128, 16, 0)):
        k = torch.zeros(4 * 16 * 2 * head_dim + offset, dtype=torch.float16)[offset:].view(4, 16, 2, head_dim)
        assert paged_attention._kv_load(16, cfg, None, (k, k)) == expected, (head_dim, offset)


def test_launch_options_in_the_generations_spelling(generation, monkeypatch):
    """``tune.launch_options`` states the DPAS sub-group size (16) under the name the backend's
    options dataclass has (``warp_size`` from Intel's 3.6, ``threads_per_warp`` before) and
    spells ``grf_mode`` as it takes it; a mode it lacks (``'512'`` before 3.7.2) and 256 GRF
    above 32 warps raise; a config's ``sub_group_size`` wins."""
    _, _, _, _, _, sub_group, large = GENERATIONS[generation]
    cfg = paged_attention.xpu_tiles(True, 128, 64)
    assert tune.launch_options(cfg) == {"num_warps": 8, "num_stages": 1, sub_group: 16, "grf_mode": large}
    assert tune.launch_options({**cfg, "grf_mode": "large"})["grf_mode"] == large
    assert tune.launch_options({**cfg, "grf_mode": "small"})["grf_mode"] == ("small" if large == "large" else "128")
    assert tune.launch_options({**cfg, "sub_group_size": 32})[sub_group] == 32
    assert tune.xpu_launch_options({"num_warps": 4}, dots=False) == {"num_warps": 4}
    assert tune.launch_options({"num_warps": 4, "grf_mode": "auto"})["grf_mode"] == "auto"
    with pytest.raises(ValueError, match="32 warps"):
        tune.launch_options({**cfg, "num_warps": 64})
    if large == "large":
        with pytest.raises(ValueError, match="not one this Intel Triton"):
            tune.launch_options({**cfg, "grf_mode": "512"})
    else:
        assert tune.launch_options({**cfg, "grf_mode": "512"})["grf_mode"] == "512"
        monkeypatch.setattr(_device, "triton_version", lambda: "3.7.0")  # torch 2.11's: no 512 yet
        with pytest.raises(ValueError, match="not one this Intel Triton"):
            tune.launch_options({**cfg, "grf_mode": "512"})
    mla_cfg = mla.xpu_tiles(16, 512)
    assert mla.launch_constexprs(mla_cfg, 64)[sub_group] == 16


@pytest.mark.parametrize("warps, columns, expected", [(4, 0, 4), (4, 256, 4), (4, 512, 8), (2, 256, 4), (8, 64, 8),
                                                      (1, 65, 2), (16, 512, 16)])
def test_fp32_dots_get_warps_that_cover_their_columns_on_xpu(generation, warps, columns, expected):
    """An fp32 dot (Intel's FMA path) whose accumulator would repeat along N (N above 64 x warps) is
    computed wrongly by triton-xpu 3.3 (docs/xpu.md, "fp32 dots"): on XPU ``tune.launch_options``
    raises the warps to cover the widest fp32 dot; a launch without fp32 dots keeps its warps, and
    so does every launch elsewhere (MLA's options go through the same place)."""
    assert tune.launch_options({"num_warps": warps}, fp32_dot_columns=columns)["num_warps"] == expected
    assert mla.launch_constexprs({"num_warps": warps}, 0, fp32_dot_columns=columns)["num_warps"] == expected


def test_fp32_dot_columns_change_nothing_off_xpu(monkeypatch):
    monkeypatch.setattr(_device, "backend", lambda: "cuda")
    assert tune.launch_options({"num_warps": 4}, fp32_dot_columns=512) == {"num_warps": 4}


def test_launch_options_warn_when_the_backend_lacks_one(monkeypatch):
    """An options class without a sub-group size or ``grf_mode`` field: the launch goes without
    it, with a warning (Intel's ``parse_options`` would drop it without one)."""
    @dataclasses.dataclass(frozen=True)
    class Bare:
        num_warps: int = 4
        num_stages: int = 2

    monkeypatch.setattr(_device, "backend", lambda: "xpu")
    monkeypatch.setattr(tune, "_MISSING_OPTIONS", set())
    fields = {f.name: f.default for f in dataclasses.fields(Bare)}
    with pytest.warns(RuntimeWarning, match="takes no"):
        opts = tune.xpu_launch_options({"num_warps": 8, "grf_mode": "256"}, fields=fields)
    assert opts == {"num_warps": 8}


def _paged_case(gen, batch=2, hkv=2, group=4, head_dim=64, page=32, lens=(45, 70), q_lens=(1, 1), dtype=torch.float16):
    width = max(-(-n // page) for n in lens)
    num_pages = batch * width + 2
    k = torch.randn(num_pages, page, hkv, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_pages, page, hkv, head_dim, generator=gen).to(dtype)
    table = torch.randperm(num_pages, generator=gen)[: batch * width].view(batch, width).to(torch.int32)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hkv * group, head_dim, generator=gen).to(dtype)
    return q, k, v, torch.tensor(lens, dtype=torch.int32), table, cu


@pytest.mark.parametrize("case", ["decode", "prefill one head", "fp8 score chunks", "short pages"])
def test_paged_attention_launches_the_generations_path(generation, monkeypatch, case):
    """``flash_attn_with_kvcache`` as XPU launches it in each generation: the K/V load
    (``KV_LOAD``), q / out through descriptors where K/V are (``QO_DESC``: one token's 16-head
    block, one head's tokens), the score chunks, the spelled options; outputs against the
    float64 reference where the interpreter can run the path."""
    loads, sub_group, large = GENERATIONS[generation][4:]
    gen = torch.Generator().manual_seed(3)
    page, q_lens, head_dim, dtype = 32, (1, 1), 64, torch.float16
    config = None
    if case == "prefill one head":
        q_lens = (3, 8)
        config = {**paged_attention.xpu_tiles(False, head_dim, page), "pack_gqa": False, "BLOCK_M": 16}
    elif case == "fp8 score chunks":
        config = {**paged_attention.xpu_tiles(True, head_dim, page, True), "score_chunk": 32}
    elif case == "short pages":
        page = 8
    q, k, v, lens, table, cu = _paged_case(gen, page=page, q_lens=q_lens, head_dim=head_dim, dtype=dtype)
    k_scale = v_scale = None
    if case == "fp8 score chunks":
        k, v = (k.float() * 2).to(torch.float8_e4m3fn), (v.float() * 2).to(torch.float8_e4m3fn)
        k_scale, v_scale = torch.tensor(0.5), torch.tensor(0.25)
    spy = _Spy(paged_launch._paged_attention_kernel, run=_runs(generation))
    monkeypatch.setattr(paged_launch, "_paged_attention_kernel", spy)
    with tune.override("paged_attention", config) if config else contextlib.nullcontext():
        out = flash_attn_with_kvcache(
            q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), cache_seqlens=lens.to(DEVICE), page_table=table.to(DEVICE),
            cu_seqlens_q=cu.to(DEVICE), max_seqlen_q=max(q_lens), causal=True,
            k_descale=None if k_scale is None else k_scale.to(DEVICE),
            v_descale=None if v_scale is None else v_scale.to(DEVICE))
    (launch,) = spy.launches
    kv_load = 0 if case == "short pages" else KV_LOAD[loads]
    assert launch["KV_LOAD"] == kv_load
    assert launch["QO_DESC"] == (kv_load == 3 and case != "short pages")
    assert launch["SCORE_CHUNK"] == (32 if case == "fp8 score chunks" and kv_load else 0)
    assert launch[sub_group] == 16 and launch["grf_mode"] == large
    if kv_load:
        assert launch["num_stages"] == 1  # 2D K/V loads run one stage (their pipeliners)
    if not _runs(generation):
        pytest.skip("block pointers: the installed Triton builds none (path checked, not run)")
    want, _ = ref.paged_attention(q, k, v, lens, table, cu, causal=True, k_descale=k_scale, v_descale=v_scale)
    assert_close(out, want, torch.float16)


@pytest.mark.parametrize("case", ["decode", "decode q_len 2", "prefill"])
def test_mla_launches_the_generations_path(generation, monkeypatch, case):
    """MLA on XPU in each generation: over pages of whole key tiles the latent tile in 64-channel
    chunks (``LATENT_CHUNK``) through device-side descriptors (``LATENT_DESC``, q too for one
    query) or block pointers, pointer loads where neither builds; the spelled options; outputs
    against the float64 reference where the interpreter can run the path."""
    loads, sub_group, large = GENERATIONS[generation][4:]
    gen = torch.Generator().manual_seed(5)
    R, Dr, heads, page = 128, 32, 16, 16
    lens = torch.tensor([37, 20], dtype=torch.int32)
    num_pages = 8
    cache = torch.randn(num_pages, page, R + Dr, generator=gen).half()
    table = torch.tensor([[5, 1, 7], [2, 6, 0]], dtype=torch.int32)
    module = mla_prefill if case == "prefill" else mla_decode
    spy = _Spy(module._mla_attention_kernel, run=_runs(generation))
    monkeypatch.setattr(module, "_mla_attention_kernel", spy)
    if case == "prefill":
        cu = torch.tensor([0, 3, 7], dtype=torch.int32)
        q_nope = torch.randn(7, heads, R, generator=gen).half()
        q_pe = torch.randn(7, heads, Dr, generator=gen).half()
        out = flash_mla_prefill(q_nope.to(DEVICE), q_pe.to(DEVICE), cache.to(DEVICE), cu.to(DEVICE), lens.to(DEVICE),
                                4, table.to(DEVICE), None, 0.1)
    else:
        q_len = 2 if case == "decode q_len 2" else 1
        shape = (2, q_len, heads) if q_len > 1 else (2, heads)
        q_nope = torch.randn(*shape, R, generator=gen).half()
        q_pe = torch.randn(*shape, Dr, generator=gen).half()
        out = flash_mla_decode(q_nope.to(DEVICE), q_pe.to(DEVICE), cache.to(DEVICE), lens.to(DEVICE),
                               table.to(DEVICE), None, 0.1, 1)
    (launch,) = spy.launches
    assert launch["LATENT_CHUNK"] == (64 if loads != "pointer" else 0)
    assert launch["LATENT_DESC"] == (loads == "descriptor")
    assert launch[sub_group] == 16 and launch["grf_mode"] == large
    if not _runs(generation):
        pytest.skip("block pointers: the installed Triton builds none (path checked, not run)")
    if case == "prefill":
        want, _ = ref.mla_prefill(q_nope, q_pe, cache, cu, lens, table, 0.1)
    else:
        want, _ = ref.mla_decode(q_nope, q_pe, cache, lens, table, 0.1)
    assert_close(out, want, torch.float16)
