"""Loads vLLM 0.33.0's real XPU attention code over triton_xpu_attn (through
``triton_xpu_attn.compat.install()``, which serves ``vllm_xpu_kernels``) and builds its inputs: a
``VllmConfig`` with a minimal model config, vLLM's own KV-cache specs and ``CommonAttentionMetadata``,
paged KV caches laid out as vLLM allocates them.

The vllm package comes from a site folder built by ``.ci/vllm_env.sh`` (the Python files of the
``vllm==0.33.0`` wheel, no compiled extension, plus regex, pydantic and its three dependencies),
named by the environment variable ``TRITON_XPU_ATTN_VLLM_SITE``. Modules vLLM's import chain asks
for but the attention path never runs are stubbed in ``sys.modules`` (``STUBS`` below: each with
why; the machinery is tests/engine_stand_ins.py, shared with the sglang harness).

The platform is vLLM's ``XPUPlatform``, installed as ``vllm.platforms.current_platform`` before any
backend module imports (vLLM resolves it lazily; ``torch.xpu.is_available()`` would pick it on an
Intel GPU). Only host facts are answered for the machine the tests run on (:class:`TestHostXPUPlatform`):
pinned host memory exists only where a CUDA runtime does, the device name and compute-unit count
are this machine's, and the dispatch key vLLM registers its own ``torch.ops.vllm`` ops under
(``XPU`` on an Intel GPU) is the one of the tensors here (``CUDA`` on a GPU, ``CPU`` under the
interpreter): the same functions, reached by the same calls.
"""
from __future__ import annotations

import contextlib
import importlib
import os
from types import SimpleNamespace

import torch

import engine_stand_ins

SITE_ENV = "TRITON_XPU_ATTN_VLLM_SITE"

# Stubbed top-level modules; none of them runs on the attention path.
STUBS = {
    "transformers": "HF model/tokenizer configs; the tests build the model config themselves",
    "huggingface_hub": "model downloads",
    "safetensors": "weight loading",
    "tqdm": "progress bars of weight loading",
    "einops": "tensor reshapes in model and kernel-helper files",
    "PIL": "pillow, multimodal inputs",
    "cbor2": "prefix-cache hashing of the KV-cache manager",
    "cachetools": "LRU caches of the multimodal/tokenizer layers",
    "cloudpickle": "serialisation across worker processes",
    "msgspec": "engine-core IPC messages",
    "zmq": "pyzmq, engine-core IPC",
    "psutil": "process and memory probes of the server",
    "cpuinfo": "py-cpuinfo, CPU feature probes",
    "urllib3": "HTTP connections of the server",
    "requests": "HTTP downloads",
    "aiohttp": "HTTP client of the server",
    "fastapi": "the OpenAI-compatible HTTP server",
    "uvloop": "event loop of the server",
    "prometheus_client": "server metrics",
    "pybase64": "base64 of multimodal requests",
    "openai": "OpenAI-protocol request types of the server",
    "openai_harmony": "gpt-oss chat format of the server",
    "partial_json_parser": "tool-call parsing of the server",
    "xgrammar": "structured-output grammars",
    "llguidance": "structured-output grammars",
}
# Real packages of the site folder: they enter ``sys.modules`` only while a vLLM test runs (the
# sglang harness stubs pydantic; its server modules must never meet the real one).
OWN = ("regex", "pydantic", "pydantic_core", "annotated_types", "typing_inspection", "vllm")

_STAND_INS = engine_stand_ins.StandIns(STUBS, own=OWN)
_VLLM = None


@contextlib.contextmanager
def stubbed():
    """The stubs answer imports only inside this block (vLLM imports some lazily, during a forward);
    vLLM's modules and its real packages are in ``sys.modules``, and its site on ``sys.path``, only
    inside it (sglang tries ``from vllm import _custom_ops`` and must fail as without vLLM). On a
    host without an accelerator (the interpreter), ``torch.accelerator.empty_cache`` (which vLLM's
    workspace manager calls before it grows a buffer) has no cache to release and does nothing."""
    with _STAND_INS.active() as stand_ins:
        if torch.accelerator.is_available():
            yield stand_ins
            return
        empty_cache = torch.accelerator.empty_cache
        torch.accelerator.empty_cache = lambda: None
        try:
            yield stand_ins
        finally:
            torch.accelerator.empty_cache = empty_cache


def site_dir() -> str | None:
    return engine_stand_ins.site_from_env(SITE_ENV, "vllm")


