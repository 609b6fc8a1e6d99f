"""MLA decode: ``flash_mla_decode`` and ``flash_mla_get_workspace_size`` (also as
``flash_mla_decode_get_workspace_size``, the name sglang 0.5.23 imports), drop-ins for
sgl-kernel-xpu's functions of the same names. The kernel and what this launcher shares with
``flash_mla_prefill`` live in ``mla.py`` (the MLA kernel family).

The split count is a function of host-known values only (batch, heads, page-table width times
page size, device compute units), so ``flash_mla_get_workspace_size`` can reproduce it and no
launch syncs with the host; each request then uses as many of those splits as its real length
fills (on the device).

Configs (``tune.lookup("mla_decode", ...)``; bucket fields ``rows`` = q_len x H rounded up to a
power of two in 16..128, ``r`` = R, ``w`` = ``tune.work_bucket`` of the programs at 16-row tiles,
``kv`` = "gather" for pages shorter than 16 tokens else "page", ``dtype``): ``BLOCK_H`` (rows per program, >= 16),
``BLOCK_N`` (keys per tile, >= 16), ``BLOCK_DV`` (output channels per program, 0 = all R),
``num_warps``, ``num_stages``, ``grf_mode`` (XPU), ``PREFETCH_PAGES`` (default 1: with pages shorter than
a tile, load the next tile's page ids one iteration ahead; H100, P=1, H=128: 163 -> 238 TFLOP/s). ``tune.override("mla_decode", config)`` forces one.
"""
from __future__ import annotations

import torch

from .. import device as _device
from .. import tune
from .._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    MAX_GRID_DIM_1,
    cdiv,
    check_bool,
    check_int,
    check_page_size,
    check_same_device,
    check_tensor,
    device_guard,
    interpreter_float32,
    next_power_of_2,
    validate_lengths_and_pages,
)
from .merge_state import combine_splits
from .mla import (
    LOG2E,
    _mla_attention_kernel,
    as_kv_scale,
    check_latent_cache,
    check_sm_scale,
    latent_chunk,
    latent_descriptors,
    latent_device_desc,
    launch_constexprs,
    split_queries,
    xpu_tiles,
)


# ------------------------------------------------------------------------------------------
# launcher
# ------------------------------------------------------------------------------------------

#: an automatic split never covers fewer keys than this, nor exceeds this many splits (H200
#: sweep with the sliced combine: one request wants one 64-key tile per split, up to 128
#: splits at H=16 (B=1, L=1k-16k: 1.15-1.22x over 128-key splits capped at 64); a batch fills
#: the device first and never reaches these bounds)
_MIN_SPLIT_TOKENS = 64
_MAX_AUTO_SPLITS = 128
#: automatic splits are computed on the length rounded up to this (the largest page size), so
#: the page-table width of decode and the max_seq_len of the workspace query give the same count
_LENGTH_QUANTUM = 256
_ALIGN = 256


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _auto_splits(batch: int, rows: int, max_len: int, compute_units: int) -> int:
    """KV splits that fill the device: ``compute_units x programs-per-unit`` slots over the
    ``batch x head-blocks`` programs, at most ``max_len / 64`` splits and 128. Non-decreasing in
    ``max_len``, so a workspace sized for a longer bound is always large enough."""
    length = cdiv(max(max_len, 1), _LENGTH_QUANTUM) * _LENGTH_QUANTUM
    head_blocks = cdiv(rows, 64)
    per_unit = 2 if rows <= 32 else 1  # small tiles: two programs share a compute unit
    slots = compute_units * per_unit
    fill = slots // max(batch * head_blocks, 1)
    return max(1, min(fill, cdiv(length, _MIN_SPLIT_TOKENS), _MAX_AUTO_SPLITS))


def _explicit_splits(num_kv_splits: int) -> int:
    """A requested split count (> 0): at most ``MAX_GRID_DIM_1``, the splits' grid axis (CUDA's
    65535); ``ValueError`` naming ``num_kv_splits`` past it (Triton's launch error otherwise)."""
    if num_kv_splits > MAX_GRID_DIM_1:
        raise ValueError(
            f"num_kv_splits must be at most {MAX_GRID_DIM_1} (the launch grid's split axis), got {num_kv_splits}"
        )
    return num_kv_splits


def _workspace_layout(rows_n: int, num_heads: int, splits: int, head_dim_v: int) -> tuple[int, int, int]:
    """(bytes of the partial outputs section, offset of the LSE section, total bytes)."""
    if splits <= 1:
        return 0, 0, 0
    po = _align(rows_n * num_heads * splits * head_dim_v * 4)
    pl = _align(rows_n * num_heads * splits * 4)
    return po, po, po + pl


