"""``torch.library`` custom ops for every tensor op of the package (namespace ``triton_xpu_attn``).

The Python functions of the package root keep their drop-in signatures (ints or tensors for
lengths, floats or tensors for scales, tuples for windows, optional ``out=``). A custom op needs a
fixed schema, so each op here wraps one public function with a schema-compatible signature and
carries a fake (meta) implementation that gives the output shapes from the input shapes alone.
``torch.compile(fullgraph=True)`` then sees each call as one opaque node (no graph break), and
``torch.library.opcheck`` passes for each.

Call them as ``torch.ops.triton_xpu_attn.<name>(...)`` or through the functions of this module
(same names, keyword arguments allowed):

=====================================  ===========================================================
custom op                              wraps / differences from the public function
=====================================  ===========================================================
``flash_attn_with_kvcache``            ``cache_seqlens`` a tensor; ``window_size`` as
                                       ``window_left``/``window_right``; descales tensors (a
                                       scalar: a one-element tensor); always returns
                                       ``(out, lse)``, ``lse`` of shape ``[0]`` unless
                                       ``return_softmax_lse``
``flash_attn_with_kvcache_out``        the same, writing ``out`` in place; returns ``lse``
``flash_attn_varlen_func``             ``window_size`` as ``window_left``/``window_right``; descales
                                       tensors; no ``seqused_q``/``qv``/``q_descale`` (unsupported
                                       anyway) and no hints; always returns ``(out, lse)``, ``lse``
                                       of shape ``[0]`` unless ``return_softmax_lse``
``flash_mla_decode``                   ``kv_scale`` a one-element tensor or None; mutates
                                       ``workspace``; always returns ``(out, lse)`` (``lse`` of
                                       shape ``[0]`` unless ``return_lse``)
``flash_mla_prefill``                  ``max_seqlen_q`` an int or None, ``kv_scale`` a one-element
                                       tensor or None; no ``validate``; always returns
                                       ``(out, lse)`` (``lse`` of shape ``[0]`` unless
                                       ``return_lse``)
``flash_mla_sparse_fwd``               no ``out``/``max_logits``/``lse`` outputs to write
                                       into; returns ``(out, max_logits, lse)``
``fp8_mqa_logits``                     ``k_fp8`` and ``k_scale`` as two arguments (not a pair)
``fp8_paged_mqa_logits``               unchanged (``schedule_metadata`` a tensor or None)
``get_paged_mqa_logits_metadata``      unchanged
``flash_mla_with_kvcache``             no ``tile_scheduler_metadata`` / ``num_splits`` (their only
                                       accepted values are the defaults); returns ``(out, lse)``
``merge_state_v2``, ``merge_state``   return ``(v_merged, s_merged)``
``merge_state_v2_out``, ``merge_state_out``  write ``v_merged``, ``s_merged`` in place
``merge_attn_states``                  unchanged (writes ``output`` / ``output_lse`` in place)
``normalize_page_table``               ``max_pages`` required (the output width must not depend on
                                       the values of ``seq_lens``)
``normalize_page_table_out``           writes ``out`` in place
``translate_loc_from_full_to_swa``     unchanged
``make_local_attention_virtual_batches``  graph mode only: ``max_virtual_batches`` required (without
                                       it the output size is ``V``, known only after a device->host
                                       read, which no fake implementation can give); tensors only
                                       (no numpy), no ``validate``
``make_local_attention_virtual_batches_out``  writes the four graph-mode outputs in place
``prepare_swa_spec_page_table``        mutates ``page_table_dst``; returns nothing; no ``validate``
                                       (it synchronises with the host)
``fast_topk_v2``                       unchanged (``topk`` an int)
``fast_topk_transform_fused``          unchanged
``fast_topk_transform_ragged_fused``   unchanged
``topk_transform_512`` (and ``_v2``)   mutates ``out_page_indices`` and ``out_raw_indices``;
                                       returns nothing
``reshape_and_cache_flash``            unchanged (mutates ``key_cache``, ``value_cache``)
``concat_and_cache_mla``               unchanged (mutates ``kv_cache``)
``gather_and_maybe_dequant_cache``     unchanged (mutates ``dst``)
``reshape_and_cache``                  unchanged (mutates ``key_cache``, ``value_cache``)
``gather_cache``                       unchanged (mutates ``dst``)
``indexer_k_quant_and_cache``          unchanged (mutates ``kv_cache``)
``cp_gather_indexer_k_quant_cache``    unchanged (mutates ``dst_k``, ``dst_scale``)
``convert_vertical_slash_indexes``     unchanged (and ``_mergehead``)
``sparse_attn_func``                   no ``dropout_p``/``alibi_slopes``/``deterministic``/
                                       ``return_attn_probs``/``out``; always returns ``(out,
                                       lse)``, ``lse`` of shape ``[0]`` unless
                                       ``return_softmax_lse``
``sparse_attn_varlen_func``            the same differences
=====================================  ===========================================================

``validate=True`` (local attention, SWA table) reads values on the host, so it stays with the
eager Python functions. ``max_local_attention_virtual_batches`` and
``flash_mla_get_workspace_size`` (and ``flash_mla_decode_get_workspace_size``,
``flash_mla_prefill_get_workspace_size``) return Python ints from Python ints: call them outside the
compiled region (or inside: they trace as constants), no custom op needed.

Every op launches on its inputs' device (``cuda:1``/``xpu:1`` included), whatever the current
device is, and raises ``ValueError`` when its inputs sit on different devices.
"""

