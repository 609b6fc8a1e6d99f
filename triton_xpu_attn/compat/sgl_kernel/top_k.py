"""``sgl_kernel.top_k`` as sgl-kernel-xpu lays it out (``python/sgl_kernel/top_k.py``): DeepSeek
sparse attention's indexer top-k functions, which its package root re-exports, served by
triton_xpu_attn (sglang's DSA backend imports them from the root)."""
from __future__ import annotations

from triton_xpu_attn import (
    fast_topk_transform_fused,
    fast_topk_transform_ragged_fused,
    fast_topk_v2,
    topk_transform_512,
    topk_transform_512_v2,
)

__all__ = [
    "fast_topk_transform_fused",
    "fast_topk_transform_ragged_fused",
    "fast_topk_v2",
    "topk_transform_512",
    "topk_transform_512_v2",
]