@contextlib.contextmanager
def _environ(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _import_triton_utils():
    """``vllm.triton_utils`` keeps the real Triton only when Triton reports one active driver, or
    none in a distributed worker whose ``CUDA_VISIBLE_DEVICES`` is empty. On a GPU the driver is
    active (CUDA not hidden for this import); under the interpreter there is none, so the probe
    runs as such a worker (the variable is restored right after; nothing else reads it then)."""
    if torch.cuda.is_available():
        return importlib.import_module("vllm.triton_utils")
    with _environ(CUDA_VISIBLE_DEVICES=""):
        return importlib.import_module("vllm.triton_utils")


def load_vllm():
    """Import vLLM's XPU platform and attention backends with our compat module as
    ``vllm_xpu_kernels`` (call it inside :func:`stubbed`). Returns a namespace of the modules."""
    global _VLLM
    if _VLLM is not None:
        return _VLLM
    engine_stand_ins.install_engine(SITE_ENV, "vllm", "vllm_xpu_kernels", ".ci/vllm_env.sh", add=_STAND_INS.add_site)
    memory_info = getattr(torch.accelerator, "get_memory_info", None)
    environ = dict(os.environ)  # vllm.env_override sets variables for its server processes
    host_dispatch_key = "CUDA" if torch.cuda.is_available() else "CPU"  # read before CUDA is hidden
    try:
        with engine_stand_ins.cuda_hidden():
            platforms = importlib.import_module("vllm.platforms")
            xpu = importlib.import_module("vllm.platforms.xpu")  # registers our vllm_xpu_kernels ops
            assert platforms._current_platform is None, "vLLM resolved a platform before the XPU one was set"

            class TestHostXPUPlatform(xpu.XPUPlatform):
                """vLLM's XPU platform; only facts of the host the tests run on are its own."""

                dispatch_key = host_dispatch_key

                @classmethod
                def is_pin_memory_available(cls):
                    return torch.cuda.is_available()

                @classmethod
                def get_device_name(cls, device_id: int = 0) -> str:
                    return torch.cuda.get_device_name(device_id) if torch.cuda.is_available() else "cpu"

                @classmethod
                def num_compute_units(cls, device_id: int | None = 0) -> int:
                    if torch.cuda.is_available():
                        return torch.cuda.get_device_properties(device_id or 0).multi_processor_count
                    return os.cpu_count() or 1

            platforms._current_platform = TestHostXPUPlatform()
        _import_triton_utils()
        with engine_stand_ins.cuda_hidden():
            names = {
                "xpu": "vllm.platforms.xpu",
                "fa_utils": "vllm.v1.attention.backends.fa_utils",
                "flash_attn": "vllm.v1.attention.backends.flash_attn",
                "flashattn_mla": "vllm.v1.attention.backends.mla.flashattn_mla",
                "mla_attention": "vllm.model_executor.layers.attention.mla_attention",
                "mla_prefill": "vllm.v1.attention.backends.mla.prefill",
                "backend": "vllm.v1.attention.backend",
                "selector": "vllm.v1.attention.selector",
                "registry": "vllm.v1.attention.backends.registry",
                "kv_cache_interface": "vllm.v1.kv_cache_interface",
                "config": "vllm.config",
                "import_utils": "vllm.utils.import_utils",
                "triton_utils": "vllm.triton_utils",
                "custom_ops": "vllm._custom_ops",
                "xpu_ops": "vllm._xpu_ops",
                "forward_context": "vllm.forward_context",
                "workspace": "vllm.v1.worker.workspace",
                "indexer": "vllm.v1.attention.backends.mla.indexer",
                "sparse_attn_indexer": "vllm.model_executor.layers.sparse_attn_indexer",
                "xpu_mla_sparse": "vllm.v1.attention.backends.mla.xpu_mla_sparse",
            }
            modules = {key: importlib.import_module(name) for key, name in names.items()}
    finally:
        if memory_info is not None:  # vllm.platforms.xpu replaces it process-wide
            torch.accelerator.get_memory_info = memory_info
        os.environ.clear()
        os.environ.update(environ)
    ns = SimpleNamespace(**modules, platform=platforms.current_platform)
    assert ns.platform.is_xpu() and ns.triton_utils.HAS_TRITON
    assert ns.fa_utils.flash_attn_varlen_func.__module__ == "vllm._xpu_ops"
    _VLLM = ns
    return ns


class ModelConfig:
    """The fields of vLLM's ``ModelConfig`` the attention builders and MLA layers read."""

    def __init__(self, *, num_heads, head_size, dtype, max_model_len=4096, mla=None):
        self.num_heads, self.head_size, self.dtype = num_heads, head_size, dtype
        self.max_model_len = max_model_len
        self.hf_text_config = SimpleNamespace(**(mla or {}))
        self.hf_config = SimpleNamespace(model_type="deepseek_v2" if mla else "llama")
        self.rswa_window = None
        self.is_mm_prefix_lm = False
        self.is_diffusion = False
        self.use_mla = bool(mla)
        self.quantization = None
        self.enable_sleep_mode = False

    def get_num_attention_heads(self, parallel_config=None):
        return self.num_heads

    def get_head_size(self):
        return self.head_size


def vllm_config(vl, model_config, *, cache_dtype="auto", block_size=64):
    """A ``VllmConfig`` of vLLM's defaults with ``model_config`` and the cache dtype / block size (and
    the sparse MLA prefill workspace factor ``VllmConfig`` derives from a model config: 5 up to 256K
    tokens)."""
    config = vl.config.VllmConfig()
    object.__setattr__(config, "model_config", model_config)
    if config.attention_config.sparse_mla_prefill_workspace_factor is None:
        factor = 5 if model_config.max_model_len <= 256 * 1024 else 2
        config.attention_config.sparse_mla_prefill_workspace_factor = factor
    config.cache_config.cache_dtype = cache_dtype
    config.cache_config.block_size = block_size
    return config


def common_metadata(vl, *, query_lens, seq_lens, block_table, slot_mapping, device, causal=True):
    """vLLM's ``CommonAttentionMetadata`` for one batch (decodes first, as vLLM orders it)."""
    q_cpu = torch.tensor([0] + list(query_lens), dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seq_cpu = torch.tensor(list(seq_lens), dtype=torch.int32)
    return vl.backend.CommonAttentionMetadata(
        query_start_loc=q_cpu.to(device),
        query_start_loc_cpu=q_cpu,
        seq_lens=seq_cpu.to(device),
        num_reqs=len(query_lens),
        num_actual_tokens=int(sum(query_lens)),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=block_table,
        slot_mapping=slot_mapping,
        causal=causal,
        seq_lens_cpu_upper_bound=seq_cpu,
    )