from typing import Optional

import torch
from torch import Tensor

from .ops import indexer_cache as _indexer_cache
from .ops import kv_cache_gather as _kv_cache_gather
from .ops import kv_cache_store as _kv_cache_store
from .ops import local_attention as _local
from .ops import merge_state as _merge
from .ops import mla as _mla_family
from .ops import mla_decode as _mla
from .ops import mla_prefill as _mla_prefill
from .ops import mla_sparse_prefill as _mla_sparse_prefill
from .ops import mqa_logits as _mqa_logits
from .ops import mla_sparse_decode as _mla_sparse_decode
from .ops import page_table as _page_table
from .ops import paged_attention as _paged
from .ops import swa_spec as _swa
from .ops import topk as _topk
from .ops import varlen_attention as _varlen
from .ops import vertical_slash as _vs

NAMESPACE = "triton_xpu_attn"

__all__ = [
    "concat_and_cache_mla",
    "cp_gather_indexer_k_quant_cache",
    "convert_vertical_slash_indexes",
    "convert_vertical_slash_indexes_mergehead",
    "fast_topk_transform_fused",
    "fast_topk_transform_ragged_fused",
    "fast_topk_v2",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "flash_attn_with_kvcache_out",
    "flash_mla_decode",
    "flash_mla_prefill",
    "flash_mla_sparse_fwd",
    "fp8_mqa_logits",
    "fp8_paged_mqa_logits",
    "gather_and_maybe_dequant_cache",
    "gather_cache",
    "get_paged_mqa_logits_metadata",
    "flash_mla_with_kvcache",
    "indexer_k_quant_and_cache",
    "make_local_attention_virtual_batches",
    "make_local_attention_virtual_batches_out",
    "merge_state",
    "merge_state_out",
    "merge_attn_states",
    "merge_state_v2",
    "merge_state_v2_out",
    "normalize_page_table",
    "normalize_page_table_out",
    "prepare_swa_spec_page_table",
    "reshape_and_cache",
    "reshape_and_cache_flash",
    "sparse_attn_func",
    "sparse_attn_varlen_func",
    "topk_transform_512",
    "topk_transform_512_v2",
    "translate_loc_from_full_to_swa",
    "OPS",
]


def _op(name: str, mutates_args=()):
    return torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=mutates_args)


def _no_lse(like: Tensor) -> Tensor:
    return torch.empty((0,), dtype=torch.float32, device=like.device)


# ------------------------------------------------------------------------------------------
# paged attention
# ------------------------------------------------------------------------------------------


def _paged_kwargs(cu_seqlens_q, max_seqlen_q, softmax_scale, causal, window_left, window_right, softcap, sinks,
                  k_descale, v_descale, num_splits, alibi_slopes):
    return dict(
        cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, softmax_scale=softmax_scale, causal=causal,
        window_size=(window_left, window_right), softcap=softcap, sinks=sinks, k_descale=k_descale,
        v_descale=v_descale, num_splits=num_splits, alibi_slopes=alibi_slopes,
    )


def _paged_out_shape(q: Tensor, v_cache: Tensor):
    total_q = q.shape[0] * q.shape[1] if q.dim() == 4 else q.shape[0]
    return total_q, q.shape[-2], v_cache.shape[-1]


@_op("flash_attn_with_kvcache")
def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_seqlens: Tensor,
    page_table: Tensor,
    cu_seqlens_q: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    alibi_slopes: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """:func:`triton_xpu_attn.flash_attn_with_kvcache` as a custom op: ``(out, lse)``."""
    kwargs = _paged_kwargs(cu_seqlens_q, max_seqlen_q, softmax_scale, causal, window_left, window_right, softcap,
                           sinks, k_descale, v_descale, num_splits, alibi_slopes)
    res = _paged.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table,
        return_softmax_lse=return_softmax_lse, **kwargs,
    )
    return res if return_softmax_lse else (res, _no_lse(q))


@flash_attn_with_kvcache.register_fake
def _(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q=None, max_seqlen_q=None, softmax_scale=None,
      causal=False, window_left=-1, window_right=-1, softcap=0.0, sinks=None, k_descale=None, v_descale=None,
      num_splits=0, return_softmax_lse=False, alibi_slopes=None):
    total_q, heads, dv = _paged_out_shape(q, v_cache)
    out = q.new_empty((total_q, heads, dv))
    lse = q.new_empty((heads, total_q), dtype=torch.float32) if return_softmax_lse else _no_lse(q)
    return out, lse


@_op("flash_attn_with_kvcache_out", mutates_args=("out",))
def flash_attn_with_kvcache_out(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_seqlens: Tensor,
    page_table: Tensor,
    out: Tensor,
    cu_seqlens_q: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    alibi_slopes: Optional[Tensor] = None,
) -> Tensor:
    """:func:`triton_xpu_attn.flash_attn_with_kvcache` with ``out=``: writes ``out``, returns ``lse``
    (shape ``[0]`` unless ``return_softmax_lse``)."""
    kwargs = _paged_kwargs(cu_seqlens_q, max_seqlen_q, softmax_scale, causal, window_left, window_right, softcap,
                           sinks, k_descale, v_descale, num_splits, alibi_slopes)
    res = _paged.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table, out=out,
        return_softmax_lse=return_softmax_lse, **kwargs,
    )
    return res[1] if return_softmax_lse else _no_lse(q)


