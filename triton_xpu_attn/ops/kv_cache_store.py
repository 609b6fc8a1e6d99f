"""KV-cache stores of vLLM's attention backends (vllm-xpu-kernels' ``_C_cache_ops``):
``reshape_and_cache_flash`` (paged K/V store), ``reshape_and_cache`` (vLLM's paged-attention
layout: keys in ``x``-element chunks, values transposed) and ``concat_and_cache_mla`` (MLA latent
store), quantised to fp8 where ``kv_cache_dtype`` names a format. The checks and kernel helpers they
share with the gathers are ``kv_cache.py``'s.

A slot outside ``[0, num_blocks * block_size)`` (the padding slot -1, a slot past the cache, int64
extremes) writes nothing; no op reads a device value on the host, so every call is graph-safe.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device
from .._common import (FLOAT_DTYPES, cdiv, check_same_device, check_tensor, device_guard, fp8_cast, kernel_quantises,
                       register_xpu_compile)
from .kv_cache import (
    _TILE_ELEMENTS,
    _cache_view,
    _check_scale,
    _check_slot_mapping,
    _fp8_format,
    _store_rows,
    _token_slots,
    _token_tile,
)


@triton.jit
def _reshape_and_cache_flash_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    num_tokens, num_slots, block_size,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_kc_b, stride_kc_s, stride_kc_h, stride_vc_b, stride_vc_s, stride_vc_h,
    head_dim, v_head_dim,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr, FP8_MAX: tl.constexpr,
    INTEL_GPU: tl.constexpr = False,
):
    """Program (token tile, kv head): key/value rows of BLOCK_T tokens into their cache slots.
    ``INTEL_GPU``: e4m3 encoded in integer arithmetic (``fp8_cast``; the launcher sets it on XPU)."""
    h = tl.program_id(1).to(tl.int64)
    t, ok, blk, off = _token_slots(slot_ptr, num_tokens, num_slots, block_size, BLOCK_T)
    k_row = blk * stride_kc_b + off * stride_kc_s
    v_row = blk * stride_vc_b + off * stride_vc_s
    k_scale = 1.0
    v_scale = 1.0
    if QUANT:
        k_scale = tl.load(k_scale_ptr).to(tl.float32)
        v_scale = tl.load(v_scale_ptr).to(tl.float32)
    _store_rows(key_ptr + h * stride_k_h, stride_k_t, t, key_cache_ptr, k_row + h * stride_kc_h, ok, head_dim,
                k_scale, BLOCK_D, QUANT, FP8_MAX, INTEL_GPU)
    _store_rows(value_ptr + h * stride_v_h, stride_v_t, t, value_cache_ptr, v_row + h * stride_vc_h, ok, v_head_dim,
                v_scale, BLOCK_D, QUANT, FP8_MAX, INTEL_GPU)


@triton.jit
def _concat_and_cache_mla_kernel(
    kv_c_ptr, k_pe_ptr, cache_ptr, slot_ptr, scale_ptr,
    num_tokens, num_slots, block_size, stride_c_t, stride_pe_t, stride_cache_b, stride_cache_s,
    rank, pe_dim,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr, FP8_MAX: tl.constexpr,
    INTEL_GPU: tl.constexpr = False,
):
    """Program (token tile): ``[kv_c | k_pe]`` rows of BLOCK_T tokens into their cache slots
    (``INTEL_GPU``: as in ``_reshape_and_cache_flash_kernel``)."""
    t, ok, blk, off = _token_slots(slot_ptr, num_tokens, num_slots, block_size, BLOCK_T)
    row = blk * stride_cache_b + off * stride_cache_s
    scale = 1.0
    if QUANT:
        scale = tl.load(scale_ptr).to(tl.float32)
    _store_rows(kv_c_ptr, stride_c_t, t, cache_ptr, row, ok, rank, scale, BLOCK_D, QUANT, FP8_MAX, INTEL_GPU)
    _store_rows(k_pe_ptr, stride_pe_t, t, cache_ptr, row + rank, ok, pe_dim, scale, BLOCK_D, QUANT, FP8_MAX, INTEL_GPU)


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    num_tokens, num_slots, block_size,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_kc_b, stride_kc_h, stride_kc_x, stride_kc_s, stride_vc_b, stride_vc_h, stride_vc_d, stride_vc_s,
    head_dim,
    X: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr, FP8_MAX: tl.constexpr,
    INTEL_GPU: tl.constexpr = False,
):
    """Program (token tile, kv head): vLLM's paged-attention layout, element ``d`` of token ``t``'s
    key at ``key_cache[blk, h, d // X, off, d % X]`` and of its value at
    ``value_cache[blk, h, d, off]`` (``INTEL_GPU``: as in ``_reshape_and_cache_flash_kernel``)."""
    h = tl.program_id(1).to(tl.int64)
    t, ok, blk, off = _token_slots(slot_ptr, num_tokens, num_slots, block_size, BLOCK_T)
    k_row = blk * stride_kc_b + h * stride_kc_h + off * stride_kc_s
    v_row = blk * stride_vc_b + h * stride_vc_h + off * stride_vc_s
    k_scale = 1.0
    v_scale = 1.0
    if QUANT:
        k_scale = tl.load(k_scale_ptr).to(tl.float32)
        v_scale = tl.load(v_scale_ptr).to(tl.float32)
    # keys, then values: one tile live at a time (both at once spill 0.9 KB in fp8 on PVC)
    for d0 in range(0, head_dim, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (d[None, :] < head_dim)
        k = tl.load(key_ptr + t[:, None] * stride_k_t + h * stride_k_h + d[None, :], mask=mask, other=0.0)
        if QUANT:
            k = tl.minimum(tl.maximum(k.to(tl.float32) / k_scale, -FP8_MAX), FP8_MAX)
        k_col = (d // X) * stride_kc_x + d % X
        tl.store(key_cache_ptr + k_row[:, None] + k_col[None, :], fp8_cast(k, key_cache_ptr, INTEL_GPU), mask=mask)
    for d0 in range(0, head_dim, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (d[None, :] < head_dim)
        v = tl.load(value_ptr + t[:, None] * stride_v_t + h * stride_v_h + d[None, :], mask=mask, other=0.0)
        if QUANT:
            v = tl.minimum(tl.maximum(v.to(tl.float32) / v_scale, -FP8_MAX), FP8_MAX)
        tl.store(value_cache_ptr + v_row[:, None] + d[None, :] * stride_vc_d, fp8_cast(v, value_cache_ptr, INTEL_GPU),
                 mask=mask)


def _register_compile_variants() -> None:
    flash = dict(
        num_tokens="i32", num_slots="i64", block_size="i32", stride_k_t="i64", stride_k_h="i32", stride_v_t="i64",
        stride_v_h="i32", stride_kc_b="i64", stride_kc_s="i64", stride_kc_h="i32", stride_vc_b="i64",
        stride_vc_s="i64", stride_vc_h="i32", head_dim="i32", v_head_dim="i32",
        slot_ptr="*i64", k_scale_ptr="*fp32", v_scale_ptr="*fp32",
    )
    register_xpu_compile(_reshape_and_cache_flash_kernel, "bf16,D128", dict(
        flash, key_ptr="*bf16", value_ptr="*bf16", key_cache_ptr="*bf16", value_cache_ptr="*bf16",
        BLOCK_T=8, BLOCK_D=128, QUANT=False, FP8_MAX=0.0, INTEL_GPU=True), num_warps=4)
    register_xpu_compile(_reshape_and_cache_flash_kernel, "bf16->fp8e4m3,D128", dict(
        flash, key_ptr="*bf16", value_ptr="*bf16", key_cache_ptr="*fp8e4nv", value_cache_ptr="*fp8e4nv",
        BLOCK_T=8, BLOCK_D=128, QUANT=True, FP8_MAX=448.0, INTEL_GPU=True), num_warps=4)
    mla = dict(
        slot_ptr="*i64", scale_ptr="*fp32", num_tokens="i32", num_slots="i64", block_size="i32", stride_c_t="i64",
        stride_pe_t="i64", stride_cache_b="i64", stride_cache_s="i64", rank="i32", pe_dim="i32",
    )
    register_xpu_compile(_concat_and_cache_mla_kernel, "bf16,R512,Dr64", dict(
        mla, kv_c_ptr="*bf16", k_pe_ptr="*bf16", cache_ptr="*bf16", BLOCK_T=8, BLOCK_D=256, QUANT=False,
        FP8_MAX=0.0, INTEL_GPU=True), num_warps=4)
    register_xpu_compile(_concat_and_cache_mla_kernel, "bf16->fp8e4m3,R512,Dr64", dict(
        mla, kv_c_ptr="*bf16", k_pe_ptr="*bf16", cache_ptr="*fp8e4nv", BLOCK_T=8, BLOCK_D=256, QUANT=True,
        FP8_MAX=448.0, INTEL_GPU=True), num_warps=4)
    paged = dict(
        slot_ptr="*i64", k_scale_ptr="*fp32", v_scale_ptr="*fp32", num_tokens="i32", num_slots="i64",
        block_size="i32", stride_k_t="i64", stride_k_h="i32", stride_v_t="i64", stride_v_h="i32",
        stride_kc_b="i64", stride_kc_h="i64", stride_kc_x="i32", stride_kc_s="i32", stride_vc_b="i64",
        stride_vc_h="i64", stride_vc_d="i32", stride_vc_s="i32", head_dim="i32",
    )
    register_xpu_compile(_reshape_and_cache_kernel, "bf16,D128,x8", dict(
        paged, key_ptr="*bf16", value_ptr="*bf16", key_cache_ptr="*bf16", value_cache_ptr="*bf16", X=8,
        BLOCK_T=8, BLOCK_D=128, QUANT=False, FP8_MAX=0.0, INTEL_GPU=True), num_warps=4)
    register_xpu_compile(_reshape_and_cache_kernel, "bf16->fp8e4m3,D128,x16", dict(
        paged, key_ptr="*bf16", value_ptr="*bf16", key_cache_ptr="*fp8e4nv", value_cache_ptr="*fp8e4nv", X=16,
        BLOCK_T=8, BLOCK_D=128, QUANT=True, FP8_MAX=448.0, INTEL_GPU=True), num_warps=4)


_register_compile_variants()


# ---- launchers ----


def _kv_store_checks(key, value, key_cache, value_cache, slot_mapping, fmt, k_scale, v_scale):
    """``(num_tokens, k_scale, v_scale, device)`` of a K/V cache store whose tensors are checked."""
    num_tokens = _check_slot_mapping(slot_mapping, key.shape[0], "key")
    k_scale = _check_scale("k_scale", k_scale, fmt is not None)
    v_scale = _check_scale("v_scale", v_scale, fmt is not None)
    device = check_same_device(key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                               slot_mapping=slot_mapping, k_scale=k_scale, v_scale=v_scale)
    return num_tokens, k_scale, v_scale, device


def _store_mode(fmt, inputs, scales, num_tokens: int):
    """``(inputs, QUANT, FP8_MAX)`` of a cache store: the kernel quantises where
    ``kernel_quantises(fmt)``; elsewhere (the interpreter) torch quantises the inputs with the
    kernel's formula (``clamp(x / scale)`` in fp32, then the cast) and the kernel copies fp8 bytes,
    its slot handling, masking and strides unchanged."""
    if fmt is None:
        return inputs, False, 0.0
    fp8_max = torch.finfo(fmt).max
    if kernel_quantises(fmt):
        return inputs, True, float(fp8_max)
    return tuple((x[:num_tokens].float() / s.reshape(()).float()).clamp(-fp8_max, fp8_max).to(fmt)
                 for x, s in zip(inputs, scales)), False, 0.0


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """vLLM's ``reshape_and_cache_flash`` (``torch.ops._C_cache_ops``): store each token's key and
    value into the paged cache at its slot, in place.

    Token ``t`` with ``s = slot_mapping[t]`` in ``[0, num_blocks * block_size)`` writes
    ``key_cache[s // block_size, s % block_size] = key[t]`` (and the value likewise). Any other
    slot (vLLM's padding slot -1, a slot past the cache, int64 extremes) writes nothing. With an
    fp8 ``kv_cache_dtype`` each element is stored as ``x / scale`` computed in fp32, saturated to
    the fp8 range, rounded to nearest even. Graph-safe: no host sync.

    Parameters
    ----------
    key : torch.Tensor
        ``[T_in, H_kv, D]`` fp16 / bf16 / fp32 keys, ``T_in >= T`` (rows past ``T`` are padding,
        not read); any strides with the last dim contiguous.
    value : torch.Tensor
        ``[T_in, H_kv, Dv]`` values, ``key``'s dtype (``Dv`` may differ from ``D``).
    key_cache : torch.Tensor
        ``[num_blocks, block_size, H_kv, D]`` destination: ``key``'s dtype with "auto", else fp8 in
        the format ``kv_cache_dtype`` names or uint8 holding it (vLLM's fp8 allocation). Any
        strides with the last dim contiguous (e.g. the K half of one ``[..., H_kv, 2D]`` buffer).
    value_cache : torch.Tensor
        ``[num_blocks, block_size, H_kv, Dv]``, ``key_cache``'s dtype, last dim contiguous.
    slot_mapping : torch.Tensor
        ``[T]`` int64 / int32 (contiguous): slot of each token, ``block * block_size + offset``.
    kv_cache_dtype : str
        ``"auto"`` (the cache stores ``key``'s dtype) or ``"fp8"`` / ``"fp8_e4m3"`` (e4m3fn),
        ``"fp8_e5m2"``.
    k_scale, v_scale : torch.Tensor, optional
        One-element fp32 quantisation scales, required with fp8 (not read with "auto").
    """
    fmt = _fp8_format(kv_cache_dtype)
    check_tensor("key", key, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    rows, heads, head_dim = key.shape
    check_tensor("value", value, dtypes=(key.dtype,), shape=(rows, heads, None), last_dim_contiguous=True)
    v_head_dim = value.shape[2]
    key_cache = _cache_view("key_cache", key_cache, fmt, key.dtype)
    check_tensor("key_cache", key_cache, ndim=4, shape=(None, None, heads, head_dim), last_dim_contiguous=True)
    num_blocks, block_size = key_cache.shape[:2]
    value_cache = _cache_view("value_cache", value_cache, fmt, key.dtype)
    check_tensor("value_cache", value_cache, shape=(num_blocks, block_size, heads, v_head_dim),
                 last_dim_contiguous=True)
    num_tokens, k_scale, v_scale, device = _kv_store_checks(key, value, key_cache, value_cache, slot_mapping, fmt,
                                                            k_scale, v_scale)
    if num_tokens == 0 or heads == 0 or num_blocks * block_size == 0:
        return
    intel = _device.intel_gpu()
    (key, value), quant, fp8_max = _store_mode(fmt, (key, value), (k_scale, v_scale), num_tokens)
    # half the tile of the MLA ops: 16 x 128 fp8 stores spill 1.7 KB on BMG at 128 GRF, 8 x 128 none
    block_t, block_d = _token_tile(max(head_dim, v_head_dim), _TILE_ELEMENTS // 2)
    with device_guard(device):  # the scales are not read unless QUANT (slot_mapping stands in)
        _reshape_and_cache_flash_kernel[(cdiv(num_tokens, block_t), heads)](
            key, value, key_cache, value_cache, slot_mapping,
            k_scale if quant else slot_mapping, v_scale if quant else slot_mapping, num_tokens, num_blocks * block_size, block_size,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
            head_dim, v_head_dim, BLOCK_T=block_t, BLOCK_D=block_d, QUANT=quant, FP8_MAX=fp8_max, INTEL_GPU=intel,
            num_warps=4,
        )


def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    scale: torch.Tensor | None = None,
) -> None:
    """vLLM's ``concat_and_cache_mla`` (``torch.ops._C_cache_ops``): store each token's MLA latent
    ``[kv_c | k_pe]`` into the paged cache at its slot, in place.

    Token ``t`` with ``s = slot_mapping[t]`` in ``[0, num_blocks * block_size)`` writes
    ``kv_cache[s // block_size, s % block_size] = cat(kv_c[t], k_pe[t])``; any other slot (-1
    padding, past the cache, int64 extremes) writes nothing. With fp8, each element is stored as
    ``x / scale`` in fp32, saturated, rounded to nearest even. Graph-safe.

    Parameters
    ----------
    kv_c : torch.Tensor
        ``[T_in, R]`` fp16 / bf16 / fp32 compressed latents (``T_in >= T``; last dim contiguous).
    k_pe : torch.Tensor
        ``[T_in, Dr]`` rope keys, ``kv_c``'s dtype, last dim contiguous.
    kv_cache : torch.Tensor
        ``[num_blocks, block_size, R + Dr]``: ``kv_c``'s dtype with "auto", else fp8 (or uint8
        holding it); any strides with the last dim contiguous.
    slot_mapping : torch.Tensor
        ``[T]`` int64 / int32 (contiguous) slots.
    kv_cache_dtype : str
        ``"auto"``, ``"fp8"`` / ``"fp8_e4m3"``, ``"fp8_e5m2"``.
    scale : torch.Tensor, optional
        One-element fp32 quantisation scale, required with fp8.
    """
    fmt = _fp8_format(kv_cache_dtype)
    check_tensor("kv_c", kv_c, dtypes=FLOAT_DTYPES, ndim=2, last_dim_contiguous=True)
    rows, rank = kv_c.shape
    check_tensor("k_pe", k_pe, dtypes=(kv_c.dtype,), shape=(rows, None), last_dim_contiguous=True)
    pe_dim = k_pe.shape[1]
    kv_cache = _cache_view("kv_cache", kv_cache, fmt, kv_c.dtype)
    check_tensor("kv_cache", kv_cache, ndim=3, shape=(None, None, rank + pe_dim), last_dim_contiguous=True)
    num_blocks, block_size = kv_cache.shape[:2]
    num_tokens = _check_slot_mapping(slot_mapping, rows, "kv_c")
    scale = _check_scale("scale", scale, fmt is not None)
    device = check_same_device(kv_c=kv_c, k_pe=k_pe, kv_cache=kv_cache, slot_mapping=slot_mapping, scale=scale)
    if num_tokens == 0 or num_blocks * block_size == 0 or rank + pe_dim == 0:
        return
    intel = _device.intel_gpu()
    (kv_c, k_pe), quant, fp8_max = _store_mode(fmt, (kv_c, k_pe), (scale, scale), num_tokens)
    block_t, block_d = _token_tile(max(rank, pe_dim))
    with device_guard(device):
        _concat_and_cache_mla_kernel[(cdiv(num_tokens, block_t),)](
            kv_c, k_pe, kv_cache, slot_mapping, scale if quant else slot_mapping,
            num_tokens, num_blocks * block_size, block_size, kv_c.stride(0), k_pe.stride(0),
            kv_cache.stride(0), kv_cache.stride(1), rank, pe_dim,
            BLOCK_T=block_t, BLOCK_D=block_d, QUANT=quant, FP8_MAX=fp8_max, INTEL_GPU=intel,
            num_warps=4,
        )


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """vLLM's ``reshape_and_cache`` (``torch.ops._C_cache_ops``): store each token's key and value
    into vLLM's paged-attention cache layout (keys split in ``x``-element chunks, values
    transposed), in place.

    Token ``t`` with ``s = slot_mapping[t]`` in ``[0, num_blocks * block_size)`` writes, for ``d <
    D``, ``key_cache[s // block_size, h, d // x, s % block_size, d % x] = key[t, h, d]`` and
    ``value_cache[s // block_size, h, d, s % block_size] = value[t, h, d]``. Any other slot (-1
    padding, past the cache, int64 extremes) writes nothing. With an fp8 ``kv_cache_dtype`` each
    element is stored as ``x / scale`` in fp32, saturated, rounded to nearest even (vLLM's CUDA
    kernel's rule, the same as ``reshape_and_cache_flash``). Graph-safe: no host sync.

    Parameters
    ----------
    key : torch.Tensor
        ``[T_in, H_kv, D]`` fp16 / bf16 / fp32 keys, ``T_in >= T``; any strides with the last dim
        contiguous.
    value : torch.Tensor
        ``[T_in, H_kv, D]`` values, ``key``'s dtype, last dim contiguous.
    key_cache : torch.Tensor
        ``[num_blocks, H_kv, D // x, block_size, x]`` (vLLM: ``x = 16 // element_size``, any ``x``
        dividing ``D`` here): ``key``'s dtype with "auto", else fp8 in the format
        ``kv_cache_dtype`` names or uint8 holding it. Any strides with the last dim contiguous.
    value_cache : torch.Tensor
        ``[num_blocks, H_kv, D, block_size]``, ``key_cache``'s dtype, any strides.
    slot_mapping : torch.Tensor
        ``[T]`` int64 / int32 (contiguous): slot of each token, ``block * block_size + offset``.
    kv_cache_dtype : str
        ``"auto"``, ``"fp8"`` / ``"fp8_e4m3"`` (e4m3fn), ``"fp8_e5m2"``.
    k_scale, v_scale : torch.Tensor, optional
        One-element fp32 quantisation scales, required with fp8 (not read with "auto").
    """
    fmt = _fp8_format(kv_cache_dtype)
    check_tensor("key", key, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    rows, heads, head_dim = key.shape
    check_tensor("value", value, dtypes=(key.dtype,), shape=(rows, heads, head_dim), last_dim_contiguous=True)
    key_cache = _cache_view("key_cache", key_cache, fmt, key.dtype)
    check_tensor("key_cache", key_cache, ndim=5, last_dim_contiguous=True)
    num_blocks, _, _, block_size, x = key_cache.shape
    if x < 1 or head_dim % x or key_cache.shape[1:3] != (heads, head_dim // x):
        raise ValueError(f"key_cache must have shape [num_blocks, H_kv, D // x, block_size, x] with x dividing D = "
                         f"{head_dim} and H_kv = {heads}, got {list(key_cache.shape)}")
    value_cache = _cache_view("value_cache", value_cache, fmt, key.dtype)
    check_tensor("value_cache", value_cache, shape=(num_blocks, heads, head_dim, block_size))
    num_tokens, k_scale, v_scale, device = _kv_store_checks(key, value, key_cache, value_cache, slot_mapping, fmt,
                                                            k_scale, v_scale)
    if num_tokens == 0 or heads == 0 or head_dim == 0 or num_blocks * block_size == 0:
        return
    intel = _device.intel_gpu()
    (key, value), quant, fp8_max = _store_mode(fmt, (key, value), (k_scale, v_scale), num_tokens)
    block_t, block_d = _token_tile(head_dim, _TILE_ELEMENTS // 2)
    with device_guard(device):  # the scales are not read unless QUANT (slot_mapping stands in)
        _reshape_and_cache_kernel[(cdiv(num_tokens, block_t), heads)](
            key, value, key_cache, value_cache, slot_mapping,
            k_scale if quant else slot_mapping, v_scale if quant else slot_mapping,
            num_tokens, num_blocks * block_size, block_size,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), key_cache.stride(3),
            value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), value_cache.stride(3),
            head_dim, X=x, BLOCK_T=block_t, BLOCK_D=block_d, QUANT=quant, FP8_MAX=fp8_max, INTEL_GPU=intel,
            num_warps=4,
        )
