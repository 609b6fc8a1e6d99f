"""``sgl_kernel.attention`` as sgl-kernel-xpu lays it out (``python/sgl_kernel/attention.py``): the
attention functions its package root re-exports, served by triton_xpu_attn. Of that module's
functions, ``lightning_attention_decode`` is not provided (importing it raises ``ImportError``)."""
from __future__ import annotations

from triton_xpu_attn import (
    flash_mla_decode,
    flash_mla_get_workspace_size,
    flash_mla_prefill,
    flash_mla_prefill_get_workspace_size,
    flash_mla_sparse_fwd,
    flash_mla_with_kvcache,
    merge_state,
    merge_state_v2,
)

__all__ = [
    "flash_mla_decode",
    "flash_mla_get_workspace_size",
    "flash_mla_prefill",
    "flash_mla_prefill_get_workspace_size",
    "flash_mla_sparse_fwd",
    "flash_mla_with_kvcache",
    "merge_state",
    "merge_state_v2",
]