@flash_attn_with_kvcache_out.register_fake
def _(q, k_cache, v_cache, cache_seqlens, page_table, out, cu_seqlens_q=None, max_seqlen_q=None, softmax_scale=None,
      causal=False, window_left=-1, window_right=-1, softcap=0.0, sinks=None, k_descale=None, v_descale=None,
      num_splits=0, return_softmax_lse=False, alibi_slopes=None):
    total_q, heads, _ = _paged_out_shape(q, v_cache)
    return q.new_empty((heads, total_q), dtype=torch.float32) if return_softmax_lse else _no_lse(q)


@_op("flash_attn_varlen_func")
def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    seqused_k: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    sinks: Optional[Tensor] = None,
    causal: bool = False,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    seqused_q: Optional[Tensor] = None,
    alibi_slopes: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """:func:`triton_xpu_attn.flash_attn_varlen_func` as a custom op: ``(out, lse)``."""
    res = _varlen.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=seqused_q, seqused_k=seqused_k,
        softmax_scale=softmax_scale, sinks=sinks, causal=causal, k_descale=k_descale, v_descale=v_descale,
        window_size=(window_left, window_right), softcap=softcap, num_splits=num_splits,
        return_softmax_lse=return_softmax_lse, alibi_slopes=alibi_slopes,
    )
    return res if return_softmax_lse else (res, _no_lse(q))


@flash_attn_varlen_func.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, seqused_k=None, softmax_scale=None,
      sinks=None, causal=False, k_descale=None, v_descale=None, window_left=-1, window_right=-1, softcap=0.0,
      num_splits=0, return_softmax_lse=False, seqused_q=None, alibi_slopes=None):
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[-1]))
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32) if return_softmax_lse else _no_lse(q)
    return out, lse


# ------------------------------------------------------------------------------------------
# MLA decode
# ------------------------------------------------------------------------------------------


@_op("flash_mla_decode", mutates_args=("workspace",))
def flash_mla_decode(
    q_nope: Tensor,
    q_pe: Optional[Tensor],
    kv_c_and_k_pe_cache: Tensor,
    seq_lens: Tensor,
    page_table: Tensor,
    workspace: Optional[Tensor],
    sm_scale: float,
    num_kv_splits: int = 1,
    return_lse: bool = False,
    kv_scale: Optional[Tensor] = None,
    head_dim_v: Optional[int] = None,
) -> tuple[Tensor, Tensor]:
    """:func:`triton_xpu_attn.flash_mla_decode` as a custom op: ``(out, lse)``; ``workspace`` is
    scratch (declared mutated)."""
    res = _mla.flash_mla_decode(
        q_nope, q_pe, kv_c_and_k_pe_cache, seq_lens, page_table, workspace, sm_scale, num_kv_splits,
        return_lse=return_lse, kv_scale=kv_scale, head_dim_v=head_dim_v,
    )
    return res if return_lse else (res, _no_lse(q_nope))


@flash_mla_decode.register_fake
def _(q_nope, q_pe, kv_c_and_k_pe_cache, seq_lens, page_table, workspace, sm_scale, num_kv_splits=1,
      return_lse=False, kv_scale=None, head_dim_v=None):
    return _mla_fake_outputs(q_nope, q_pe, head_dim_v, return_lse)


def _mla_fake_outputs(q_nope, q_pe, head_dim_v, return_lse):
    """``(out [..., R], lse [...] or [0])`` of the MLA ops from q's shape (``[..., H, R]``)."""
    lead = tuple(q_nope.shape[:-1])
    if q_pe is not None:
        r = q_nope.shape[-1]
    elif head_dim_v is not None:
        r = head_dim_v
    else:
        width = q_nope.shape[-1]
        if width not in _mla_family._KNOWN_SPLITS:
            raise ValueError(f"q_nope holds combined queries of width {width}: pass head_dim_v (the latent width R)")
        r = _mla_family._KNOWN_SPLITS[width]
    out = q_nope.new_empty((*lead, r))
    lse = q_nope.new_empty(lead, dtype=torch.float32) if return_lse else _no_lse(q_nope)
    return out, lse


# ------------------------------------------------------------------------------------------
# MLA prefill
# ------------------------------------------------------------------------------------------


@_op("flash_mla_prefill")
def flash_mla_prefill(
    q_nope: Tensor,
    q_pe: Optional[Tensor],
    kv_c_and_k_pe_cache: Tensor,
    cu_seqlens_q: Tensor,
    seq_lens_k: Tensor,
    max_seqlen_q: Optional[int],
    page_table: Tensor,
    workspace: Optional[Tensor],
    sm_scale: float,
    causal: bool = True,
    num_kv_splits: int = -1,
    return_lse: bool = False,
    kv_scale: Optional[Tensor] = None,
    head_dim_v: Optional[int] = None,
) -> tuple[Tensor, Tensor]:
    """:func:`triton_xpu_attn.flash_mla_prefill` as a custom op: ``(out, lse)`` (``workspace`` is
    not written: the prefill needs none)."""
    res = _mla_prefill.flash_mla_prefill(
        q_nope, q_pe, kv_c_and_k_pe_cache, cu_seqlens_q, seq_lens_k, max_seqlen_q, page_table, workspace, sm_scale,
        causal, num_kv_splits, return_lse=return_lse, kv_scale=kv_scale, head_dim_v=head_dim_v,
    )
    return res if return_lse else (res, _no_lse(q_nope))


