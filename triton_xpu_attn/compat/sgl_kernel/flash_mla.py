"""``sgl_kernel.flash_mla`` as CUDA sgl-kernel lays it out (FlashMLA's interface): the module sglang's
DeepSeek-V3.2 / V4 backends import ``flash_mla_with_kvcache`` and ``get_mla_metadata`` from off
XPU, served by triton_xpu_attn (``get_mla_metadata()[0]`` is FlashMLA's placeholder object; no
schedule is precomputed)."""
from __future__ import annotations

from triton_xpu_attn import flash_mla_sparse_fwd, flash_mla_with_kvcache, get_mla_metadata
from triton_xpu_attn.ops.mla_sparse_decode import FlashMLASchedMeta

__all__ = ["FlashMLASchedMeta", "flash_mla_sparse_fwd", "flash_mla_with_kvcache", "get_mla_metadata"]