def flash_mla_get_workspace_size(
    max_seq_len: int,
    num_batches: int,
    num_heads: int = 0,
    page_size: int = 0,
    num_kv_splits: int = -1,
    *,
    q_len: int = 1,
    head_dim_v: int = 512,
    device=None,
) -> int:
    """Bytes of workspace that :func:`flash_mla_decode` needs for the same arguments.

    Parameters
    ----------
    max_seq_len : int
        Upper bound of the KV length of any request (sglang passes ``max_context_len``). For the
        automatic split count, ``flash_mla_decode`` uses ``page_table.shape[1] * page_size`` as the
        bound; a table no wider than ``cdiv(max_seq_len, page_size)`` pages gives the same count
        when ``page_size`` is given (with 0, pages of more than 256 tokens may need more: the
        decode then raises naming both sizes).
    num_batches : int
        Number of requests ``B``.
    num_heads : int
        Query heads ``H`` (required when ``num_kv_splits != 1``).
    page_size : int
        Tokens per page (a power of two 1..256), or 0 if unknown (the split count does not depend
        on it).
    num_kv_splits : int
        1: no split (0 bytes); > 1: that many splits (at most 65535); <= 0: the automatic count
        of ``flash_mla_decode``.
    q_len : int
        New tokens per request (1 for plain decode; 2..4 for MTP / speculative decoding).
    head_dim_v : int
        Latent width ``R`` (the output width), 512 for DeepSeek.
    device : torch.device, optional
        Device whose compute units set the automatic split count (default: the current one).

    Returns
    -------
    int
        Bytes: fp32 partial outputs ``[B * q_len, H, splits, R]`` and fp32 partial LSEs
        ``[B * q_len, H, splits]``, each section 256-byte aligned; 0 when ``splits == 1``.
    """
    max_seq_len, num_batches, num_heads, page_size, num_kv_splits, q_len, head_dim_v = (
        check_int(v, name) for name, v in (("max_seq_len", max_seq_len), ("num_batches", num_batches),
                                           ("num_heads", num_heads), ("page_size", page_size),
                                           ("num_kv_splits", num_kv_splits), ("q_len", q_len),
                                           ("head_dim_v", head_dim_v)))
    if max_seq_len < 0 or num_batches < 0 or num_heads < 0:
        raise ValueError("max_seq_len, num_batches and num_heads must be non-negative")
    if page_size != 0:
        check_page_size(page_size)
    if q_len < 1:
        raise ValueError(f"q_len must be positive, got {q_len}")
    if head_dim_v < 1:
        raise ValueError(f"head_dim_v must be positive, got {head_dim_v}")
    if num_kv_splits == 1:
        return 0
    if num_heads == 0:
        raise ValueError("num_heads must be given (> 0) unless num_kv_splits == 1")
    if num_kv_splits <= 0:
        # the decode bounds the length by whole pages (table width x page_size): round up alike
        # (pages of 512-2048 tokens exceed the 256-token length quantum of the split count)
        bound = cdiv(max_seq_len, page_size) * page_size if page_size else max_seq_len
        splits = _auto_splits(num_batches, q_len * num_heads, bound, _device.compute_units(device))
    else:
        splits = _explicit_splits(num_kv_splits)
    return _workspace_layout(num_batches * q_len, num_heads, splits, head_dim_v)[2]


#: sglang 0.5.23's name for the same function (sgl-kernel-xpu renamed it when MLA prefill arrived)
flash_mla_decode_get_workspace_size = flash_mla_get_workspace_size