@flash_mla_prefill.register_fake
def _(q_nope, q_pe, kv_c_and_k_pe_cache, cu_seqlens_q, seq_lens_k, max_seqlen_q, page_table, workspace, sm_scale,
      causal=True, num_kv_splits=-1, return_lse=False, kv_scale=None, head_dim_v=None):
    return _mla_fake_outputs(q_nope, q_pe, head_dim_v, return_lse)


# ------------------------------------------------------------------------------------------
# DeepSeek sparse attention (DSA) prefill
# ------------------------------------------------------------------------------------------


@_op("flash_mla_sparse_fwd")
def flash_mla_sparse_fwd(
    q: Tensor,
    kv: Tensor,
    indices: Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: Optional[Tensor] = None,
    topk_length: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`triton_xpu_attn.flash_mla_sparse_fwd` as a custom op: ``(out, max_logits, lse)``."""
    return tuple(_mla_sparse_prefill.flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length))


@flash_mla_sparse_fwd.register_fake
def _(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    s_q, h_q = q.shape[0], q.shape[1]
    return (q.new_empty((s_q, h_q, d_v)), q.new_empty((s_q, h_q), dtype=torch.float32),
            q.new_empty((s_q, h_q), dtype=torch.float32))


@_op("fp8_mqa_logits")
def fp8_mqa_logits(q_fp8: Tensor, k_fp8: Tensor, k_scale: Tensor, weights: Tensor, ks: Tensor, ke: Tensor,
                   clean_logits: bool = False) -> Tensor:
    """:func:`triton_xpu_attn.fp8_mqa_logits` as a custom op (``k_fp8``, ``k_scale`` apart)."""
    return _mqa_logits.fp8_mqa_logits(q_fp8, (k_fp8, k_scale), weights, ks, ke, clean_logits)


@fp8_mqa_logits.register_fake
def _(q_fp8, k_fp8, k_scale, weights, ks, ke, clean_logits=False):
    return q_fp8.new_empty((q_fp8.shape[0], k_fp8.shape[0]), dtype=torch.float32)


@_op("fp8_paged_mqa_logits")
def fp8_paged_mqa_logits(q_fp8: Tensor, kv_cache: Tensor, weights: Tensor, seq_lens: Tensor, block_tables: Tensor,
                         schedule_metadata: Optional[Tensor], max_seq_len: int, clean_logits: bool = False,
                         kv_layout: str = "page") -> Tensor:
    """:func:`triton_xpu_attn.fp8_paged_mqa_logits` as a custom op."""
    return _mqa_logits.fp8_paged_mqa_logits(q_fp8, kv_cache, weights, seq_lens, block_tables, schedule_metadata,
                                            max_seq_len, clean_logits, kv_layout=kv_layout)


@fp8_paged_mqa_logits.register_fake
def _(q_fp8, kv_cache, weights, seq_lens, block_tables, schedule_metadata, max_seq_len, clean_logits=False,
      kv_layout="page"):
    rows = q_fp8.shape[0] * (q_fp8.shape[1] if q_fp8.dim() == 4 else 1)
    return q_fp8.new_empty((rows, max_seq_len), dtype=torch.float32)


@_op("get_paged_mqa_logits_metadata")
def get_paged_mqa_logits_metadata(context_lens: Tensor, block_kv: int, num_sms: int) -> Tensor:
    """:func:`triton_xpu_attn.get_paged_mqa_logits_metadata` as a custom op."""
    return _mqa_logits.get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)


@get_paged_mqa_logits_metadata.register_fake
def _(context_lens, block_kv, num_sms):
    return context_lens.new_empty((num_sms + 1, 2), dtype=torch.int32)


# ------------------------------------------------------------------------------------------
# DeepSeek sparse attention (DSA) decode over paged caches (and its dense path)
# ------------------------------------------------------------------------------------------


@_op("flash_mla_with_kvcache")
def flash_mla_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    block_table: Optional[Tensor] = None,
    cache_seqlens: Optional[Tensor] = None,
    head_dim_v: int = 512,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: Optional[Tensor] = None,
    attn_sink: Optional[Tensor] = None,
    extra_k_cache: Optional[Tensor] = None,
    extra_indices_in_kvcache: Optional[Tensor] = None,
    topk_length: Optional[Tensor] = None,
    extra_topk_length: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """:func:`triton_xpu_attn.flash_mla_with_kvcache` as a custom op: ``(out, lse)``."""
    out, lse = _mla_sparse_decode.flash_mla_with_kvcache(
        q, k_cache, block_table, cache_seqlens, head_dim_v, None, None, softmax_scale, causal, is_fp8_kvcache,
        indices, attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length)
    return out, lse


@flash_mla_with_kvcache.register_fake
def _(q, k_cache, block_table=None, cache_seqlens=None, head_dim_v=512, softmax_scale=None, causal=False,
      is_fp8_kvcache=False, indices=None, attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None,
      topk_length=None, extra_topk_length=None):
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    return q.new_empty((b, s_q, h_q, head_dim_v)), q.new_empty((b, h_q, s_q), dtype=torch.float32)


# ------------------------------------------------------------------------------------------
# merge_state_v2 (natural-log LSEs) and merge_state (v1, base-2 LSEs): one definition for both
# ------------------------------------------------------------------------------------------


def _merge_ops(name: str, merge):
    """``(name, name_out)`` custom ops of a state merge: ``(v_merged, s_merged)``, and in place."""

    @_op(name)
    def merged(v_a: Tensor, s_a: Tensor, v_b: Tensor, s_b: Tensor) -> tuple[Tensor, Tensor]:
        return merge(v_a, s_a, v_b, s_b)

    @merged.register_fake
    def _(v_a, s_a, v_b, s_b):
        # the real op allocates with torch.empty_like(v_a) (v_a's strides when dense): same here
        return torch.empty_like(v_a), v_a.new_empty((v_a.shape[0], v_a.shape[1]), dtype=torch.float32)

    @_op(f"{name}_out", mutates_args=("v_merged", "s_merged"))
    def merged_out(v_a: Tensor, s_a: Tensor, v_b: Tensor, s_b: Tensor, v_merged: Tensor, s_merged: Tensor) -> None:
        merge(v_a, s_a, v_b, s_b, v_merged, s_merged)

    @merged_out.register_fake
    def _(v_a, s_a, v_b, s_b, v_merged, s_merged):
        return None

    merged.__doc__ = f":func:`triton_xpu_attn.{name}` as a custom op: ``(v_merged, s_merged)``."
    merged_out.__doc__ = f":func:`triton_xpu_attn.{name}` writing ``v_merged`` and ``s_merged`` in place."
    return merged, merged_out


merge_state_v2, merge_state_v2_out = _merge_ops("merge_state_v2", _merge.merge_state_v2)
merge_state, merge_state_out = _merge_ops("merge_state", _merge.merge_state)


@_op("merge_attn_states", mutates_args=("output", "output_lse"))
def merge_attn_states(output: Tensor, prefix_output: Tensor, prefix_lse: Tensor, suffix_output: Tensor,
                      suffix_lse: Tensor, output_lse: Optional[Tensor] = None,
                      prefill_tokens_with_context: Optional[int] = None, output_scale: Optional[Tensor] = None) -> None:
    """:func:`triton_xpu_attn.merge_attn_states` (vLLM's argument order) writing ``output`` and
    ``output_lse`` in place."""
    _merge.merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                             prefill_tokens_with_context, output_scale)


@merge_attn_states.register_fake
def _(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None, prefill_tokens_with_context=None,
      output_scale=None):
    return None


# ------------------------------------------------------------------------------------------
# page tables
# ------------------------------------------------------------------------------------------


@_op("normalize_page_table")
def normalize_page_table(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    seq_lens: Tensor,
    page_size: int,
    max_pages: int,
    full_to_swa: Optional[Tensor] = None,
) -> Tensor:
    """:func:`triton_xpu_attn.normalize_page_table` with ``max_pages`` required: ``[B, max_pages]`` int32."""
    return _page_table.normalize_page_table(
        req_to_token, req_pool_indices, seq_lens, page_size, max_pages=max_pages, full_to_swa=full_to_swa
    )


@normalize_page_table.register_fake
def _(req_to_token, req_pool_indices, seq_lens, page_size, max_pages, full_to_swa=None):
    return req_to_token.new_empty((req_pool_indices.shape[0], max_pages), dtype=torch.int32)


@_op("normalize_page_table_out", mutates_args=("out",))
def normalize_page_table_out(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    seq_lens: Tensor,
    page_size: int,
    out: Tensor,
    full_to_swa: Optional[Tensor] = None,
) -> None:
    """:func:`triton_xpu_attn.normalize_page_table` writing ``out [B, max_pages]`` int32 in place."""
    _page_table.normalize_page_table(req_to_token, req_pool_indices, seq_lens, page_size, out=out,
                                     full_to_swa=full_to_swa)


@normalize_page_table_out.register_fake
def _(req_to_token, req_pool_indices, seq_lens, page_size, out, full_to_swa=None):
    return None


@_op("translate_loc_from_full_to_swa")
def translate_loc_from_full_to_swa(full_to_swa: Tensor, locs: Tensor) -> Tensor:
    """:func:`triton_xpu_attn.translate_loc_from_full_to_swa` as a custom op."""
    return _page_table.translate_loc_from_full_to_swa(full_to_swa, locs)


@translate_loc_from_full_to_swa.register_fake
def _(full_to_swa, locs):
    return locs.new_empty(locs.shape, dtype=torch.int32)


# ------------------------------------------------------------------------------------------
# local attention metadata (graph mode)
# ------------------------------------------------------------------------------------------


def _local_out_shapes(attn_chunk_size: int, page_size: int, max_virtual_batches: int):
    m = max_virtual_batches
    return (m,), (m + 1,), (m,), (m, attn_chunk_size // page_size)


@_op("make_local_attention_virtual_batches")
def make_local_attention_virtual_batches(
    attn_chunk_size: int,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    block_table: Tensor,
    page_size: int,
    max_virtual_batches: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`triton_xpu_attn.make_local_attention_virtual_batches` in graph mode
    (``max_virtual_batches`` required): ``(seqlens_q_local [M], cu_seqlens_q_local [M+1],
    seqlens_k_local [M], block_table_local [M, C // P])``, four separate int32 tensors."""
    # the public function checks every argument (with its messages); the four outputs are
    # allocated separately (its own allocation is one buffer with four views: outputs of a custom
    # op must not alias each other)
    sizes_ok = page_size > 0 and attn_chunk_size > 0 and attn_chunk_size % page_size == 0 and max_virtual_batches >= 0
    out = tuple(
        torch.empty(shape, dtype=torch.int32, device=block_table.device)
        for shape in _local_out_shapes(attn_chunk_size, page_size, max_virtual_batches)
    ) if sizes_ok else None
    return tuple(_local.make_local_attention_virtual_batches(
        attn_chunk_size, query_start_loc, seq_lens, block_table, page_size, max_virtual_batches=max_virtual_batches,
        out=out,
    ))


@make_local_attention_virtual_batches.register_fake
def _(attn_chunk_size, query_start_loc, seq_lens, block_table, page_size, max_virtual_batches):
    if attn_chunk_size <= 0 or page_size <= 0 or attn_chunk_size % page_size:
        raise ValueError(f"attn_chunk_size ({attn_chunk_size}) must be a positive multiple of page_size ({page_size})")
    return tuple(
        block_table.new_empty(shape, dtype=torch.int32)
        for shape in _local_out_shapes(attn_chunk_size, page_size, max_virtual_batches)
    )


@_op(
    "make_local_attention_virtual_batches_out",
    mutates_args=("seqlens_q_local", "cu_seqlens_q_local", "seqlens_k_local", "block_table_local"),
)
def make_local_attention_virtual_batches_out(
    attn_chunk_size: int,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    block_table: Tensor,
    page_size: int,
    seqlens_q_local: Tensor,
    cu_seqlens_q_local: Tensor,
    seqlens_k_local: Tensor,
    block_table_local: Tensor,
) -> None:
    """:func:`triton_xpu_attn.make_local_attention_virtual_batches` with ``out=`` (graph mode,
    ``M = seqlens_q_local.shape[0]``): writes the four outputs in place."""
    _local.make_local_attention_virtual_batches(
        attn_chunk_size, query_start_loc, seq_lens, block_table, page_size,
        out=(seqlens_q_local, cu_seqlens_q_local, seqlens_k_local, block_table_local),
    )


@make_local_attention_virtual_batches_out.register_fake
def _(attn_chunk_size, query_start_loc, seq_lens, block_table, page_size, seqlens_q_local, cu_seqlens_q_local,
      seqlens_k_local, block_table_local):
    return None


# ------------------------------------------------------------------------------------------
# SWA speculative page table
# ------------------------------------------------------------------------------------------


@_op("prepare_swa_spec_page_table", mutates_args=("page_table_dst",))
def prepare_swa_spec_page_table(
    page_table_dst: Tensor,
    page_table_a: Tensor,
    page_table_b: Tensor,
    seq_len_a: Tensor,
    seq_len_b: Tensor,
    num_draft_tokens: int,
    seq_start_a: Optional[Tensor] = None,
    full_to_swa: Optional[Tensor] = None,
) -> None:
    """:func:`triton_xpu_attn.prepare_swa_spec_page_table` (no ``validate``): writes
    ``page_table_dst`` in place."""
    _swa.prepare_swa_spec_page_table(
        page_table_dst, page_table_a, page_table_b, seq_len_a, seq_len_b, num_draft_tokens,
        seq_start_a=seq_start_a, full_to_swa=full_to_swa,
    )


@prepare_swa_spec_page_table.register_fake
def _(page_table_dst, page_table_a, page_table_b, seq_len_a, seq_len_b, num_draft_tokens, seq_start_a=None,
      full_to_swa=None):
    return None


# ------------------------------------------------------------------------------------------
# DeepSeek sparse attention (DSA) indexer top-k
# ------------------------------------------------------------------------------------------


def _topk_fake(score, topk):
    return score.new_empty((score.shape[0], topk), dtype=torch.int32)


@_op("fast_topk_v2")
def fast_topk_v2(score: Tensor, lengths: Tensor, topk: int, row_starts: Optional[Tensor] = None) -> Tensor:
    """:func:`triton_xpu_attn.fast_topk_v2` as a custom op."""
    return _topk.fast_topk_v2(score, lengths, topk, row_starts)


@fast_topk_v2.register_fake
def _(score, lengths, topk, row_starts=None):
    return _topk_fake(score, topk)


@_op("fast_topk_transform_fused")
def fast_topk_transform_fused(score: Tensor, lengths: Tensor, page_table_size_1: Tensor, cu_seqlens_q: Tensor,
                              topk: int, row_starts: Optional[Tensor] = None) -> Tensor:
    """:func:`triton_xpu_attn.fast_topk_transform_fused` as a custom op."""
    return _topk.fast_topk_transform_fused(score, lengths, page_table_size_1, cu_seqlens_q, topk, row_starts)


@fast_topk_transform_fused.register_fake
def _(score, lengths, page_table_size_1, cu_seqlens_q, topk, row_starts=None):
    return _topk_fake(score, topk)


@_op("fast_topk_transform_ragged_fused")
def fast_topk_transform_ragged_fused(score: Tensor, lengths: Tensor, topk_indices_offset: Tensor, topk: int,
                                     row_starts: Optional[Tensor] = None) -> Tensor:
    """:func:`triton_xpu_attn.fast_topk_transform_ragged_fused` as a custom op."""
    return _topk.fast_topk_transform_ragged_fused(score, lengths, topk_indices_offset, topk, row_starts)


@fast_topk_transform_ragged_fused.register_fake
def _(score, lengths, topk_indices_offset, topk, row_starts=None):
    return _topk_fake(score, topk)


@_op("topk_transform_512", mutates_args=("out_page_indices", "out_raw_indices"))
def topk_transform_512(scores: Tensor, seq_lens: Tensor, page_tables: Tensor, out_page_indices: Tensor,
                       page_size: int, out_raw_indices: Optional[Tensor] = None) -> None:
    """:func:`triton_xpu_attn.topk_transform_512`: writes ``out_page_indices`` (and
    ``out_raw_indices``) in place."""
    _topk.topk_transform_512(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)


@topk_transform_512.register_fake
def _(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices=None):
    return None


@_op("topk_transform_512_v2", mutates_args=("out_page_indices", "out_raw_indices"))
def topk_transform_512_v2(scores: Tensor, seq_lens: Tensor, page_tables: Tensor, out_page_indices: Tensor,
                          page_size: int, metadata: Tensor, out_raw_indices: Optional[Tensor] = None) -> None:
    """:func:`triton_xpu_attn.topk_transform_512_v2`: writes ``out_page_indices`` (and
    ``out_raw_indices``) in place."""
    _topk.topk_transform_512_v2(scores, seq_lens, page_tables, out_page_indices, page_size, metadata,
                                out_raw_indices)


@topk_transform_512_v2.register_fake
def _(scores, seq_lens, page_tables, out_page_indices, page_size, metadata, out_raw_indices=None):
    return None


# ------------------------------------------------------------------------------------------
# KV-cache writes and reads
# ------------------------------------------------------------------------------------------


@_op("reshape_and_cache_flash", mutates_args=("key_cache", "value_cache"))
def reshape_and_cache_flash(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor,
                            kv_cache_dtype: str = "auto", k_scale: Optional[Tensor] = None,
                            v_scale: Optional[Tensor] = None) -> None:
    """:func:`triton_xpu_attn.reshape_and_cache_flash`: writes ``key_cache`` / ``value_cache`` in place."""
    _kv_cache_store.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                            k_scale, v_scale)


@reshape_and_cache_flash.register_fake
def _(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto", k_scale=None, v_scale=None):
    return None


@_op("concat_and_cache_mla", mutates_args=("kv_cache",))
def concat_and_cache_mla(kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor,
                         kv_cache_dtype: str = "auto", scale: Optional[Tensor] = None) -> None:
    """:func:`triton_xpu_attn.concat_and_cache_mla`: writes ``kv_cache`` in place."""
    _kv_cache_store.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)


@concat_and_cache_mla.register_fake
def _(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="auto", scale=None):
    return None


@_op("gather_and_maybe_dequant_cache", mutates_args=("dst",))
def gather_and_maybe_dequant_cache(src_cache: Tensor, dst: Tensor, block_table: Tensor, cu_seq_lens: Tensor,
                                   batch_size: int, kv_cache_dtype: str = "auto", scale: Optional[Tensor] = None,
                                   seq_starts: Optional[Tensor] = None) -> None:
    """:func:`triton_xpu_attn.gather_and_maybe_dequant_cache`: writes ``dst`` in place."""
    _kv_cache_gather.gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, batch_size,
                                                    kv_cache_dtype, scale, seq_starts)


