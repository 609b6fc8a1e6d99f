"""Loads sglang 0.5.23's real ``XPUAttentionBackend`` over triton_xpu_attn (through
``triton_xpu_attn.compat.install()``) and builds its inputs: a model-runner namespace, sglang's own
token pools, ``RadixAttention`` layers and ``ForwardBatch``es.

The sglang package comes from a site folder built by ``.ci/sglang_env.sh`` (``sglang==0.5.23
--no-deps`` plus a few pure-Python dependencies), named by the environment variable
``TRITON_XPU_ATTN_SGLANG_SITE``. Modules sglang's import chain asks for but the attention path never
runs are stubbed in ``sys.modules`` (``STUBS`` below: each with why; the stand-in machinery is
tests/engine_stand_ins.py, shared with the vLLM harness).
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace

import engine_stand_ins

SITE_ENV = "TRITON_XPU_ATTN_SGLANG_SITE"

# Stubbed top-level modules (permissive placeholders: any attribute is a class, a call on a function
# returns it unchanged, iteration is empty). None of them runs on the attention path.
STUBS = {
    "transformers": "model/tokenizer configs and HF patches at import; the tests build the model config themselves",
    "huggingface_hub": "model downloads",
    "safetensors": "weight loading",
    "sentencepiece": "tokenizers",
    "tvm_ffi": "apache-tvm-ffi, JIT kernels of sglang.kernels for CUDA (compiled runtime)",
    "torchvision": "multimodal processors; the PyPI wheel drags in a CUDA torch of several GB",
    "PIL": "pillow, multimodal inputs",
    "pydantic": "OpenAI-protocol request models of the HTTP server",
    "pydantic_core": "pydantic's compiled core",
    "openai": "OpenAI client of the server / function-call parsers",
    "partial_json_parser": "function-call parsing of the server",
    "compressed_tensors": "quantized checkpoint formats",
    "gguf": "GGUF checkpoint loading",
    "einops": "tensor reshapes in model files",
    "zmq": "pyzmq, the scheduler/tokenizer IPC of the server",
    "aiohttp": "HTTP client of the server",
    "orjson": "JSON of the HTTP server",
    "pybase64": "base64 of multimodal requests",
    "psutil": "process/memory probes of the server",
    "IPython": "notebook display helpers",
    "yaml": "pyyaml, config files of the PD-multiplexing runner (imported by the graph-runner module that set_kv_buffer consults)",
}
# Aliases: the stdlib module stands in for a compiled one with the same API for what is used.
ALIASES = {"regex": "re"}  # `import regex as re` in parsers; patterns compiled at import are stdlib-compatible


_STAND_INS = engine_stand_ins.StandIns(STUBS, ALIASES)
_BACKEND_MODULE = None


def stubbed():
    """The stubs answer imports only inside this block (sglang imports some lazily, during a
    forward): afterwards the stub modules leave ``sys.modules`` (sglang's modules keep their
    references), so the rest of a pytest run imports exactly as it would without these tests."""
    return _STAND_INS.active()


def site_dir() -> str | None:
    return engine_stand_ins.site_from_env(SITE_ENV, "sglang")


def load_xpu_backend():
    """Import ``sglang.srt.layers.attention.xpu_backend`` with our compat module as ``sgl_kernel``
    (call it inside :func:`stubbed`)."""
    global _BACKEND_MODULE
    if _BACKEND_MODULE is not None:
        return _BACKEND_MODULE
    engine_stand_ins.install_engine(SITE_ENV, "sglang", "sgl_kernel", ".ci/sglang_env.sh")
    with engine_stand_ins.cuda_hidden():
        module = importlib.import_module("sglang.srt.layers.attention.xpu_backend")
        importlib.import_module("sglang.srt.mem_cache.memory_pool")
        importlib.import_module("sglang.srt.mem_cache.swa_memory_pool")
    assert module.flash_attn_with_kvcache.__module__ == "triton_xpu_attn.compat.sgl_kernel.flash_attn"
    _BACKEND_MODULE = module
    return module


def runtime_config(module, *, topk=None, num_draft_tokens=None):
    """sglang's process-wide runtime config, which the server publishes at launch: the parallel
    widths through sglang's own ``get_parallel().override_permanently`` (one rank, no DCP), and the
    three config bags the backend module reads (``get_spec`` / ``get_exec`` / ``get_schedule``,
    which need a published ``ServerArgs``) answered as its module globals."""
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(tp_size=1, attn_dcp_size=1, attn_dcp_rank=0)
    module.get_spec = lambda: SimpleNamespace(
        speculative_eagle_topk=topk, speculative_num_draft_tokens=num_draft_tokens
    )
    module.get_exec = lambda: SimpleNamespace(
        deterministic=SimpleNamespace(enable_deterministic_inference=False)
    )
    module.get_schedule = lambda: SimpleNamespace(disable_chunked_prefix_cache=False)
