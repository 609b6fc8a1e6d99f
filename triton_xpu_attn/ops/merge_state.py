"""Merging attention states: the split-KV combine (shared by paged attention and MLA decode),
``merge_state_v2`` (natural-log LSEs) and ``merge_state`` (base-2 LSEs, sgl-kernel's v1) for
cascade attention. One merge rule, written once in ``_lse_weights``."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import device as _device
from .._common import (FLOAT_DTYPES, FP8_DTYPES, cdiv, check_int, check_same_device, check_tensor, device_guard,
                       fp8_cast, gdc_wait, interpreter_float32, kernel_quantises, next_power_of_2,
                       register_xpu_compile)


@triton.jit
def _sanitize_lse(lse):
    """Non-finite LSEs mean an empty state: NaN and +inf (as sgl-kernel treats them) become -inf."""
    lse = tl.where(lse == lse, lse, float("-inf"))
    return tl.where(lse == float("inf"), float("-inf"), lse)


@triton.jit
def _lse_weights(lse, extra_logit, HAS_EXTRA: tl.constexpr):
    """Weights of states with natural-log LSEs ``lse`` (non-finite = empty) in their merge, plus an
    optional extra logit that joins the denominator only (an attention sink).

    Returns ``(weights, denominator, merged_lse)``: merged output = sum(w * v) / denominator.
    An all-empty merge gives weights 0, denominator 1 and LSE -inf, so outputs become 0, not NaN.
    """
    lse = _sanitize_lse(lse)
    m = tl.max(lse, axis=0)
    empty = m == float("-inf")
    if HAS_EXTRA:
        m = tl.maximum(m, extra_logit)
    m_safe = tl.where(empty, 0.0, m)
    w = tl.exp2((lse - m_safe) * 1.4426950408889634)
    total = tl.sum(w, axis=0)
    if HAS_EXTRA:
        total += tl.exp2((extra_logit - m_safe) * 1.4426950408889634)
    denom = tl.where(empty, 1.0, total)
    merged = tl.where(empty, float("-inf"), m_safe + tl.log2(denom) / 1.4426950408889634)
    return w, denom, merged


@triton.jit
def _combine_splits_kernel(
    partial_out_ptr,  # [N, H, S, Dv] fp32: each split's normalised output
    partial_lse_ptr,  # [N, H, S] fp32: each split's LSE (-inf for an empty split)
    stride_po_n,
    stride_po_h,
    stride_po_s,
    stride_pl_n,
    stride_pl_h,
    num_splits,
    out_ptr,
    stride_o_n,
    stride_o_h,
    lse_ptr,
    stride_lse_n,
    stride_lse_h,
    sinks_ptr,
    head_dim_v,
    MAX_SPLITS: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    WAIT_PRIOR_GRID: tl.constexpr = False,
):
    if WAIT_PRIOR_GRID:
        # launched before the attention kernel that writes the partials has finished
        # (programmatic dependent launch): nothing is read before that kernel's writes are visible
        gdc_wait()
    # one (row, head) and one BLOCK_DV slice of its output per program: a wide V (MLA's 512)
    # spreads over several programs instead of one program walking all of it
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    dv_block = tl.program_id(2)
    lse_row = partial_lse_ptr + n * stride_pl_n + h * stride_pl_h
    splits = tl.arange(0, MAX_SPLITS)
    lse = tl.load(lse_row + splits, mask=splits < num_splits, other=float("-inf"))
    sink = 0.0
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h).to(tl.float32)
    _, _, merged = _lse_weights(lse, sink, HAS_SINKS)
    m_safe = tl.where(merged == float("-inf"), 0.0, merged)
    d = dv_block * BLOCK_DV + tl.arange(0, BLOCK_DV)
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    base = partial_out_ptr + n * stride_po_n + h * stride_po_h
    # chunks of splits in a fixed order, each a reduction of a fixed shape: bitwise reproducible
    for s0 in range(0, num_splits, SPLIT_BLOCK):
        s = s0 + tl.arange(0, SPLIT_BLOCK)
        lse_s = tl.load(lse_row + s, mask=s < num_splits, other=float("-inf"))
        lse_s = _sanitize_lse(lse_s)
        # weight relative to the merged LSE: exp(lse_s - merged) = w_s / denominator
        w_s = tl.exp2((lse_s - m_safe) * 1.4426950408889634)
        live = w_s > 0
        part = tl.load(
            base + s[:, None] * stride_po_s + d[None, :],
            mask=live[:, None] & (d[None, :] < head_dim_v),
            other=0.0,
        )
        acc += tl.sum(part * w_s[:, None], axis=0)
    tl.store(out_ptr + n * stride_o_n + h * stride_o_h + d, acc.to(out_ptr.dtype.element_ty), mask=d < head_dim_v)
    if WRITE_LSE:
        if dv_block == 0:
            tl.store(lse_ptr + n * stride_lse_n + h * stride_lse_h, merged)


@triton.jit
def _merge_state_kernel(
    v_a_ptr,
    s_a_ptr,
    v_b_ptr,
    s_b_ptr,
    v_out_ptr,
    s_out_ptr,
    num_heads,
    head_dim,
    stride_va_n,
    stride_va_h,
    stride_vb_n,
    stride_vb_h,
    stride_vo_n,
    stride_vo_h,
    stride_sa_n,
    stride_sa_h,
    stride_sb_n,
    stride_sb_h,
    stride_so_n,
    stride_so_h,
    merge_rows,  # rows n >= merge_rows take state b as it is (COPY_TAIL)
    out_scale_ptr,  # [1] fp32: the output is stored divided by it (HAS_OUT_SCALE)
    BLOCK_D: tl.constexpr,
    BASE2: tl.constexpr = False,
    COPY_TAIL: tl.constexpr = False,
    WRITE_LSE: tl.constexpr = True,
    HAS_OUT_SCALE: tl.constexpr = False,
    OUT_MAX: tl.constexpr = 0.0,  # the output dtype's largest finite value (HAS_OUT_SCALE: fp8 saturates)
    INTEL_GPU: tl.constexpr = False,  # an e4m3 output encoded in integer arithmetic (fp8_cast; set on XPU)
):
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    two = tl.arange(0, 2)
    s_a = tl.load(s_a_ptr + n * stride_sa_n + h * stride_sa_h).to(tl.float32)
    s_b = tl.load(s_b_ptr + n * stride_sb_n + h * stride_sb_h).to(tl.float32)
    if BASE2:  # merge_state (v1): base-2 LSEs in and out, merged as natural logs
        s_a = s_a * 0.6931471805599453
        s_b = s_b * 0.6931471805599453
    w, denom, merged = _lse_weights(tl.where(two == 0, s_a, s_b), 0.0, False)
    if BASE2:
        merged = merged * 1.4426950408889634
    w_a = tl.sum(tl.where(two == 0, w, 0.0), axis=0) / denom
    w_b = tl.sum(tl.where(two == 1, w, 0.0), axis=0) / denom
    d = tl.arange(0, BLOCK_D)
    mask = d < head_dim
    v_b = tl.load(v_b_ptr + n * stride_vb_n + h * stride_vb_h + d, mask=mask, other=0.0).to(tl.float32)
    if COPY_TAIL:
        # vLLM's prefill_tokens_with_context: rows past it have no prefix state, b is the result
        tail = n >= merge_rows
        v_a = tl.load(v_a_ptr + n * stride_va_n + h * stride_va_h + d, mask=mask & (d * 0 + n < merge_rows),
                      other=0.0).to(tl.float32)
        w_a = tl.where(tail, 0.0, w_a)
        w_b = tl.where(tail, 1.0, w_b)
        merged = tl.where(tail, s_b, merged)
    else:
        v_a = tl.load(v_a_ptr + n * stride_va_n + h * stride_va_h + d, mask=mask, other=0.0).to(tl.float32)
    # a state of weight 0 (empty: LSE -inf) adds nothing whatever its value holds (0 * NaN is NaN)
    v = tl.where(w_a > 0, v_a * w_a, 0.0) + tl.where(w_b > 0, v_b * w_b, 0.0)
    if COPY_TAIL:
        v = tl.where(tail, v_b, v)  # as given, NaN included
    if HAS_OUT_SCALE:
        v = tl.minimum(tl.maximum(v / tl.load(out_scale_ptr), -OUT_MAX), OUT_MAX)
    tl.store(v_out_ptr + n * stride_vo_n + h * stride_vo_h + d, fp8_cast(v, v_out_ptr, INTEL_GPU), mask=mask)
    if WRITE_LSE:
        tl.store(s_out_ptr + n * stride_so_n + h * stride_so_h, merged)


register_xpu_compile(
    _combine_splits_kernel,
    "bf16,S64,Dv64-slice,sinks",
    dict(
        partial_out_ptr="*fp32", partial_lse_ptr="*fp32", stride_po_n="i64", stride_po_h="i64", stride_po_s="i32",
        stride_pl_n="i64", stride_pl_h="i32", num_splits="i32", out_ptr="*bf16", stride_o_n="i64", stride_o_h="i32",
        lse_ptr="*fp32", stride_lse_n="i32", stride_lse_h="i64", sinks_ptr="*fp32", head_dim_v="i32",
        MAX_SPLITS=64, SPLIT_BLOCK=64, BLOCK_DV=64, HAS_SINKS=True, WRITE_LSE=True,
        WAIT_PRIOR_GRID=False,  # a CUDA launch mode (device.programmatic_launch)
    ),
    num_warps=8,  # as XPU launches a 64 x 64 tile (combine_tiling)
)
_MERGE_STATE_ARGS = dict(
    v_a_ptr="*bf16", s_a_ptr="*fp32", v_b_ptr="*bf16", s_b_ptr="*fp32", v_out_ptr="*bf16", s_out_ptr="*fp32",
    num_heads="i32", head_dim="i32", stride_va_n="i64", stride_va_h="i32", stride_vb_n="i64", stride_vb_h="i32",
    stride_vo_n="i64", stride_vo_h="i32", stride_sa_n="i32", stride_sa_h="i32", stride_sb_n="i32", stride_sb_h="i32",
    stride_so_n="i32", stride_so_h="i32", merge_rows="i32", out_scale_ptr="*fp32", BLOCK_D=128,
    BASE2=False, COPY_TAIL=True, WRITE_LSE=True, HAS_OUT_SCALE=False, OUT_MAX=0.0, INTEL_GPU=True,
)
register_xpu_compile(_merge_state_kernel, "bf16,D128", _MERGE_STATE_ARGS, num_warps=4)
register_xpu_compile(_merge_state_kernel, "bf16->fp8e4m3,D128,output_scale",
                     dict(_MERGE_STATE_ARGS, v_out_ptr="*fp8e4nv", HAS_OUT_SCALE=True, OUT_MAX=448.0), num_warps=4)


def combine_splits(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    compute_units: int | None = None,
    after_partials_kernel: bool = False,
) -> None:
    """Merge split-KV partial results in a fixed order (internal; no argument checks).

    ``partial_out [N, H, S, Dv]`` fp32 and ``partial_lse [N, H, S]`` fp32 (each split's normalised
    output and natural-log LSE; an empty split must hold LSE ``-inf``). Writes ``out [N, H, Dv]``
    (any strides, last dim contiguous) and, when given, ``lse [N, H]`` (any strides, e.g. the
    transpose of an ``[H, N]`` tensor). ``sinks [H]`` join every row's denominator.
    ``compute_units``: the device's, when the caller already has it (else looked up).
    ``after_partials_kernel``: the caller launched the kernel writing the partials right before
    this call, on this stream; where the device allows (``device.programmatic_launch``) the
    combine is then launched while that kernel runs and waits in-kernel for its writes.
    """
    n, h, s, dv = partial_out.shape
    if n == 0 or h == 0:
        return
    if compute_units is None:
        compute_units = _device.compute_units(out.device)
    block_dv, split_block, num_warps = combine_tiling(n * h, s, dv, compute_units)
    early = after_partials_kernel and _device.programmatic_launch(out.device)
    with device_guard(out.device):
        _combine_splits_kernel[(n, h, cdiv(dv, block_dv))](
            partial_out, partial_lse,
            partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
            partial_lse.stride(0), partial_lse.stride(1),
            s,
            out, out.stride(0), out.stride(1),
            lse if lse is not None else partial_lse,
            lse.stride(0) if lse is not None else 0,
            lse.stride(1) if lse is not None else 0,
            sinks if sinks is not None else partial_lse,
            dv,
            MAX_SPLITS=next_power_of_2(s),
            SPLIT_BLOCK=split_block,
            BLOCK_DV=block_dv,
            HAS_SINKS=sinks is not None,
            WRITE_LSE=lse is not None,
            num_warps=num_warps,
            **(dict(WAIT_PRIOR_GRID=True, launch_pdl=True) if early else {}),
        )


def combine_tiling(rows: int, num_splits: int, head_dim_v: int, compute_units: int) -> tuple[int, int, int]:
    """(BLOCK_DV, SPLIT_BLOCK, num_warps) of the combine for ``rows`` (row, head) pairs.

    The combine is latency-bound: each program loads its [SPLIT_BLOCK, BLOCK_DV] tile of partials
    (at most 4096 floats, one warp: no cross-warp reduction) and sums it. V is cut into the
    narrowest slices (>= 64 channels) that keep the grid within 8 programs per compute unit, so a
    small batch spreads over the device instead of a few programs walking 512 channels (H200:
    B=1, H=16, 64 splits, Dv=512: 18.2 -> 7.2 us per graph replay; B=128, H=16, Dv=512 stays at
    whole rows). On XPU the tile is spread over a warp per 512 floats: one sub-group holding a
    64 x 64 tile spills 12.9 KB at 128 GRF (4.8 KB after the 256-GRF rebuild), 8 warps none
    (bench/results/xpu_codegen.md)."""
    full = next_power_of_2(head_dim_v)
    block_dv = min(64, full)
    while block_dv < full and rows * cdiv(head_dim_v, block_dv) > 8 * compute_units:
        block_dv *= 2
    split_block = min(next_power_of_2(num_splits), max(1, 4096 // block_dv))
    num_warps = max(1, split_block * block_dv // 512) if _device.backend() == "xpu" else 1
    return block_dv, split_block, num_warps


def merge_state_v2(
    v_a: torch.Tensor,
    s_a: torch.Tensor,
    v_b: torch.Tensor,
    s_b: torch.Tensor,
    v_merged: torch.Tensor | None = None,
    s_merged: torch.Tensor | None = None,
):
    """Merge two attention states computed over disjoint key sets (cascade attention), base e.

    ``v = (v_a * e^{s_a} + v_b * e^{s_b}) / (e^{s_a} + e^{s_b})``, ``s = log(e^{s_a} + e^{s_b})``,
    computed stably in fp32. A non-finite LSE marks an empty state; two empty states give
    ``v = 0, s = -inf`` (never NaN).

    Parameters
    ----------
    v_a, v_b : torch.Tensor
        ``[N, H, Dv]`` fp16/bf16/fp32 partial outputs (same shape and dtype; last dim contiguous).
    s_a, s_b : torch.Tensor
        ``[N, H]`` LSEs (natural log) of the two states, any float dtype (read as fp32), e.g.
        ``lse.T`` of ``flash_attn_with_kvcache``'s ``[H, N]`` LSE (no copy needed).
    v_merged : torch.Tensor, optional
        ``[N, H, Dv]`` destination in ``v_a``'s dtype.
    s_merged : torch.Tensor, optional
        ``[N, H]`` fp32 destination (any strides).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``(v_merged [N, H, Dv], s_merged [N, H] fp32)``.
    """
    return _merge_states(v_a, s_a, v_b, s_b, v_merged, s_merged, base2=False)


def merge_state(
    v_a: torch.Tensor,
    s_a: torch.Tensor,
    v_b: torch.Tensor,
    s_b: torch.Tensor,
    v_merged: torch.Tensor | None = None,
    s_merged: torch.Tensor | None = None,
):
    """Merge two attention states with base-2 LSEs: sgl-kernel's ``merge_state`` (v1, FlashInfer's
    cascade merge), same signature as :func:`merge_state_v2`.

    ``v = (v_a * 2^{s_a} + v_b * 2^{s_b}) / (2^{s_a} + 2^{s_b})``, ``s = log2(2^{s_a} + 2^{s_b})``,
    computed stably in fp32. A non-finite LSE marks an empty state (ignored whatever its value
    holds); two empty states give ``v = 0, s = -inf``.

    Parameters
    ----------
    v_a, v_b : torch.Tensor
        ``[N, H, Dv]`` fp16/bf16/fp32 partial outputs (same shape and dtype; last dim contiguous).
    s_a, s_b : torch.Tensor
        ``[N, H]`` base-2 LSEs of the two states, any float dtype (read as fp32). This package's
        ops return natural-log LSEs: pass them to :func:`merge_state_v2`, or multiply by
        ``log2(e)`` first.
    v_merged : torch.Tensor, optional
        ``[N, H, Dv]`` destination in ``v_a``'s dtype.
    s_merged : torch.Tensor, optional
        ``[N, H]`` fp32 destination (any strides).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        ``(v_merged [N, H, Dv], s_merged [N, H] fp32 base-2 LSE)``.
    """
    return _merge_states(v_a, s_a, v_b, s_b, v_merged, s_merged, base2=True)


def _merge_states(v_a, s_a, v_b, s_b, v_merged, s_merged, base2: bool):
    """The checks and the launch both merges share (``base2``: the LSEs' base)."""
    check_tensor("v_a", v_a, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    n, h, dv = v_a.shape
    check_tensor("v_b", v_b, dtypes=(v_a.dtype,), shape=(n, h, dv), last_dim_contiguous=True)
    for name, s in (("s_a", s_a), ("s_b", s_b)):
        check_tensor(name, s, dtypes=FLOAT_DTYPES, shape=(n, h))
    device = check_same_device(v_a=v_a, s_a=s_a, v_b=v_b, s_b=s_b, v_merged=v_merged, s_merged=s_merged)
    if v_merged is None:
        v_merged = torch.empty_like(v_a)
    else:
        check_tensor("v_merged", v_merged, dtypes=(v_a.dtype,), shape=(n, h, dv), last_dim_contiguous=True)
    if s_merged is None:
        s_merged = torch.empty((n, h), dtype=torch.float32, device=device)
    else:
        check_tensor("s_merged", s_merged, dtypes=(torch.float32,), shape=(n, h))
    if n == 0 or h == 0:
        return v_merged, s_merged
    _launch_merge(device, v_a, s_a, v_b, s_b, v_merged, s_merged, n, s_merged, BASE2=base2)
    return v_merged, s_merged


def _launch_merge(device, v_a, s_a, v_b, s_b, v_out, s_out, merge_rows, out_scale, **constexprs) -> None:
    """One ``_merge_state_kernel`` launch over ``[N, H, Dv]`` states whose LSEs are ``[N, H]`` views
    (any strides: a heads-first LSE passes its transpose); ``constexprs`` pick the kernel's modes."""
    n, h, dv = v_a.shape
    with device_guard(device):
        _merge_state_kernel[(n, h)](
            v_a, s_a, v_b, s_b, v_out, s_out, h, dv,
            v_a.stride(0), v_a.stride(1), v_b.stride(0), v_b.stride(1), v_out.stride(0), v_out.stride(1),
            s_a.stride(0), s_a.stride(1), s_b.stride(0), s_b.stride(1), s_out.stride(0), s_out.stride(1),
            merge_rows, out_scale,
            BLOCK_D=next_power_of_2(dv),
            num_warps=4,
            **constexprs,
        )


def merge_attn_states(
    output: torch.Tensor,
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
    output_lse: torch.Tensor | None = None,
    prefill_tokens_with_context: int | None = None,
    output_scale: torch.Tensor | None = None,
) -> None:
    """vLLM's ``merge_attn_states`` (vllm-xpu-kernels' ``torch.ops._C.merge_attn_states``): merge the
    attention over a cached prefix and over the new tokens (chunked prefill, cascade), natural-log
    LSEs with heads first, in place.

    For tokens ``t < prefill_tokens_with_context`` (all tokens when None):
    ``output = (p * e^{lp} + s * e^{ls}) / (e^{lp} + e^{ls})`` and ``output_lse = log(e^{lp} +
    e^{ls})``, computed in fp32; a non-finite LSE (+inf included, as vLLM reads it) marks an empty
    state, whose output is never read, and two empty states give 0 and LSE -inf (vLLM's torch
    reference gives NaN there). Later tokens take the suffix as it is (output and LSE copied).

    Parameters
    ----------
    output : torch.Tensor
        ``[T, H, D]`` destination: the inputs' dtype, or fp8 (e4m3 / e5m2) with ``output_scale``.
        Last dim contiguous.
    prefix_output, suffix_output : torch.Tensor
        ``[T, H, D]`` fp16 / bf16 / fp32 partial outputs (one dtype; last dim contiguous).
    prefix_lse, suffix_lse : torch.Tensor
        ``[H, T]`` float natural-log LSEs of the two states (read as fp32; any strides).
    output_lse : torch.Tensor, optional
        ``[H, T]`` fp32 destination of the merged LSE (any strides); None: not written.
    prefill_tokens_with_context : int, optional
        Tokens ``[0, this)`` are merged, the rest copied from the suffix; None: all merged. Must
        lie in ``[0, T]``.
    output_scale : torch.Tensor, optional
        One-element fp32 tensor: the output is stored as ``value / output_scale`` saturated to the
        output dtype's range (the fp8 output of vLLM's quantised attention).
    """
    check_tensor("prefix_output", prefix_output, dtypes=FLOAT_DTYPES, ndim=3, last_dim_contiguous=True)
    t, h, dv = prefix_output.shape
    check_tensor("suffix_output", suffix_output, dtypes=(prefix_output.dtype,), shape=(t, h, dv),
                 last_dim_contiguous=True)
    for name, lse in (("prefix_lse", prefix_lse), ("suffix_lse", suffix_lse)):
        check_tensor(name, lse, dtypes=FLOAT_DTYPES, shape=(h, t))
    if output_scale is None:
        check_tensor("output", output, dtypes=(prefix_output.dtype,), shape=(t, h, dv), last_dim_contiguous=True)
    else:
        check_tensor("output", output, dtypes=FP8_DTYPES + (prefix_output.dtype,), shape=(t, h, dv),
                     last_dim_contiguous=True)
        check_tensor("output_scale", output_scale, dtypes=(torch.float32,))
        if output_scale.numel() != 1:
            raise ValueError(f"output_scale must hold one value, got shape {list(output_scale.shape)}")
    if output_lse is not None:
        check_tensor("output_lse", output_lse, dtypes=(torch.float32,), shape=(h, t))
    merge_rows = t if prefill_tokens_with_context is None else check_int(
        prefill_tokens_with_context, "prefill_tokens_with_context", minimum=0)
    if merge_rows > t:
        raise ValueError(f"prefill_tokens_with_context must be at most the {t} tokens, got {merge_rows}")
    device = check_same_device(output=output, prefix_output=prefix_output, prefix_lse=prefix_lse,
                               suffix_output=suffix_output, suffix_lse=suffix_lse, output_lse=output_lse,
                               output_scale=output_scale)
    if t == 0 or h == 0:
        return
    lse_out = output_lse if output_lse is not None else prefix_lse  # a placeholder when not written
    dest = output
    # under the interpreter bf16 runs in fp32 (interpreter_float32), and an fp8 output the kernel
    # does not quantise itself (kernel_quantises) goes through an fp32 stand-in cast by torch
    prefix_output, suffix_output, output = interpreter_float32(prefix_output, suffix_output, output)
    if output.element_size() == 1 and not kernel_quantises(output.dtype):
        output = torch.empty(output.shape, dtype=torch.float32, device=device)
    # the LSEs are [H, T]: their transposes are the (token, head) views the kernel reads
    _launch_merge(device, prefix_output, prefix_lse.T, suffix_output, suffix_lse.T, output, lse_out.T, merge_rows,
                  output_scale if output_scale is not None else prefix_lse,
                  COPY_TAIL=merge_rows < t, WRITE_LSE=output_lse is not None, HAS_OUT_SCALE=output_scale is not None,
                  OUT_MAX=float(torch.finfo(dest.dtype).max), INTEL_GPU=_device.intel_gpu())
    if output is not dest:
        dest.copy_(output)