@gather_and_maybe_dequant_cache.register_fake
def _(src_cache, dst, block_table, cu_seq_lens, batch_size, kv_cache_dtype="auto", scale=None, seq_starts=None):
    return None


@_op("reshape_and_cache", mutates_args=("key_cache", "value_cache"))
def reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor,
                      kv_cache_dtype: str = "auto", k_scale: Optional[Tensor] = None,
                      v_scale: Optional[Tensor] = None) -> None:
    """:func:`triton_xpu_attn.reshape_and_cache`: writes ``key_cache`` / ``value_cache`` in place."""
    _kv_cache_store.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                      v_scale)


@reshape_and_cache.register_fake
def _(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto", k_scale=None, v_scale=None):
    return None


@_op("gather_cache", mutates_args=("dst",))
def gather_cache(src_cache: Tensor, dst: Tensor, block_table: Tensor, cu_seq_lens: Tensor, batch_size: int,
                 seq_starts: Optional[Tensor] = None) -> None:
    """:func:`triton_xpu_attn.gather_cache`: writes ``dst`` in place."""
    _kv_cache_gather.gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)


@gather_cache.register_fake
def _(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None):
    return None


@_op("indexer_k_quant_and_cache", mutates_args=("kv_cache",))
def indexer_k_quant_and_cache(k: Tensor, kv_cache: Tensor, slot_mapping: Tensor, quant_block_size: int,
                              scale_fmt: Optional[str] = None) -> None:
    """:func:`triton_xpu_attn.indexer_k_quant_and_cache`: writes ``kv_cache`` in place."""
    _indexer_cache.indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)


