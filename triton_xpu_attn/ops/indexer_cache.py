"""The DeepSeek sparse attention (DSA) indexer's key cache (vllm-xpu-kernels' / vLLM's
``_C_cache_ops``): ``indexer_k_quant_and_cache`` (quantise keys to fp8 e4m3 with one fp32 scale per
``quant_block_size`` columns and store them in the paged cache) and
``cp_gather_indexer_k_quant_cache`` (gather each request's keys and scales back into contiguous
rows, the prefill indexer's input).

Cache layout (vLLM, vllm-xpu-kernels, DeepGEMM): ``kv_cache [num_blocks, block_size,
cache_stride]`` uint8 with ``cache_stride = D + 4 * D // quant_block_size``. Each block's bytes are
its ``block_size`` keys of ``D`` fp8 bytes (token ``o`` at byte ``o * D``), then their fp32
scales (token ``o``'s ``n = D // quant_block_size`` scales at byte ``block_size * D + 4 * n *
o``): the scales sit after all of the block's keys, not after each key. With ``quant_block_size ==
D`` (DeepSeek-V3.2: 128) this is the ``kv_layout="page"`` cache ``fp8_paged_mqa_logits`` reads
(as ``kv_cache.unsqueeze(-2)``).

Quantisation (vLLM's kernels): per token and column group, ``amax = max |k|`` in fp32,
``scale = max(amax, 1e-4) / 448``, with ``scale_fmt == "ue8m0"`` rounded up to a power of two
(``2 ** ceil(log2(scale))``), and each element stored as ``clamp(k / scale, -448, 448)`` in fp8
e4m3 (round to nearest even).

Memory contract: slot mappings, block tables and ``cu_seq_lens`` are device data that the kernels
never trust. A slot outside ``[0, num_blocks * block_size)`` writes nothing; a gathered row whose
block-table column or block id lies outside the table / cache is written as 0; rows of no request
are untouched. No op reads a device value on the host (graph-safe).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device
from .._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    cdiv,
    check_int,
    check_same_device,
    check_tensor,
    device_guard,
    fp8_cast,
    kernel_quantises,
    next_power_of_2,
    register_xpu_compile,
)
from .kv_cache import _check_request_tables, _check_slot_mapping, _request_rows, _token_slots

#: fp8 e4m3 (the indexer cache's format) largest finite value, the scale divisor
FP8_MAX = 448.0
#: smallest amax a scale is computed from (an all-zero group gets scale 1e-4 / 448)
AMAX_FLOOR = 1e-4
#: byte dtypes an fp8 key tensor may come as
_BYTE_DTYPES = (torch.uint8, torch.float8_e4m3fn)
_TILE_ELEMENTS = 2048  # elements of one [BLOCK_T, BLOCK_Q] tile


@triton.jit
def _indexer_k_quant_and_cache_kernel(
    k_ptr, k8_ptr, scale_in_ptr, cache8_ptr, cache_u8_ptr, slot_ptr,
    num_tokens, num_slots, block_size, stride_k_t, stride_k8_t, stride_cache_b, head_dim, quant_block, groups,
    BLOCK_T: tl.constexpr, BLOCK_Q: tl.constexpr, QUANT: tl.constexpr, UE8M0: tl.constexpr,
    INTEL_GPU: tl.constexpr = False,
):
    """Program (token tile, column group): the group's fp8 keys and its fp32 scale (as 4 bytes)
    into each token's slot. ``QUANT``: quantise ``k`` here; else copy the fp8 ``k8`` and
    ``scale_in`` computed by the launcher. ``INTEL_GPU``: e4m3 encoded in integer arithmetic
    (``fp8_cast``; the launcher sets it on XPU)."""
    g = tl.program_id(1).to(tl.int64)
    t, ok, blk, off = _token_slots(slot_ptr, num_tokens, num_slots, block_size, BLOCK_T)
    c = tl.arange(0, BLOCK_Q)
    col = g * quant_block + c
    mask = ok[:, None] & (c[None, :] < quant_block)
    if QUANT:
        x = tl.load(k_ptr + t[:, None] * stride_k_t + col[None, :], mask=mask, other=0.0).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4) / 448.0
        if UE8M0:
            scale = tl.exp2(tl.ceil(tl.log2(scale)))
        y = fp8_cast(tl.minimum(tl.maximum(x / scale[:, None], -448.0), 448.0), cache8_ptr, INTEL_GPU)
    else:
        y = tl.load(k8_ptr + t[:, None] * stride_k8_t + col[None, :], mask=mask)
        scale = tl.load(scale_in_ptr + t * groups + g, mask=ok, other=1.0)
    page = blk * stride_cache_b
    tl.store(cache8_ptr + (page + off * head_dim)[:, None] + col[None, :], y, mask=mask)
    # the scale's 4 bytes (little-endian) after the block's keys: no alignment needed
    bits = scale.to(tl.int32, bitcast=True)
    byte = tl.arange(0, 4)
    scale_bytes = ((bits[:, None] >> (byte[None, :] * 8)) & 255).to(tl.uint8)
    scale_at = page + block_size * head_dim + (off * groups + g) * 4
    tl.store(cache_u8_ptr + scale_at[:, None] + byte[None, :], scale_bytes, mask=ok[:, None])


@triton.jit
def _cp_gather_indexer_k_quant_cache_kernel(
    cache_ptr, dst_k_ptr, dst_scale_ptr, block_table_ptr, cu_ptr,
    dst_rows, batch, search_steps, num_blocks, max_blocks, block_size,
    stride_cache_b, stride_dk_t, stride_ds_t, stride_bt_b, head_dim, scale_bytes,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Program (dst row tile): each row finds its request, then copies its key bytes and scale
    bytes out of the cache; a row of no request is untouched, a row whose page lies outside the
    table / cache is 0."""
    t, b, pos, row_ok = _request_rows(cu_ptr, dst_rows, batch, search_steps, BLOCK_T)
    col = pos // block_size  # pos >= 0 on every row_ok row
    page_ok = row_ok & (col < max_blocks)
    blk = tl.load(block_table_ptr + b * stride_bt_b + col, mask=page_ok, other=-1).to(tl.int64)
    page_ok = page_ok & (blk >= 0) & (blk < num_blocks)
    # no selects on the offsets: every access below is masked by page_ok (a 1-D select feeding two
    # 2-D layouts fails Triton 3.6's sm_90 layout passes for some specialisations)
    page = blk * stride_cache_b
    off = pos % block_size
    for d0 in range(0, head_dim, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        in_width = d[None, :] < head_dim
        x = tl.load(cache_ptr + (page + off * head_dim)[:, None] + d[None, :], mask=page_ok[:, None] & in_width,
                    other=0)
        tl.store(dst_k_ptr + t[:, None] * stride_dk_t + d[None, :], x, mask=row_ok[:, None] & in_width)
    s = tl.arange(0, BLOCK_S)
    in_scales = s[None, :] < scale_bytes
    x = tl.load(cache_ptr + (page + block_size * head_dim + off * scale_bytes)[:, None] + s[None, :],
                mask=page_ok[:, None] & in_scales, other=0)
    tl.store(dst_scale_ptr + t[:, None] * stride_ds_t + s[None, :], x, mask=row_ok[:, None] & in_scales)


def _register_compile_variants() -> None:
    quant = dict(
        k8_ptr="*fp8e4nv", scale_in_ptr="*fp32", cache8_ptr="*fp8e4nv", cache_u8_ptr="*u8", slot_ptr="*i64",
        num_tokens="i32", num_slots="i64", block_size="i32", stride_k_t="i64", stride_k8_t="i64",
        stride_cache_b="i64", head_dim="i32", quant_block="i32", groups="i32",
        INTEL_GPU=True,  # as the launcher sets it on XPU
    )
    # 8 tokens a tile: 16 x 64 tiles spill 5.3 KB (PVC, 128 GRF) where 8 x 64 and 16 x 128 do not
    register_xpu_compile(_indexer_k_quant_and_cache_kernel, "bf16->fp8e4m3,D128,Q128,ue8m0", dict(
        quant, k_ptr="*bf16", BLOCK_T=8, BLOCK_Q=128, QUANT=True, UE8M0=True), num_warps=4)
    register_xpu_compile(_indexer_k_quant_and_cache_kernel, "fp32->fp8e4m3,D128,Q64", dict(
        quant, k_ptr="*fp32", BLOCK_T=8, BLOCK_Q=64, QUANT=True, UE8M0=False), num_warps=4)
    register_xpu_compile(_indexer_k_quant_and_cache_kernel, "fp32->fp8e4m3,D512,Q512,ue8m0", dict(
        quant, k_ptr="*fp32", BLOCK_T=4, BLOCK_Q=512, QUANT=True, UE8M0=True), num_warps=4)
    gather = dict(
        cache_ptr="*u8", dst_k_ptr="*u8", dst_scale_ptr="*u8", block_table_ptr="*i32", cu_ptr="*i32",
        dst_rows="i32", batch="i32", search_steps="i32", num_blocks="i64", max_blocks="i32", block_size="i32",
        stride_cache_b="i64", stride_dk_t="i64", stride_ds_t="i64", stride_bt_b="i64", head_dim="i32",
        scale_bytes="i32",
    )
    register_xpu_compile(_cp_gather_indexer_k_quant_cache_kernel, "D128,Q128", dict(
        gather, BLOCK_T=16, BLOCK_D=128, BLOCK_S=4), num_warps=4)


_register_compile_variants()


# ---- launchers ----


def _quant_in_kernel() -> bool:
    """Whether the kernel quantises. Under the interpreter its fp32 -> fp8 cast drops a mantissa
    carry into the exponent (31.94 -> 16 in e4m3), so there torch quantises (the kernel's formula,
    :func:`quantize_indexer_k`) and the kernel stores the fp8 bytes and scales, its slot handling,
    masking and layout unchanged, where ``kernel_quantises`` says it does not quantise e4m3."""
    return kernel_quantises(torch.float8_e4m3fn)


def quantize_indexer_k(k: torch.Tensor, quant_block_size: int, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k_fp8 [T, D] float8_e4m3fn, scales [T, D // quant_block_size] fp32)``: vLLM's indexer
    quantisation of ``k [T, D]`` in fp32 (see the module docstring)."""
    x = k.float().reshape(k.shape[0], -1, quant_block_size)
    scale = x.abs().amax(dim=-1).clamp_min(AMAX_FLOOR) / FP8_MAX
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (x / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(k.shape), scale


def _indexer_cache(kv_cache, head_dim: int, quant_block_size: int) -> torch.Tensor:
    """``kv_cache [num_blocks, block_size, cache_stride]`` as uint8 bytes, checked to hold a block's
    keys and scales inside its contiguous bytes."""
    check_tensor("kv_cache", kv_cache, dtypes=_BYTE_DTYPES, ndim=3)
    raw = kv_cache.view(torch.uint8)
    num_blocks, block_size, cache_stride = raw.shape
    need = head_dim + 4 * (head_dim // quant_block_size)
    if cache_stride < need:
        raise ValueError(f"kv_cache must have at least D + 4 * D // quant_block_size = {need} bytes per token (dim 2), "
                         f"got shape {list(kv_cache.shape)}")
    if num_blocks * block_size and (raw.stride(2) != 1 or (block_size > 1 and raw.stride(1) != cache_stride)):
        raise ValueError(f"kv_cache: each block's bytes must be contiguous (strides [*, {cache_stride}, 1]), got "
                         f"strides {list(raw.stride())}")
    return raw


def _check_quant_block(quant_block_size, head_dim: int) -> int:
    qbs = check_int(quant_block_size, "quant_block_size", minimum=1)
    if head_dim % qbs:
        raise ValueError(f"quant_block_size must divide the head dim {head_dim}, got {qbs}")
    return qbs


def indexer_k_quant_and_cache(
    k: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    quant_block_size: int,
    scale_fmt: str | None = None,
) -> None:
    """vLLM's ``indexer_k_quant_and_cache`` (``torch.ops._C_cache_ops``): quantise the DSA
    indexer's keys to fp8 e4m3 with one fp32 scale per ``quant_block_size`` columns and store keys
    and scales in the paged indexer cache, in place.

    Token ``t < T`` with ``s = slot_mapping[t]`` in ``[0, num_blocks * block_size)``, block ``blk =
    s // block_size`` and offset ``o = s % block_size``: for each column group ``g`` (columns ``[g
    * Q, (g + 1) * Q)``, ``Q = quant_block_size``), ``scale = max(max |k[t, group]|, 1e-4) / 448``
    in fp32 (``scale_fmt == "ue8m0"``: ``2 ** ceil(log2(scale))``, a power of two); the block's
    bytes ``[o * D + g * Q, + Q)`` get ``clamp(k / scale, -448, 448)`` as e4m3 (nearest even) and its
    bytes ``block_size * D + 4 * (o * D // Q + g)`` the scale's 4 fp32 bytes. Any other slot (-1
    padding, past the cache, int64 extremes) writes nothing. ``T = min(k.shape[0],
    slot_mapping.shape[0])``. Graph-safe: no host sync.

    Parameters
    ----------
    k : torch.Tensor
        ``[T_k, D]`` (or ``[T_k, 1, D]``) fp16 / bf16 / fp32 keys, last dim contiguous, any row
        stride.
    kv_cache : torch.Tensor
        ``[num_blocks, block_size, cache_stride]`` uint8 (or an fp8 e4m3 view of the bytes),
        ``cache_stride >= D + 4 * D // Q`` (vLLM allocates exactly that); each block's bytes
        contiguous, blocks any stride apart.
    slot_mapping : torch.Tensor
        ``[T_s]`` int64 / int32 (contiguous) slots, ``block * block_size + offset``.
    quant_block_size : int
        Columns per scale ``Q``, dividing ``D`` (DeepSeek-V3.2: 128 = ``D``).
    scale_fmt : str, optional
        ``"ue8m0"``: power-of-two scales; anything else (vLLM passes the model's ``scale_fmt``
        string): plain fp32 scales.
    """
    check_tensor("k", k, dtypes=FLOAT_DTYPES, ndim=(2, 3), last_dim_contiguous=True)
    if k.dim() == 3:
        if k.shape[1] != 1:
            raise ValueError(f"k must have shape [T, D] or [T, 1, D], got {list(k.shape)}")
        k = k[:, 0]
    if scale_fmt is not None and not isinstance(scale_fmt, str):
        raise TypeError(f"scale_fmt must be a str or None, got {type(scale_fmt).__name__}")
    head_dim = k.shape[1]
    qbs = _check_quant_block(quant_block_size, head_dim)
    cache = _indexer_cache(kv_cache, head_dim, qbs)
    num_blocks, block_size, _ = cache.shape
    # vLLM's kernels run k.shape[0] tokens (vllm-xpu-kernels, CUDA) and vLLM trims k to the slot
    # mapping: the tokens both cover
    num_tokens = min(k.shape[0], _check_slot_mapping(slot_mapping, 1 << 62, "k"))
    device = check_same_device(k=k, kv_cache=kv_cache, slot_mapping=slot_mapping)
    if num_tokens == 0 or head_dim == 0 or num_blocks * block_size == 0:
        return
    groups = head_dim // qbs
    ue8m0 = scale_fmt == "ue8m0"
    intel = _device.intel_gpu()
    quant = _quant_in_kernel()
    k8, scales = (k, k) if quant else quantize_indexer_k(k[:num_tokens], qbs, ue8m0)
    block_q = next_power_of_2(qbs)
    block_t = max(1, min(8, _TILE_ELEMENTS // block_q))
    with device_guard(device):
        _indexer_k_quant_and_cache_kernel[(cdiv(num_tokens, block_t), groups)](
            k, k8, scales, cache.view(torch.float8_e4m3fn), cache, slot_mapping,
            num_tokens, num_blocks * block_size, block_size, k.stride(0), k8.stride(0), cache.stride(0), head_dim,
            qbs, groups, BLOCK_T=block_t, BLOCK_Q=block_q, QUANT=quant, UE8M0=ue8m0, INTEL_GPU=intel, num_warps=4,
        )


def cp_gather_indexer_k_quant_cache(
    kv_cache: torch.Tensor,
    dst_k: torch.Tensor,
    dst_scale: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
) -> None:
    """vLLM's ``cp_gather_indexer_k_quant_cache`` (``torch.ops._C_cache_ops``): copy each request's
    fp8 indexer keys and their scale bytes out of the paged indexer cache into contiguous rows (the
    prefill indexer's ``fp8_mqa_logits`` input), in place.

    With ``B = block_table.shape[0]``, ``D = dst_k.shape[1]`` and ``S = dst_scale.shape[1]`` scale
    bytes per token (``quant_block_size = 4 * D // S``): for request ``b < B`` and ``i <
    cu_seq_lens[b + 1] - cu_seq_lens[b]``, row ``t = cu_seq_lens[b] + i`` takes block ``blk =
    block_table[b, i // block_size]``, offset ``o = i % block_size``: ``dst_k[t] = blk's bytes [o *
    D, + D)`` and ``dst_scale[t] = blk's bytes [block_size * D + o * S, + S)``. A row whose column
    lies past the table or whose block id lies outside ``[0, num_blocks)`` is written as 0 (keys
    and scales); rows of ``dst_k`` / ``dst_scale`` outside every request (vLLM's workspace is
    longer than the chunk) are left untouched. ``cu_seq_lens`` must be non-decreasing for this to
    hold; other values never make the kernel read or write outside its tensors. Graph-safe.

    Parameters
    ----------
    kv_cache : torch.Tensor
        ``[num_blocks, block_size, cache_stride]`` uint8 (or fp8 e4m3 view), ``cache_stride >= D +
        S``, each block's bytes contiguous (:func:`indexer_k_quant_and_cache`'s layout).
    dst_k : torch.Tensor
        ``[N, D]`` fp8 e4m3 (or uint8) destination keys, last dim contiguous.
    dst_scale : torch.Tensor
        ``[N, S]`` uint8 (vLLM: ``[N, 4]``, one fp32 scale as bytes; ``.view(torch.float32)`` reads
        it) destination scale bytes, ``S`` a positive multiple of 4 with ``4 * D // S`` dividing
        ``D``; last dim contiguous.
    block_table : torch.Tensor
        ``[B, max_blocks]`` int32 / int64 (last dim contiguous) block ids per request.
    cu_seq_lens : torch.Tensor
        ``[>= B + 1]`` int32 / int64 (contiguous) cumulative lengths: request ``b``'s rows are
        ``[cu_seq_lens[b], cu_seq_lens[b + 1])``.
    """
    check_tensor("dst_k", dst_k, dtypes=_BYTE_DTYPES, ndim=2, last_dim_contiguous=True)
    rows, head_dim = dst_k.shape
    check_tensor("dst_scale", dst_scale, dtypes=(torch.uint8,), shape=(rows, None), last_dim_contiguous=True)
    scale_bytes = dst_scale.shape[1]
    if scale_bytes < 4 or scale_bytes % 4 or head_dim % (scale_bytes // 4):
        raise ValueError(f"dst_scale must hold 4 bytes per scale and D // quant_block_size scales a row (D = "
                         f"{head_dim}), got shape {list(dst_scale.shape)}")
    cache = _indexer_cache(kv_cache, head_dim, head_dim // (scale_bytes // 4))
    num_blocks, block_size, _ = cache.shape
    check_tensor("block_table", block_table, dtypes=INDEX_DTYPES, ndim=2)
    batch = block_table.shape[0]
    _check_request_tables(block_table, cu_seq_lens, None, batch)
    device = check_same_device(kv_cache=kv_cache, dst_k=dst_k, dst_scale=dst_scale, block_table=block_table,
                               cu_seq_lens=cu_seq_lens)
    if batch == 0 or rows == 0:
        return
    block_d = min(next_power_of_2(max(head_dim, 1)), 256)
    block_t = max(1, min(16, _TILE_ELEMENTS // block_d))
    with device_guard(device):
        _cp_gather_indexer_k_quant_cache_kernel[(cdiv(rows, block_t),)](
            cache, dst_k.view(torch.uint8), dst_scale, block_table, cu_seq_lens,
            rows, batch, batch.bit_length(), num_blocks, block_table.shape[1], block_size,
            cache.stride(0), dst_k.stride(0), dst_scale.stride(0), block_table.stride(0), head_dim, scale_bytes,
            BLOCK_T=block_t, BLOCK_D=block_d, BLOCK_S=next_power_of_2(scale_bytes), num_warps=4,
        )
