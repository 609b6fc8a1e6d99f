"""DeepSeek sparse attention (DSA) decode over paged caches: ``flash_mla_with_kvcache``, a drop-in
for sgl-kernel-xpu's ``sgl_kernel.flash_mla_with_kvcache`` (FlashMLA's function of the same name
and contract), and ``get_mla_metadata`` (FlashMLA's scheduler-metadata placeholder).

Each query token ``(b, s)`` attends to the cache tokens its index list ``indices[b, s]`` names
(``page * page_size + slot`` in the flat token space of ``k_cache``) and, with an extra cache, to
the tokens ``extra_indices_in_kvcache[b, s]`` names in ``extra_k_cache``, all in one softmax. The
attention runs in ``mla_sparse._mla_sparse_kernel`` (the sparse kernel family, shared with
prefill) in its paged mode, over one of three cache layouts:

* plain rows of q's dtype (``is_fp8_kvcache=False``; DeepSeek-V3.2: 576 = 512 latent + 64 rope,
  V = the first ``head_dim_v`` channels);
* DeepSeek-V4's packed fp8 pages (``is_fp8_kvcache=True``, last dim 584, ``d_qk`` 512): per token
  a 576-byte record (448 e4m3 nope channels, then 64 bf16 rope channels) at ``slot * 576`` of its
  page, and the token's 8-byte UE8M0 scale record (7 tile scales of 64 channels, one pad byte) at
  ``page_size * 576 + slot * 8``; the page stride is ``k_cache.stride(0)`` bytes (the view upstream
  builds with ``as_strided``), ``stride(1)`` is not the token spacing;
* DeepSeek-V3.2's fp8 records (``is_fp8_kvcache=True``, last dim 656, ``d_qk`` 576): 512 e4m3
  channels, 4 fp32 scales of 128 channels, 64 bf16 rope channels, one token a ``stride(1)``.

fp8 channels are dequantised to q's dtype (exactly: a power-of-two scale) before the dots.

Small batches split the joined index lists ``[main | extra]`` over programs (split-K): each
split writes its normalised partial output and LSE to a workspace allocated here, and
``_sparse_combine_kernel`` merges them with the merge rule of ``merge_state._lse_weights``, the
sink joining the denominator of the output only (where the device allows it, launched while the
split kernel runs and waiting in-kernel for its partials: ``device.programmatic_launch``). The
split count depends on host-known sizes only (batch, heads, list widths, the device's compute
units): nothing syncs with the host and the call can be captured in a device graph.

With ``block_table`` and ``cache_seqlens`` instead of indices (dense MLA decode, which upstream
leaves unimplemented on XPU) the call runs :func:`triton_xpu_attn.flash_mla_decode`.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from .. import device as _device
from .._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    cdiv,
    check_bool,
    check_int,
    check_real,
    check_same_device,
    check_tensor,
    device_guard,
    gdc_wait,
    interpreter_float32,
    next_power_of_2,
    register_xpu_compile,
)
from .merge_state import _lse_weights
from .mla_decode import flash_mla_decode, flash_mla_get_workspace_size
from .mla_sparse import MAX_HEAD_DIM, launch_sparse, sparse_tiles
from .sparse_rows import LAYOUT_FP8_V4, LAYOUT_FP8_V32, LAYOUT_PLAIN, V4_RECORD, V4_SCALE_RECORD, V32_RECORD

_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _sparse_combine_kernel(
    part_ptr,  # [tokens, h_q, splits, D_V] fp32: each split's normalised output
    stride_p_t,
    stride_p_h,
    stride_p_split,
    plse_ptr,  # [tokens, h_q, splits] fp32: each split's natural-log LSE (-inf: no entry)
    stride_pl_t,
    stride_pl_h,
    num_splits,
    sink_ptr,  # [h_q] float (read when HAS_SINK)
    stride_sink,
    out_ptr,  # output of token (b, s): out_ptr + b * stride_o_b + s * stride_o_s
    stride_o_b,
    stride_o_s,
    stride_o_h,
    lse_ptr,  # fp32 LSE of token (b, s)
    stride_l_b,
    stride_l_s,
    stride_l_h,
    tokens_per_batch,
    D_V: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_SINK: tl.constexpr,
    WAIT_PRIOR_GRID: tl.constexpr = False,
):
    """One (token, head) and ``BLOCK_DV`` output channels per program: the splits merged, the
    sink applied to the output only; a token without any entry gives 0 and LSE ``+inf``."""
    if WAIT_PRIOR_GRID:
        # launched while the sparse kernel writing the partials runs (programmatic dependent
        # launch): nothing is read before its writes are visible
        gdc_wait()
    t32 = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    dv_block = tl.program_id(2)
    b32 = t32 // tokens_per_batch  # 32-bit division, then 64-bit offsets
    sq = (t32 - b32 * tokens_per_batch).to(tl.int64)
    b = b32.to(tl.int64)
    t = t32.to(tl.int64)
    splits = tl.arange(0, MAX_SPLITS)
    lse = tl.load(plse_ptr + t * stride_pl_t + h * stride_pl_h + splits, mask=splits < num_splits,
                  other=float("-inf"))
    w, denom, merged = _lse_weights(lse, 0.0, False)
    d = dv_block * BLOCK_DV + tl.arange(0, BLOCK_DV)
    # every split below num_splits wrote its partial (0 without an entry): loaded beside the LSEs,
    # not after them
    part = tl.load(part_ptr + t * stride_p_t + h * stride_p_h + splits[:, None] * stride_p_split + d[None, :],
                   mask=(splits < num_splits)[:, None] & (d < D_V)[None, :], other=0.0)
    o = tl.sum(part * w[:, None], axis=0) / denom
    if HAS_SINK:
        # exp(lse) / (exp(lse) + exp(sink)); an empty token has o = 0 already (no 0 * inf)
        m_safe = tl.where(merged == float("-inf"), 0.0, merged)
        sink = tl.load(sink_ptr + h * stride_sink).to(tl.float32)
        o = o / (1.0 + tl.exp2((sink - m_safe) * _LOG2E))
    tl.store(out_ptr + b * stride_o_b + sq * stride_o_s + h * stride_o_h + d, o.to(out_ptr.dtype.element_ty),
             mask=d < D_V)
    if dv_block == 0:
        tl.store(lse_ptr + b * stride_l_b + sq * stride_l_s + h * stride_l_h,
                 tl.where(merged == float("-inf"), float("inf"), merged))


#: partial-output elements one combine program merges (``MAX_SPLITS x BLOCK_DV``, 4 warps): few
#: splits take whole 512-channel rows, so the LSE weights are computed once a (token, head) (H100,
#: DeepSeek-V4 B 32 q_len 2 with 64-channel blocks: 38 us, a third of the call, issue-bound)
COMBINE_ELEMENTS = 2048


def _combine_block_dv(head_dim_v: int, max_splits: int) -> int:
    """Output channels per combine program: as many as ``COMBINE_ELEMENTS`` allow (16 .. the row)."""
    return max(16, min(next_power_of_2(head_dim_v), COMBINE_ELEMENTS // max_splits))


def _register_compile_variants():
    signature = dict(part_ptr="*fp32", stride_p_t="i64", stride_p_h="i32", stride_p_split="i32",
                     plse_ptr="*fp32", stride_pl_t="i32", stride_pl_h="i32", num_splits="i32",
                     sink_ptr="*fp32", stride_sink="i32",
                     out_ptr="*bf16", stride_o_b="i64", stride_o_s="i32", stride_o_h="i32",
                     lse_ptr="*fp32", stride_l_b="i32", stride_l_s="i32", stride_l_h="i32", tokens_per_batch="i32",
                     D_V=512, HAS_SINK=True,
                     WAIT_PRIOR_GRID=False)  # a CUDA launch mode (device.programmatic_launch)
    for splits in (2, 32):
        block_dv = _combine_block_dv(512, splits)
        register_xpu_compile(_sparse_combine_kernel, f"D512,splits{splits},BLOCK_DV{block_dv},sink",
                             dict(signature, MAX_SPLITS=splits, BLOCK_DV=block_dv), num_warps=4)


_register_compile_variants()

#: at most this many splits (the combine holds all of a row's split LSEs in one tile) ...
MAX_SPLITS = 64
#: ... each covering at least this many entries of the joined lists
_MIN_SPLIT_ENTRIES = 256
#: a split launch aims at this many programs per compute unit
_PROGRAMS_PER_UNIT = 2


def _splits(programs: int, entries: int, block_n: int, compute_units: int, forced: int,
            waves: int = _PROGRAMS_PER_UNIT, min_entries: int = _MIN_SPLIT_ENTRIES) -> tuple[int, int]:
    """``(splits, split_len)``: as many splits as keep the grid within ``waves`` programs per
    compute unit (a config's ``waves``; heavy tiles want fewer), each at least ``min_entries``
    entries (a config's ``min_split_tokens``; rounded to a multiple of ``block_n``); ``forced`` > 0:
    that many (a config's ``SPLITS``)."""
    if entries <= 0:
        return 1, block_n
    if forced > 0:
        want = forced
    elif programs >= waves * compute_units:
        return 1, block_n
    else:
        # whole waves: at most waves x units programs (a partial extra wave costs a whole one)
        want = min(max(1, waves * compute_units // max(programs, 1)), cdiv(entries, max(min_entries, block_n)))
    want = max(1, min(want, MAX_SPLITS, cdiv(entries, block_n)))
    split_len = cdiv(cdiv(entries, want), block_n) * block_n
    return cdiv(entries, split_len), split_len


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's scheduler metadata object, as :func:`get_mla_metadata` returns it.

    Nothing is precomputed here (the split count comes from host-known sizes at each call); the
    first :func:`flash_mla_with_kvcache` call that receives it records its shapes in ``config`` and
    later calls must match them, as upstream asserts (``ValueError`` naming
    ``tile_scheduler_metadata`` otherwise)."""

    have_initialized: bool = False
    config: tuple | None = None
    tile_scheduler_metadata: None = None
    num_splits: None = None


def get_mla_metadata(*args, **kwargs) -> tuple[FlashMLASchedMeta, None]:
    """FlashMLA's ``get_mla_metadata``: ``(FlashMLASchedMeta(), None)``, whatever the arguments
    (kept for the older signature, as upstream does). Pass the first element as
    ``tile_scheduler_metadata`` of :func:`flash_mla_with_kvcache` (or pass None)."""
    return FlashMLASchedMeta(), None


def _cache_layout(name: str, cache: torch.Tensor, q: torch.Tensor, is_fp8: bool) -> tuple[int, int]:
    """``(layout, page_size)`` of a sparse-decode cache, checked (raises naming ``name``)."""
    d_qk = q.shape[-1]
    if is_fp8:
        check_tensor(name, cache, dtypes=tuple(d for d in (getattr(torch, "float8_e4m3fn", None), torch.uint8) if d),
                     ndim=4, last_dim_contiguous=True)
    else:
        check_tensor(name, cache, dtypes=(q.dtype,), ndim=4, last_dim_contiguous=True)
    num_pages, page_size, h_kv, width = cache.shape
    if h_kv != 1:
        raise ValueError(f"{name} must have one KV head ([num_pages, page_size, 1, d]), got shape {list(cache.shape)}")
    if page_size < 1:
        raise ValueError(f"{name} must have pages of at least one token, got shape {list(cache.shape)}")
    if num_pages * page_size >= 2**31:
        raise ValueError(f"{name} holds {num_pages * page_size} tokens: at most 2^31 - 1 (32-bit token indices)")
    if not is_fp8:
        if width != d_qk:
            raise ValueError(f"{name} rows hold {width} channels but q's head dim d_qk is {d_qk}")
        return LAYOUT_PLAIN, page_size
    if width == V4_RECORD + V4_SCALE_RECORD and d_qk == 512:
        # pages of page_size 576-byte records then page_size 8-byte scale records, stride(0) bytes apart
        need = page_size * (V4_RECORD + V4_SCALE_RECORD)
        if num_pages > 1 and cache.stride(0) < need:
            raise ValueError(f"{name}: DeepSeek-V4 fp8 pages of {page_size} tokens need stride(0) >= {need} bytes, "
                             f"got {cache.stride(0)}")
        if page_size > 1 and cache.stride(1) < V4_RECORD + V4_SCALE_RECORD:
            raise ValueError(f"{name}: the DeepSeek-V4 fp8 view must have stride(1) >= 584 (it spans its pages), "
                             f"got {cache.stride(1)}")
        return LAYOUT_FP8_V4, page_size
    if width == V32_RECORD and d_qk == 576:
        return LAYOUT_FP8_V32, page_size
    raise ValueError(
        f"{name}: with is_fp8_kvcache the last dim must be 584 bytes (DeepSeek-V4 packed pages, q's d_qk 512) or "
        f"656 (DeepSeek-V3.2 records, d_qk 576), got {width} with d_qk {d_qk}")


def _cache_arg(cache: torch.Tensor, layout: int):
    """``(tensor, (page stride, slot stride))`` as the kernel reads the cache (bytes for fp8)."""
    if layout != LAYOUT_PLAIN:
        cache = cache.view(torch.uint8)
    return cache, (cache.stride(0), cache.stride(1))


def _check_sched_meta(meta, key: tuple) -> None:
    if meta is None:
        return
    if isinstance(meta, torch.Tensor):
        raise ValueError(
            "tile_scheduler_metadata: a tensor from the older get_mla_metadata(cache_seqlens, ...) schedule is not "
            "supported; pass None or get_mla_metadata()[0]")
    if not isinstance(meta, FlashMLASchedMeta):
        raise TypeError(f"tile_scheduler_metadata must be None or get_mla_metadata()[0], got {type(meta).__name__}")
    if not meta.have_initialized:
        meta.have_initialized, meta.config = True, key
    elif meta.config != key:
        raise ValueError(
            f"tile_scheduler_metadata was first used with (b, s_q, h_q, page_size, h_kv, causal, is_fp8_kvcache, "
            f"topk, extra_page_size, extra_topk) = {meta.config}, now {key}: use one per shape")


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | None = None,
    head_dim_v: int = 512,
    tile_scheduler_metadata: FlashMLASchedMeta | None = None,
    num_splits: None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
):
    """MLA decode over paged caches, sparse (``indices``: DeepSeek sparse attention, DSA;
    DeepSeek-V3.2 / V4) or dense (``block_table`` + ``cache_seqlens``) (sgl-kernel-xpu / FlashMLA
    drop-in).

    Sparse: for batch ``b``, query token ``s`` and head ``h``, the entries that count are
    ``i < topk_length[b]`` of ``indices[b, s]`` whose value lies in ``[0, num_pages * page_size)``,
    and likewise of ``extra_indices_in_kvcache[b, s]`` (``extra_topk_length``, the extra cache's
    token count). With logits ``z = softmax_scale * q[b, s, h] . K`` over all ``d_qk`` channels of
    each counted token (an entry listed twice counts twice)::

        lse[b, h, s]    = log(sum exp(z))
        out[b, s, h]    = softmax(z) @ V * exp(lse) / (exp(lse) + exp(attn_sink[h]))

    with ``V`` the first ``head_dim_v`` channels. A token with no counted entry gives ``out`` 0
    and ``lse`` ``+inf`` (upstream's value). Tokens no counted entry names are never read (they
    may hold NaN or garbage).

    Parameters
    ----------
    q : torch.Tensor
        ``[B, s_q, h_q, d_qk]`` fp16/bf16/fp32 queries (``s_q`` 1, or more for MTP; upstream bf16).
        Any strides with a contiguous last dim (else copied).
    k_cache : torch.Tensor
        ``[num_pages, page_size, 1, d]``. ``is_fp8_kvcache=False``: q's dtype, ``d = d_qk``, any
        page / token strides (last dim contiguous). ``is_fp8_kvcache=True``: ``float8_e4m3fn`` (or
        uint8) bytes, either DeepSeek-V4's packed pages (``d = 584``, ``d_qk = 512``; 448 fp8 +
        64 bf16 channels a token, UE8M0 scales at the page end, ``stride(0)`` = the page's bytes)
        or DeepSeek-V3.2's records (``d = 656``, ``d_qk = 576``; one token a ``stride(1)``).
    block_table : torch.Tensor, optional
        ``[B, max_pages]`` int32 page table of the dense path (with ``cache_seqlens``; no
        ``indices``): every query attends to the first ``cache_seqlens[b]`` tokens of its request
        (``causal``: query ``s`` to the first ``cache_seqlens[b] - s_q + 1 + s``).
    cache_seqlens : torch.Tensor, optional
        ``[B]`` int32 token counts of the dense path.
    head_dim_v : int
        Channels of V and of the output (upstream: 512): a multiple of 8 up to ``d_qk`` (512 for
        the fp8 layouts).
    tile_scheduler_metadata : FlashMLASchedMeta, optional
        None, or :func:`get_mla_metadata`'s first element: no schedule is precomputed; its first
        call records the shapes, later calls must repeat them (``ValueError``). A tensor (the
        older metadata API) raises ``ValueError``.
    num_splits : None
        Must be None (upstream's placeholder); a value raises ``ValueError``.
    softmax_scale : float, optional
        Scale of the ``d_qk``-channel dot; default ``d_qk ** -0.5``.
    causal : bool
        Dense path only (as upstream); True with ``indices`` raises ``ValueError``.
    is_fp8_kvcache : bool
        Whether the caches are fp8 (see ``k_cache``). The dense path takes q's dtype only.
    indices : torch.Tensor, optional
        ``[B, s_q, topk]`` int32 (or int64): ``page * page_size + slot`` of each selected token of
        ``k_cache``; -1 padding and any value outside ``[0, num_pages * page_size)`` are skipped.
    attn_sink : torch.Tensor, optional
        ``[h_q]`` float per-head sink logits (natural-log units of the scaled logits): they join
        the softmax denominator of the output only (``+inf``: output 0); ``lse`` excludes them.
    extra_k_cache : torch.Tensor, optional
        A second cache in ``k_cache``'s layout and dtype (its own page count and size), attended
        in the same softmax; with ``extra_indices_in_kvcache``.
    extra_indices_in_kvcache : torch.Tensor, optional
        ``[B, s_q, extra_topk]`` int32 (or int64) token indices into ``extra_k_cache``.
    topk_length, extra_topk_length : torch.Tensor, optional
        ``[B]`` int32 (or int64): only the first ``topk_length[b]`` entries of ``indices[b, s]``
        (of ``extra_indices_in_kvcache[b, s]``) count (values past the width mean all, <= 0 none);
        later entries are never read.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``out [B, s_q, h_q, head_dim_v]`` in q's dtype and ``lse [B, h_q, s_q]`` fp32, natural
        log of the scaled logits (``+inf`` for a query with nothing to attend to).

    No index value makes a kernel read or write outside the given tensors, and nothing here reads
    device values on the host (graph-capturable).
    """
    check_tensor("q", q, dtypes=FLOAT_DTYPES, ndim=4)
    B, s_q, h_q, d_qk = q.shape
    if d_qk % 8 or not 8 <= d_qk <= MAX_HEAD_DIM:
        raise ValueError(f"q: head dim d_qk must be a multiple of 8 from 8 to {MAX_HEAD_DIM}, got {d_qk}")
    causal = check_bool(causal, "causal")
    is_fp8 = check_bool(is_fp8_kvcache, "is_fp8_kvcache")
    head_dim_v = check_int(head_dim_v, "head_dim_v")
    dv_max = min(d_qk, 512) if is_fp8 else d_qk
    if head_dim_v % 8 or not 8 <= head_dim_v <= dv_max:
        raise ValueError(f"head_dim_v must be a multiple of 8 from 8 to {dv_max}, got {head_dim_v}")
    if num_splits is not None:
        raise ValueError("num_splits must be None (FlashMLA's placeholder): the split count is chosen per call")
    softmax_scale = d_qk ** -0.5 if softmax_scale is None else check_real(softmax_scale, "softmax_scale")
    if indices is None:
        return _dense(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, softmax_scale,
                      causal, is_fp8, attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length,
                      extra_topk_length)

    # ---- sparse ----
    if causal:
        raise ValueError("causal must be False with indices (sparse attention): the indices choose every key")
    if block_table is not None or cache_seqlens is not None:
        raise ValueError("block_table and cache_seqlens must be None with indices (sparse attention)")
    layout, page_size = _cache_layout("k_cache", k_cache, q, is_fp8)
    check_tensor("indices", indices, dtypes=INDEX_DTYPES, shape=(B, s_q, None))
    topk = indices.shape[2]
    if topk_length is not None:
        check_tensor("topk_length", topk_length, dtypes=INDEX_DTYPES, shape=(B,))
    if attn_sink is not None:
        check_tensor("attn_sink", attn_sink, dtypes=FLOAT_DTYPES, shape=(h_q,))
    if (extra_k_cache is None) != (extra_indices_in_kvcache is None):
        missing = "extra_indices_in_kvcache" if extra_indices_in_kvcache is None else "extra_k_cache"
        raise ValueError(f"{missing} must be given too: extra_k_cache and extra_indices_in_kvcache come together")
    extra = None
    x_topk = 0
    if extra_k_cache is not None:
        x_layout, x_page_size = _cache_layout("extra_k_cache", extra_k_cache, q, is_fp8)
        if x_layout != layout or extra_k_cache.dtype != k_cache.dtype:
            raise ValueError("extra_k_cache must have k_cache's layout and dtype")
        check_tensor("extra_indices_in_kvcache", extra_indices_in_kvcache, dtypes=INDEX_DTYPES, shape=(B, s_q, None))
        x_topk = extra_indices_in_kvcache.shape[2]
        if extra_topk_length is not None:
            check_tensor("extra_topk_length", extra_topk_length, dtypes=INDEX_DTYPES, shape=(B,))
    elif extra_topk_length is not None:
        raise ValueError("extra_topk_length needs extra_k_cache and extra_indices_in_kvcache")
    device = check_same_device(q=q, k_cache=k_cache, indices=indices, topk_length=topk_length, attn_sink=attn_sink,
                               extra_k_cache=extra_k_cache, extra_indices_in_kvcache=extra_indices_in_kvcache,
                               extra_topk_length=extra_topk_length)
    _check_sched_meta(tile_scheduler_metadata, (B, s_q, h_q, page_size, 1, causal, is_fp8, topk,
                                                None if extra_k_cache is None else extra_k_cache.shape[1],
                                                None if extra_k_cache is None else x_topk))

    dtype = q.dtype
    cache_name = ("plain", "fp8_v4", "fp8_v32")[layout]
    tiles = sparse_tiles(h_q, 1, d_qk, head_dim_v, dtype, device, op="mla_sparse_decode", cache=cache_name)
    out = torch.empty((B, s_q, h_q, head_dim_v), dtype=dtype, device=device)
    lse = torch.empty((B, h_q, s_q), dtype=torch.float32, device=device)
    tokens = B * s_q
    if tokens == 0 or h_q == 0:
        return out, lse
    if topk + x_topk == 0:
        out.zero_()
        lse.fill_(math.inf)
        return out, lse
    if q.stride(-1) != 1:
        q = q.contiguous()

    dest = out
    q, out = interpreter_float32(q, out)
    kv, kv_strides = _cache_arg(k_cache, layout)
    if layout == LAYOUT_PLAIN:
        (kv,) = interpreter_float32(kv)
        kv_strides = (kv.stride(0), kv.stride(1))
    if extra_k_cache is not None:
        x_kv, x_strides = _cache_arg(extra_k_cache, layout)
        if layout == LAYOUT_PLAIN:
            (x_kv,) = interpreter_float32(x_kv)
            x_strides = (x_kv.stride(0), x_kv.stride(1))
        xi = extra_indices_in_kvcache
        extra = dict(kv=x_kv, kv_strides=x_strides, page_size=extra_k_cache.shape[1],
                     num_rows=extra_k_cache.shape[0] * extra_k_cache.shape[1], indices=xi,
                     idx_strides=(xi.stride(0), xi.stride(1), xi.stride(2)), topk=x_topk,
                     topk_length=extra_topk_length,
                     tl_stride=extra_topk_length.stride(0) if extra_topk_length is not None else 0)

    compute_units = _device.compute_units(device)
    programs = tokens * tiles["programs_per_token"]
    splits, split_len = _splits(programs, topk + x_topk, tiles["BLOCK_N"], compute_units,
                                int(tiles["config"].get("SPLITS", 0) or 0),
                                int(tiles["config"].get("waves", _PROGRAMS_PER_UNIT)),
                                int(tiles["config"].get("min_split_tokens", _MIN_SPLIT_ENTRIES)))
    common = dict(
        grid=(tokens, tiles["programs_per_token"], splits), device=device,
        q=q, q_strides=(q.stride(0), q.stride(1), q.stride(2)),
        kv=kv, kv_strides=(*kv_strides, 0), page_size=page_size, num_rows=k_cache.shape[0] * page_size,
        indices=indices, idx_strides=(indices.stride(0), indices.stride(1), 0, indices.stride(2)),
        topk_length=topk_length, tl_strides=(topk_length.stride(0), 0) if topk_length is not None else (0, 0),
        attn_sink=attn_sink, sm_scale=softmax_scale, tokens_per_batch=s_q, topk=topk, layout=layout, paged=True,
        extra=extra, split_len=split_len)
    if splits == 1:
        launch_sparse(tiles, out=out, o_strides=(out.stride(0), out.stride(1), out.stride(2), 0),
                      lse=lse, l_strides=(lse.stride(0), lse.stride(2), lse.stride(1), 0), **common)
    else:
        part = torch.empty((tokens, h_q, splits, head_dim_v), dtype=torch.float32, device=device)
        part_lse = torch.empty((tokens, h_q, splits), dtype=torch.float32, device=device)
        # token (b, s) of the partials is row b * s_q + s
        launch_sparse(tiles, out=part, o_strides=(s_q * part.stride(0), part.stride(0), part.stride(1),
                                                  part.stride(2)),
                      lse=part_lse, l_strides=(s_q * part_lse.stride(0), part_lse.stride(0), part_lse.stride(1),
                                               part_lse.stride(2)), **common)
        max_splits = max(2, next_power_of_2(splits))
        block_dv = _combine_block_dv(head_dim_v, max_splits)
        with device_guard(device):
            _sparse_combine_kernel[(tokens, h_q, cdiv(head_dim_v, block_dv))](
                part, *part.stride()[:3],
                part_lse, *part_lse.stride()[:2], splits,
                attn_sink if attn_sink is not None else part_lse, attn_sink.stride(0) if attn_sink is not None else 0,
                out, *out.stride()[:3],
                lse, lse.stride(0), lse.stride(2), lse.stride(1),
                s_q, D_V=head_dim_v, MAX_SPLITS=max_splits, BLOCK_DV=block_dv,
                HAS_SINK=attn_sink is not None, num_warps=4,
                **(dict(WAIT_PRIOR_GRID=True, launch_pdl=True) if _device.programmatic_launch(device) else {}),
            )
    if out is not dest:
        dest.copy_(out)
    return dest, lse


def _dense(q, k_cache, block_table, cache_seqlens, head_dim_v, sched_meta, softmax_scale, causal, is_fp8,
           attn_sink, extra_k_cache, extra_indices, topk_length, extra_topk_length):
    """The dense path: :func:`flash_mla_decode` over ``block_table``, FlashMLA's output layout."""
    for name, value in (("attn_sink", attn_sink), ("extra_k_cache", extra_k_cache),
                        ("extra_indices_in_kvcache", extra_indices), ("topk_length", topk_length),
                        ("extra_topk_length", extra_topk_length)):
        if value is not None:
            raise ValueError(f"{name} needs indices (sparse attention): the dense path takes none")
    if block_table is None or cache_seqlens is None:
        missing = "indices, or block_table and cache_seqlens" if block_table is None and cache_seqlens is None else (
            "block_table" if block_table is None else "cache_seqlens")
        raise ValueError(f"{missing} must be given (sparse: indices; dense: block_table and cache_seqlens)")
    if is_fp8:
        raise ValueError("is_fp8_kvcache: the dense path takes caches of q's dtype only")
    B, s_q, h_q, d_qk = q.shape
    check_tensor("k_cache", k_cache, dtypes=(q.dtype,), ndim=4, last_dim_contiguous=True)
    if k_cache.shape[2] != 1:
        raise ValueError(f"k_cache must have one KV head ([num_pages, page_size, 1, d]), got shape {list(k_cache.shape)}")
    if k_cache.shape[3] != d_qk:
        raise ValueError(f"k_cache rows hold {k_cache.shape[3]} channels but q's head dim d_qk is {d_qk}")
    check_tensor("block_table", block_table, dtypes=INDEX_DTYPES, ndim=2)
    check_tensor("cache_seqlens", cache_seqlens, dtypes=INDEX_DTYPES, shape=(B,))
    if block_table.shape[0] != B:
        raise ValueError(f"block_table must have {B} rows (one per request), got shape {list(block_table.shape)}")
    device = check_same_device(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=cache_seqlens)
    page_size = k_cache.shape[1]
    _check_sched_meta(sched_meta, (B, s_q, h_q, page_size, 1, causal, is_fp8, None, None, None))
    if not causal and s_q > 1:
        # every query sees the whole request: one single-token request per query
        q = q.reshape(B * s_q, 1, h_q, d_qk)
        cache_seqlens = cache_seqlens.repeat_interleave(s_q)
        block_table = block_table.repeat_interleave(s_q, dim=0)
    b_eff, q_len = q.shape[0], q.shape[1]
    if block_table.stride(-1) != 1:
        block_table = block_table.contiguous()
    size = flash_mla_get_workspace_size(block_table.shape[1] * page_size, b_eff, h_q, page_size, -1, q_len=q_len,
                                        head_dim_v=head_dim_v, device=device)
    workspace = torch.empty(size, dtype=torch.uint8, device=device) if size else None
    out, lse = flash_mla_decode(q, None, k_cache, cache_seqlens, block_table, workspace, softmax_scale,
                                num_kv_splits=-1 if size else 1, return_lse=True, head_dim_v=head_dim_v)
    out = out.reshape(B, s_q, h_q, head_dim_v)
    lse = lse.reshape(B, s_q, h_q).transpose(1, 2)
    # a query without keys: out 0 and lse +inf, as upstream
    return out, torch.where(lse == -math.inf, math.inf, lse).contiguous()
