"""Stand-in for vllm-xpu-kernels' ``_C`` extension, which vLLM imports to register its
``torch.ops._C`` kernels. Of those, these are registered here (vllm-xpu-kernels' schemas), served
by triton_xpu_attn:

- ``merge_attn_states(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
  prefill_tokens_with_context=None, output_scale=None)`` (vLLM's chunked prefill and cascade
  attention): :func:`triton_xpu_attn.merge_attn_states`;
- ``top_k_per_row_prefill(logits, rowStarts, rowEnds, indices, numRows, stride0, stride1, topK)``
  and ``top_k_per_row_decode(logits, next_n, seq_lens, indices, numRows, stride0, stride1, topK)``
  (the DSA indexer's top-k, vLLM's ``sparse_attn_indexer``): :func:`triton_xpu_attn.fast_topk_v2`
  into ``indices`` in place. Prefill row ``r`` selects among ``logits[r, rowStarts[r] :
  rowEnds[r]]``, positions relative to ``rowStarts[r]``; decode row ``r`` among its first
  ``seq_lens[r // next_n] - next_n + r % next_n + 1`` columns (a ``[numRows / next_n, next_n]``
  ``seq_lens`` with ``next_n > 1`` holds each row's length itself, vLLM's native-MTP form). Rows
  no longer than ``topK`` give ``0 .. n-1`` then ``-1``; longer rows exactly ``topK`` positions
  (here in ascending order; upstream leaves the order open).

The other ``_C`` kernels are not registered (a call fails in torch naming the op); nothing is
registered where ``torch.ops._C`` already has the op (the real extension loaded too). Importing
this module also registers the KV-cache ops of ``torch.ops._C_cache_ops`` (:mod:`._C_cache_ops`),
as the real extension does.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._stand_ins import op_defined

from triton_xpu_attn import merge_attn_states as _merge_attn_states
from triton_xpu_attn._common import INDEX_DTYPES, check_tensor
from triton_xpu_attn.ops import topk as _topk

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


def _check_rows(logits: Tensor, indices: Tensor, numRows: int, stride0: int, stride1: int, topK: int) -> None:
    """Upstream's checks of the row count, strides and output shape (dtypes and layout are checked by
    the top-k op)."""
    check_tensor("logits", logits, ndim=2)
    if numRows != logits.shape[0]:
        raise ValueError(f"numRows must be logits.shape[0] ({logits.shape[0]}), got {numRows}")
    if (stride0, stride1) != logits.stride():
        raise ValueError(f"stride0, stride1 must be logits.stride() {logits.stride()}, got ({stride0}, {stride1})")
    check_tensor("indices", indices, shape=(numRows, topK))


if not _defined("top_k_per_row_prefill"):
    @torch.library.custom_op(f"{NAMESPACE}::top_k_per_row_prefill", mutates_args=("indices",))
    def top_k_per_row_prefill(logits: Tensor, rowStarts: Tensor, rowEnds: Tensor, indices: Tensor, numRows: int,
                              stride0: int, stride1: int, topK: int) -> None:
        """Top-``topK`` positions of ``logits[r, rowStarts[r] : rowEnds[r]]`` into ``indices`` (relative, -1 padded)."""
        _check_rows(logits, indices, numRows, stride0, stride1, topK)
        check_tensor("rowStarts", rowStarts, dtypes=INDEX_DTYPES, shape=(numRows,))
        check_tensor("rowEnds", rowEnds, dtypes=INDEX_DTYPES, shape=(numRows,))
        _topk.fast_topk_v2(logits, rowEnds - rowStarts, topK, rowStarts, out=indices)

if not _defined("top_k_per_row_decode"):
    @torch.library.custom_op(f"{NAMESPACE}::top_k_per_row_decode", mutates_args=("indices",))
    def top_k_per_row_decode(logits: Tensor, next_n: int, seq_lens: Tensor, indices: Tensor, numRows: int,
                             stride0: int, stride1: int, topK: int) -> None:
        """Top-``topK`` positions of each decode row's first ``seq_lens``-derived columns into ``indices``."""
        _check_rows(logits, indices, numRows, stride0, stride1, topK)
        if not isinstance(next_n, int) or next_n < 1 or numRows % next_n:
            raise ValueError(f"next_n must be a positive divisor of numRows ({numRows}), got {next_n}")
        check_tensor("seq_lens", seq_lens, dtypes=INDEX_DTYPES)
        batch = numRows // next_n
        if seq_lens.dim() == 2 and next_n > 1 and tuple(seq_lens.shape) == (batch, next_n):
            lengths = seq_lens.reshape(-1)  # each row's own length
        elif seq_lens.dim() in (1, 2) and seq_lens.shape[0] == batch and seq_lens.numel() == batch:
            row = torch.arange(numRows, device=seq_lens.device, dtype=seq_lens.dtype)
            lengths = seq_lens.reshape(-1).repeat_interleave(next_n) - next_n + row % next_n + 1
        else:
            raise ValueError(f"seq_lens must have shape ({batch},), ({batch}, 1) or ({batch}, {next_n}), "
                             f"got {tuple(seq_lens.shape)}")
        _topk.fast_topk_v2(logits, lengths, topK, out=indices)


from . import _C_cache_ops  # noqa: E402,F401  (the real _C extension registers torch.ops._C_cache_ops too)
