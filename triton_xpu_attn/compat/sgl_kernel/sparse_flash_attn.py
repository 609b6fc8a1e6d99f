"""``sgl_kernel.sparse_flash_attn`` as sgl-kernel-xpu lays it out (``python/sgl_kernel/sparse_flash_attn.py``):
vertical/slash sparse attention (MInference; sglang's dual-chunk flash-attention backend imports it),
served by triton_xpu_attn with the same names, parameters and results."""
from __future__ import annotations

from triton_xpu_attn import (
    convert_vertical_slash_indexes,
    convert_vertical_slash_indexes_mergehead,
    sparse_attn_func,
    sparse_attn_varlen_func,
)

__all__ = [
    "convert_vertical_slash_indexes",
    "convert_vertical_slash_indexes_mergehead",
    "sparse_attn_func",
    "sparse_attn_varlen_func",
]