def _heuristic_config(rows: int, head_dim_v: int, dtype: torch.dtype, work: int, gather: bool) -> dict:
    backend = _device.backend()
    if backend == "interpreter":
        return dict(BLOCK_H=16, BLOCK_N=16, BLOCK_DV=0, num_warps=4, num_stages=1)
    if backend == "xpu":
        return xpu_tiles(rows, head_dim_v, gather=gather)
    big = dtype == torch.float32
    if big:
        block_h = 16 if rows <= 16 else (32 if rows <= 32 else 64)
        return dict(BLOCK_H=block_h, BLOCK_N=16, BLOCK_DV=0, num_warps=4 if block_h < 64 else 8, num_stages=1)
    # measured on H200 (bf16, R=512, tuner and sweeps): 64-row tiles with 64-key tiles for 64+
    # rows (B=64, H=128: ~250 TFLOP/s), 16-row tiles for H=16; 32-key tiles once the batch is large.
    # 64+ rows read whole-page tiles through tensor descriptors (kv_desc; H100, P = 64: 1.07-1.12x
    # at H = 64/128; 0.55-0.86x at H <= 32, whose 16/32-row tiles stay on pointer loads:
    # bench/results/NVIDIA_H100_80GB_HBM3/experiments/mla_desc.txt)
    if rows >= 64:
        return dict(BLOCK_H=64, BLOCK_N=64, BLOCK_DV=0, num_warps=8, num_stages=2, kv_desc=backend == "cuda")
    if rows <= 16:
        return dict(BLOCK_H=16, BLOCK_N=32 if work >= 16 else 64, BLOCK_DV=0, num_warps=4, num_stages=2)
    if gather:
        # 32-row tiles over per-token gathers (H = 32, or H = 16 with two queries, on page-1
        # tables): 32-key tiles, 3 stages, 1.53-1.97x the 64-key tile at every batch (H100 tuner,
        # rows=32 gather buckets, 2026-11-22); over pages the 64-key tile stays (within 0.96-1.05x)
        return dict(BLOCK_H=32, BLOCK_N=32, BLOCK_DV=0, num_warps=4, num_stages=3)
    return dict(BLOCK_H=32, BLOCK_N=64, BLOCK_DV=0, num_warps=4, num_stages=2)