@indexer_k_quant_and_cache.register_fake
def _(k, kv_cache, slot_mapping, quant_block_size, scale_fmt=None):
    return None


@_op("cp_gather_indexer_k_quant_cache", mutates_args=("dst_k", "dst_scale"))
def cp_gather_indexer_k_quant_cache(kv_cache: Tensor, dst_k: Tensor, dst_scale: Tensor, block_table: Tensor,
                                    cu_seq_lens: Tensor) -> None:
    """:func:`triton_xpu_attn.cp_gather_indexer_k_quant_cache`: writes ``dst_k`` / ``dst_scale`` in place."""
    _indexer_cache.cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)


@cp_gather_indexer_k_quant_cache.register_fake
def _(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens):
    return None


# ------------------------------------------------------------------------------------------
# vertical/slash sparse attention
# ------------------------------------------------------------------------------------------


def _vs_tables_fake(q_seqlens, vertical_indexes, slash_indexes, context_size, block_size_M):
    batch, heads, nnz_s = slash_indexes.shape
    rows = -(-context_size // block_size_M)
    new = q_seqlens.new_empty
    return (new((batch, heads, rows)), new((batch, heads, rows, nnz_s)), new((batch, heads, rows)),
            new((batch, heads, rows, vertical_indexes.shape[2])))


@_op("convert_vertical_slash_indexes")
def convert_vertical_slash_indexes(q_seqlens: Tensor, kv_seqlens: Tensor, vertical_indexes: Tensor,
                                   slash_indexes: Tensor, context_size: int, block_size_M: int, block_size_N: int,
                                   causal: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`triton_xpu_attn.convert_vertical_slash_indexes` as a custom op."""
    return _vs.convert_vertical_slash_indexes(q_seqlens, kv_seqlens, vertical_indexes, slash_indexes, context_size,
                                              block_size_M, block_size_N, causal)


@convert_vertical_slash_indexes.register_fake
def _(q_seqlens, kv_seqlens, vertical_indexes, slash_indexes, context_size, block_size_M, block_size_N, causal=True):
    return _vs_tables_fake(q_seqlens, vertical_indexes, slash_indexes, context_size, block_size_M)


@_op("convert_vertical_slash_indexes_mergehead")
def convert_vertical_slash_indexes_mergehead(q_seqlens: Tensor, kv_seqlens: Tensor, vertical_indexes: Tensor,
                                             slash_indexes: Tensor, vertical_indices_count: Tensor,
                                             slash_indices_count: Tensor, context_size: int, block_size_M: int,
                                             block_size_N: int, causal: bool = True
                                             ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`triton_xpu_attn.convert_vertical_slash_indexes_mergehead` as a custom op."""
    return _vs.convert_vertical_slash_indexes_mergehead(q_seqlens, kv_seqlens, vertical_indexes, slash_indexes,
                                                        vertical_indices_count, slash_indices_count, context_size,
                                                        block_size_M, block_size_N, causal)


@convert_vertical_slash_indexes_mergehead.register_fake
def _(q_seqlens, kv_seqlens, vertical_indexes, slash_indexes, vertical_indices_count, slash_indices_count,
      context_size, block_size_M, block_size_N, causal=True):
    return _vs_tables_fake(q_seqlens, vertical_indexes, slash_indexes, context_size, block_size_M)


@_op("sparse_attn_func")
def sparse_attn_func(q: Tensor, k: Tensor, v: Tensor, block_count: Tensor, block_offset: Tensor,
                     column_count: Tensor, column_index: Tensor, softmax_scale: Optional[float] = None,
                     causal: bool = False, softcap: float = 0.0, return_softmax_lse: bool = False,
                     block_size_M: int = 64, block_size_N: int = 64) -> tuple[Tensor, Tensor]:
    """:func:`triton_xpu_attn.sparse_attn_func` as a custom op: ``(out, lse)``."""
    res = _vs.sparse_attn_func(q, k, v, block_count, block_offset, column_count, column_index,
                               softmax_scale=softmax_scale, causal=causal, softcap=softcap,
                               return_softmax_lse=return_softmax_lse, block_size_M=block_size_M,
                               block_size_N=block_size_N)
    return res if return_softmax_lse else (res, _no_lse(q))


@sparse_attn_func.register_fake
def _(q, k, v, block_count, block_offset, column_count, column_index, softmax_scale=None, causal=False, softcap=0.0,
      return_softmax_lse=False, block_size_M=64, block_size_N=64):
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32) if return_softmax_lse \
        else _no_lse(q)
    return torch.empty_like(q), lse


@_op("sparse_attn_varlen_func")
def sparse_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, block_count: Tensor, block_offset: Tensor,
                            column_count: Tensor, column_index: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                            max_seqlen_q: int, max_seqlen_k: int, softmax_scale: Optional[float] = None,
                            causal: bool = False, softcap: float = 0.0, return_softmax_lse: bool = False,
                            block_size_M: int = 64, block_size_N: int = 64) -> tuple[Tensor, Tensor]:
    """:func:`triton_xpu_attn.sparse_attn_varlen_func` as a custom op: ``(out, lse)``."""
    res = _vs.sparse_attn_varlen_func(q, k, v, block_count, block_offset, column_count, column_index, cu_seqlens_q,
                                      cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=softmax_scale,
                                      causal=causal, softcap=softcap, return_softmax_lse=return_softmax_lse,
                                      block_size_M=block_size_M, block_size_N=block_size_N)
    return res if return_softmax_lse else (res, _no_lse(q))


@sparse_attn_varlen_func.register_fake
def _(q, k, v, block_count, block_offset, column_count, column_index, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
      max_seqlen_k, softmax_scale=None, causal=False, softcap=0.0, return_softmax_lse=False, block_size_M=64,
      block_size_N=64):
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32) if return_softmax_lse else _no_lse(q)
    return torch.empty_like(q), lse


#: name -> custom op (``torch._library.custom_ops.CustomOpDef``), one per registered op
OPS = {
    name: globals()[name]
    for name in __all__
    if name != "OPS"
}
