"""``vllm_xpu_kernels`` as vLLM's XPU platform imports it, served by triton_xpu_attn. Made
importable as ``vllm_xpu_kernels`` by :func:`triton_xpu_attn.compat.install`.

What vLLM imports (vllm ``_xpu_ops.py``, ``platforms/xpu.py``, ``device_allocator/xpumem.py``,
``fused_moe/experts/xpu_moe.py``):

- ``flash_attn_interface.flash_attn_varlen_func``: every attention layer (paged through
  ``block_table``, MLA with head dim 576, ragged prefill). Served by our ops.
- ``_C``, ``_moe_C``, ``_xpu_C``: extension modules imported for their side effect of registering
  ``torch.ops`` kernels; here ``_C`` registers ``torch.ops._C.merge_attn_states``, the DSA indexer's
  top-k (``top_k_per_row_prefill`` / ``top_k_per_row_decode``) and the KV-cache
  ops of ``torch.ops._C_cache_ops`` (``reshape_and_cache``, ``reshape_and_cache_flash``,
  ``concat_and_cache_mla``, ``gather_cache`` / ``cp_gather_cache``, ``gather_and_maybe_dequant_cache``,
  ``indexer_k_quant_and_cache``, ``cp_gather_indexer_k_quant_cache``), ``_xpu_C`` the DSA indexer
  logits; the rest register nothing
  (vLLM probes them with ``hasattr``, and a call of an unregistered op fails in torch naming it).
- ``rotary.apply_rotary_emb``, ``fused_moe_interface.XpuFusedMoe`` / ``xpu_fused_moe``: not
  attention; importable, ``NotImplementedError`` on use.
- ``xpumem_allocator``, ``quantization``: absent (vLLM imports them inside ``try``/``except
  ImportError``).
"""
from . import flash_attn_interface  # noqa: F401

__all__ = ["flash_attn_interface"]
