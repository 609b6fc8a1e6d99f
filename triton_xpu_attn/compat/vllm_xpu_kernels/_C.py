"""Stand-in for vllm-xpu-kernels' ``_C`` extension, which vLLM imports to register its
``torch.ops._C`` kernels. Of those, ``torch.ops._C.merge_attn_states(output, output_lse,
prefix_output, prefix_lse, suffix_output, suffix_lse, prefill_tokens_with_context=None,
output_scale=None)`` (vllm-xpu-kernels' schema; vLLM's chunked prefill and cascade attention call
it) is registered here, served by :func:`triton_xpu_attn.merge_attn_states`. The other ``_C``
kernels are not registered (a call fails in torch naming the op); nothing is registered where
``torch.ops._C`` already has the op (the real extension loaded too). Importing this module also
registers the KV-cache ops of ``torch.ops._C_cache_ops`` (:mod:`._C_cache_ops`), as the real
extension does.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._stand_ins import op_defined

from triton_xpu_attn import merge_attn_states as _merge_attn_states

NAMESPACE = "_C"


def _defined(name: str) -> bool:
    return op_defined(NAMESPACE, name)


if not _defined("merge_attn_states"):
    @torch.library.custom_op(f"{NAMESPACE}::merge_attn_states", mutates_args=("output", "output_lse"))
    def merge_attn_states(output: Tensor, output_lse: Optional[Tensor], prefix_output: Tensor, prefix_lse: Tensor,
                          suffix_output: Tensor, suffix_lse: Tensor, prefill_tokens_with_context: Optional[int] = None,
                          output_scale: Optional[Tensor] = None) -> None:
        """Merge prefix and suffix attention states into ``output`` (and ``output_lse``) in place."""
        _merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                           prefill_tokens_with_context, output_scale)


from . import _C_cache_ops  # noqa: E402,F401  (the real _C extension registers torch.ops._C_cache_ops too)