def flash_mla_decode(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor | None,
    kv_c_and_k_pe_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    workspace: torch.Tensor | None,
    sm_scale: float,
    num_kv_splits: int = 1,
    *,
    return_lse: bool = False,
    kv_scale: float | torch.Tensor | None = None,
    head_dim_v: int | None = None,
    validate: bool = False,
):
    """Multi-head latent attention decode over a paged latent cache (sgl-kernel-xpu drop-in).

    For each request ``b``, query token ``t`` and head ``h``:
    ``out = softmax(sm_scale * [q_nope, q_pe] . K^T) V`` with ``K = cache rows`` (all ``R + Dr``
    channels) and ``V = K[:, :R]``, over the request's first ``seq_lens[b]`` tokens (with
    ``q_len > 1`` query token ``t`` sees keys ``j <= seq_lens[b] - q_len + t``).

    Parameters
    ----------
    q_nope : torch.Tensor
        ``[B, H, R]`` (decode) or ``[B, S, H, R]`` (``S = q_len`` new tokens per request, MTP /
        speculative decoding), fp16/bf16/fp32: the latent (absorbed) part of the queries. Any
        strides; a last dim that is not contiguous is copied. When ``q_pe`` is None, the
        combined ``[B, (S,) H, R + Dr]`` queries (see ``head_dim_v``).
    q_pe : torch.Tensor or None
        ``[B, H, Dr]`` / ``[B, S, H, Dr]`` rope part of the queries, q_nope's dtype.
    kv_c_and_k_pe_cache : torch.Tensor
        ``[num_pages, page_size, R + Dr]`` or ``[num_pages, page_size, 1, R + Dr]``: per token
        the latent ``c_kv`` (R channels, also V) followed by ``k_pe`` (Dr channels). q's dtype or
        fp8 (e4m3/e5m2, dequantised with ``kv_scale``). Any page and row strides (e.g. one layer
        of a multi-layer pool) with ``stride(-1) == 1``; ``page_size`` a power of two 1..256.
    seq_lens : torch.Tensor
        ``[B]`` int32 (or int64): KV length of each request, the new tokens included.
    page_table : torch.Tensor
        ``[B, max_pages]`` int32 (or int64), page-granular: physical page of each logical page.
        Any width; lengths beyond ``max_pages * page_size`` are clamped to it.
    workspace : torch.Tensor or None
        Contiguous (uint8) scratch of at least
        ``flash_mla_get_workspace_size(page_table.shape[1] * page_size, B, H, page_size,
        num_kv_splits, q_len=S, head_dim_v=R)`` bytes, 16-byte aligned; may be None (or empty)
        when that is 0 (``num_kv_splits == 1``).
    sm_scale : float
        Softmax scale applied to the full ``R + Dr`` dot (DeepSeek: ``192 ** -0.5``).
    num_kv_splits : int
        1: one pass, no workspace (sglang's call); > 1: that many KV splits (at most 65535, the
        launch grid's limit; more raise ``ValueError``) merged by a combine kernel; <= 0:
        automatic, from the device's compute units, ``B x H x S`` and
        ``page_table.shape[1] * page_size``.
    return_lse : bool
        Also return the natural-log LSE of the scaled logits.
    kv_scale : float or torch.Tensor, optional
        Per-tensor dequantisation scale of the cache (``real = stored * kv_scale``): a float or a
        one-element float tensor on the device (read by the kernel; no host sync).
    head_dim_v : int, optional
        ``R`` when ``q_pe`` is None (default 512 for width 576, 256 for width 288).
    validate : bool
        Check, with a host sync (not for graph capture), that every ``seq_lens`` fits the page
        table and every page id that will be read lies in ``[0, num_pages)``; raise ``ValueError``
        otherwise. Without it longer lengths are clamped to the table and page ids are trusted.

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, torch.Tensor]
        ``out [B, H, R]`` (``[B, S, H, R]``) in q's dtype; with ``return_lse`` also
        ``lse [B, H]`` (``[B, S, H]``) fp32. A query with no visible key gives 0 and LSE -inf.
    """
    check_tensor("q_nope", q_nope, dtypes=FLOAT_DTYPES, ndim=(3, 4))
    q_nope, q_pe = split_queries(q_nope, q_pe, head_dim_v)
    dtype = q_nope.dtype
    lead = tuple(q_nope.shape[:-1])
    R, DR = q_nope.shape[-1], q_pe.shape[-1]
    if q_nope.dim() == 3:
        batch, num_heads = lead
        q_len = 1
    else:
        batch, q_len, num_heads = lead
        if q_len < 1:
            raise ValueError(f"q_nope must hold at least one token per request, got shape {list(q_nope.shape)}")

    cache = kv_c_and_k_pe_cache
    page_size = check_latent_cache(cache, dtype, R, DR)
    check_tensor("seq_lens", seq_lens, dtypes=INDEX_DTYPES, shape=(batch,))
    check_tensor("page_table", page_table, dtypes=INDEX_DTYPES, ndim=2, last_dim_contiguous=True)
    if page_table.shape[0] != batch:
        raise ValueError(f"page_table must have {batch} rows (one per request), got shape {list(page_table.shape)}")
    sm_scale = check_sm_scale(sm_scale)
    num_kv_splits = check_int(num_kv_splits, "num_kv_splits")
    if workspace is not None:
        check_tensor("workspace", workspace, ndim=1)
    device = check_same_device(
        q_nope=q_nope, q_pe=q_pe, kv_c_and_k_pe_cache=cache, seq_lens=seq_lens, page_table=page_table, workspace=workspace
    )
    host_scale, scale_tensor = as_kv_scale(kv_scale, device)
    if check_bool(validate, "validate"):
        validate_lengths_and_pages("seq_lens", seq_lens, page_table, page_size, cache.shape[0])

    out = torch.empty((*lead, R), dtype=dtype, device=device)
    return_lse = check_bool(return_lse, "return_lse")
    lse = torch.empty(lead, dtype=torch.float32, device=device) if return_lse else None
    rows = q_len * num_heads
    max_pages = page_table.shape[1]
    compute_units = _device.compute_units(device)
    if num_kv_splits <= 0:
        splits = _auto_splits(batch, rows, max_pages * page_size, compute_units)
    else:
        splits = _explicit_splits(num_kv_splits)
    _, lse_offset, need = _workspace_layout(batch * q_len, num_heads, splits, R)
    if need > 0:
        have = 0 if workspace is None else workspace.numel() * workspace.element_size()
        if have < need:
            raise ValueError(
                f"workspace holds {have} bytes but flash_mla_decode needs {need} bytes for {splits} KV splits "
                f"(B={batch}, q_len={q_len}, H={num_heads}, R={R}): size it with flash_mla_get_workspace_size"
            )
        if not workspace.is_contiguous():
            raise ValueError("workspace must be contiguous")
        if workspace.data_ptr() % 16 != 0:
            raise ValueError("workspace must be 16-byte aligned")
    if batch == 0 or num_heads == 0:
        return (out, lse) if return_lse else out
    if cache.shape[0] == 0:  # no page to read (any length is then impossible): no key anywhere
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return (out, lse) if return_lse else out
    # the interpreter's bf16 arithmetic is wrong: bf16 runs in fp32 there (no copy when compiled)
    dest = out
    q_nope, q_pe, cache, out = interpreter_float32(q_nope, q_pe, cache, out)

    # work bucket: programs at the smallest (16-row) tile against the device's compute units
    work = tune.work_bucket(batch * cdiv(rows, 16), compute_units)
    # kv: "gather" when pages are shorter than a key tile (per-token addressing), else "page";
    # the two want different tiles (H200: P=64-tuned tiles ran 0.7x the heuristic at P=1)
    gather = page_size < 16
    fields = {"rows": tune.pow2_bucket(rows, 16, 128), "r": R, "w": work, "kv": "gather" if gather else "page",
              "dtype": str(dtype).replace("torch.", "")}
    config = tune.lookup("mla_decode", fields, _heuristic_config(rows, R, dtype, work, gather), device=device)
    block_r = max(16, next_power_of_2(R))
    block_dr = max(16, next_power_of_2(DR))
    block_h = max(16, int(config["BLOCK_H"]))
    block_n = max(16, int(config["BLOCK_N"]))
    block_dv = int(config.get("BLOCK_DV", 0) or block_r)
    block_dv = max(16, min(block_dv, block_r))
    num_dv = block_r // block_dv
    grid = (cdiv(rows, block_h) * num_dv, splits, batch)

    out_n = out.view(batch * q_len, num_heads, R)
    lse_n = lse.view(batch * q_len, num_heads) if lse is not None else None
    if splits > 1:
        ws = workspace.view(-1).view(torch.uint8)
        n = batch * q_len
        target = ws[: n * num_heads * splits * R * 4].view(torch.float32).view(n, num_heads, splits, R)
        target_lse = ws[lse_offset:lse_offset + n * num_heads * splits * 4].view(torch.float32).view(n, num_heads, splits)
        o_strides = target.stride()[:3]
        l_strides = target_lse.stride()
    else:
        target, target_lse = out_n, lse_n
        o_strides = (*out_n.stride()[:2], 0)
        l_strides = (*lse_n.stride(), 0) if lse_n is not None else (0, 0, 0)
    qn_s = q_nope.stride()
    qp_s = q_pe.stride()
    if q_len == 1 and q_nope.dim() == 3:
        qn_strides = (qn_s[0], 0, qn_s[1])
        qp_strides = (qp_s[0], 0, qp_s[1])
    else:
        qn_strides, qp_strides = qn_s[:3], qp_s[:3]
    latent_descs = latent_descriptors(cache, R, config, block_n, block_dv, device)
    # 2D latent tiles through device-side descriptors (XPU with Intel's Triton >= 3.4) or block pointers
    latent_desc = bool(config.get("latent_chunk")) and latent_device_desc(
        cache, R, q_nope if q_len == 1 else None, (qn_strides[0], qn_strides[2]))
    chunk = latent_chunk(config, page_size, block_n, block_r, latent_descs, latent_desc)
    with device_guard(device):
        # requests run on grid axis 2 (at most MAX_GRID_DIM_1): a larger batch launches in chunks
        # of requests, each over its slice of the per-request tensors (one launch, no slicing, else)
        chunked = batch > MAX_GRID_DIM_1
        for b0 in range(0, batch, MAX_GRID_DIM_1):
            b1 = min(batch, b0 + MAX_GRID_DIM_1)
            r0, r1 = b0 * q_len, b1 * q_len  # rows of out / the partials
            part = (lambda t, lo, hi: t[lo:hi]) if chunked else (lambda t, lo, hi: t)  # noqa: E731
            _mla_attention_kernel[grid[:2] + (b1 - b0,)](
                part(q_nope, b0, b1), part(q_pe, b0, b1), *qn_strides, *qp_strides,
                cache, cache.stride(0), cache.stride(1),
                *latent_descs,
                part(seq_lens, b0, b1), part(page_table, b0, b1), page_table.stride(0), max_pages, cache.shape[0],
                scale_tensor if scale_tensor is not None else seq_lens,
                part(target, r0, r1), *o_strides,
                part(target_lse, r0, r1) if target_lse is not None else out, *l_strides,
                float(sm_scale) * host_scale * LOG2E, host_scale,
                num_heads, splits,
                seq_lens, 0, 0,  # cu_seqlens_q, batch, total_q: ragged mode only
                Q_LEN=q_len, R=R, DR=DR, PAGE_SIZE=page_size,
                BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_R=block_r, BLOCK_DR=block_dr, BLOCK_DV=block_dv,
                HAS_KV_SCALE=scale_tensor is not None,
                PREFETCH_PAGES=bool(config.get("PREFETCH_PAGES", 1)),
                SPLIT=splits > 1,
                WRITE_LSE=splits > 1 or lse is not None,
                DOT_PRECISION="ieee" if q_nope.dtype == torch.float32 else "tf32",
                RAGGED=False, CAUSAL=True,
                KV_DESC=latent_descs[0] is not None,
                LAUNCH_DEPENDENTS=_device.programmatic_launch(device),
                **launch_constexprs(config, chunk, latent_desc, device,
                                   max(block_n, block_dv or block_r) if q_nope.dtype == torch.float32 else 0),
            )
        if splits > 1:
            combine_splits(target, target_lse, out_n, lse_n, compute_units=compute_units, after_partials_kernel=True)
    if out is not dest:
        dest.copy_(out)
    return (dest, lse) if return_lse else dest
