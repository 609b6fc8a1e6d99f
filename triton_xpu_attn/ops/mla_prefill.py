"""MLA prefill (DeepSeek-style latent attention over ragged queries): ``flash_mla_prefill`` and
``flash_mla_prefill_get_workspace_size``, drop-ins for sgl-kernel-xpu's functions of the same names.

The kernel is the MLA kernel family's (``mla._mla_attention_kernel``) in its ragged mode
(``RAGGED=True``): the masking, the online softmax and the "V = the first R channels of the K tile"
reuse are that kernel's, only the mapping of programs to query rows and the key range differ.

* Rows of the ``tl.dot`` M dimension are ``(token, head)`` pairs of one request, head fastest, as
  in decode: a program owns ``BLOCK_H`` consecutive rows, i.e. a few tokens x all heads (H = 16,
  ``BLOCK_H`` 64: 4 tokens) or one token x a block of heads (H = 128: 1 token x 64 heads). The
  latent cache has one KV head, so every row of a tile reads the same keys and the tile reuses
  each KV tile ``BLOCK_H`` times whichever way the rows split into tokens and heads; keeping the
  tokens per tile few keeps the causal bound tight (the rows of a tile see at most ``tokens - 1``
  keys more than its first row, so little of the diagonal is computed and thrown away). The
  ``BLOCK_H x R`` fp32 accumulator bounds ``BLOCK_H`` (64 on NVIDIA, where decode found 64-row
  tiles fastest at 128 heads; 32 with the ``BLOCK_DV`` channel split on Intel GPUs, whose
  register file would spill the 512-wide accumulator).
* Grid axis 0 enumerates the row tiles of all requests in one sequence (request ``b``'s tiles are
  numbered from ``cu_seqlens_q[b] * H // BLOCK_H + b``; a program finds its request by binary
  search over ``cu_seqlens_q``), so a ragged batch launches
  ``cdiv(total_q * H, BLOCK_H) + B + 1`` programs whatever its longest request, the grid needs no
  host-side length (``max_seqlen_q`` is not read), and rows past ``cu_seqlens_q[B]`` (padding of
  a captured graph) are written as an empty request (0, LSE -inf). Tiles run from the end of the
  sequence, so the tiles with the most keys (the last rows of each request) start first.
* Each tile loops only over the keys its last row can see (causal tile bound, bottom-right:
  query ``t`` of a request with ``q_len`` queries and ``kv_len`` keys sees keys
  ``j <= kv_len - q_len + t``, so a cached prefix is fully visible); key tiles that every row of
  the tile sees whole skip the per-element mask.
* No KV splits: a prefill has ``cdiv(q_len * H, BLOCK_H)`` tiles per request, enough to fill the
  device except for short chunks over long prefixes, which sglang sends through decode-sized
  calls anyway. The workspace is therefore always 0 bytes.

Configs: ``tune.lookup("mla_prefill", ...)``, bucket fields ``h`` = H rounded up to a power of two
in 16..128, ``r`` = R, ``w`` = ``tune.work_bucket`` of the 64-row tiles, ``kv`` = "gather" for
pages shorter than 16 tokens else "page", ``dtype``; knobs ``BLOCK_H``, ``BLOCK_N``, ``BLOCK_DV``,
``PREFETCH_PAGES``, ``num_warps``, ``num_stages``, ``grf_mode`` as for ``mla_decode``.
"""
from __future__ import annotations

import torch

from .. import device as _device
from .. import tune
from .._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
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
    validate_query_offsets,
)
from .mla import (
    LOG2E,
    _mla_attention_kernel,
    as_kv_scale,
    latent_chunk,
    latent_descriptors,
    latent_device_desc,
    launch_constexprs,
    check_latent_cache,
    check_sm_scale,
    split_queries,
)
from .mla import xpu_tiles as mla_xpu_tiles


def flash_mla_prefill_get_workspace_size(
    max_seq_len: int,
    num_batches: int,
    num_heads: int = 0,
    page_size: int = 0,
    num_kv_splits: int = -1,
) -> int:
    """Bytes of workspace that :func:`flash_mla_prefill` needs: always 0 (it does not split the
    keys; query tiles fill the device). sgl-kernel-xpu's signature; the arguments are checked as
    :func:`flash_mla_get_workspace_size` checks them.

    Parameters
    ----------
    max_seq_len : int
        Upper bound of the KV length of any request (>= 0).
    num_batches : int
        Number of requests (>= 0).
    num_heads : int
        Query heads (>= 0; not needed).
    page_size : int
        Tokens per page (a power of two 1..256), or 0 if unknown.
    num_kv_splits : int
        -1, 0 or 1 (no split); larger counts are not supported.

    Returns
    -------
    int
        0.
    """
    max_seq_len, num_batches, num_heads, page_size, num_kv_splits = (
        check_int(v, name) for name, v in (("max_seq_len", max_seq_len), ("num_batches", num_batches),
                                           ("num_heads", num_heads), ("page_size", page_size),
                                           ("num_kv_splits", num_kv_splits)))
    if max_seq_len < 0 or num_batches < 0 or num_heads < 0:
        raise ValueError("max_seq_len, num_batches and num_heads must be non-negative")
    if page_size != 0:
        check_page_size(page_size)
    _check_splits(num_kv_splits)
    return 0


def _check_splits(num_kv_splits) -> int:
    num_kv_splits = check_int(num_kv_splits, "num_kv_splits")
    if num_kv_splits > 1:
        raise ValueError(
            f"num_kv_splits={num_kv_splits}: flash_mla_prefill does not split the keys (its query tiles fill the "
            "device); pass -1, 0 or 1"
        )
    return num_kv_splits


def _heuristic_config(head_dim_v: int, dtype: torch.dtype) -> dict:
    backend = _device.backend()
    block_r = max(16, next_power_of_2(head_dim_v))
    if backend == "interpreter":
        return dict(BLOCK_H=16, BLOCK_N=16, BLOCK_DV=0, num_warps=4, num_stages=1)
    if backend == "xpu":
        return mla_xpu_tiles(32, head_dim_v, ragged=True)  # no spill in the native code (mla.xpu_tiles)
    if dtype == torch.float32:
        return dict(BLOCK_H=32, BLOCK_N=16, BLOCK_DV=0, num_warps=4, num_stages=1)
    # decode's tile at 64+ rows (H200/H100, R=512: 64 rows x 64 keys, 8 warps); whole-page key
    # tiles through tensor descriptors (H100, P = 64, H = 16 and 128: 223-235 -> 292-307 TFLOP/s)
    return dict(BLOCK_H=64, BLOCK_N=64, BLOCK_DV=0, num_warps=8, num_stages=2, kv_desc=_device.backend() == "cuda")


def _validate_queries(cu_seqlens_q: torch.Tensor, total_q: int, max_seqlen_q: int | None) -> None:
    cu = cu_seqlens_q.long().cpu()
    if cu.numel() > 1 and bool((cu[1:] < cu[:-1]).any()):
        raise ValueError("cu_seqlens_q must be non-decreasing")
    if int(cu[-1]) > total_q:
        raise ValueError(f"cu_seqlens_q[-1] = {int(cu[-1])} exceeds q_nope.shape[0] = {total_q}")
    validate_query_offsets(cu, max_seqlen_q)


def flash_mla_prefill(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor | None,
    kv_c_and_k_pe_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens_k: torch.Tensor,
    max_seqlen_q: int | None,
    page_table: torch.Tensor,
    workspace: torch.Tensor | None,
    sm_scale: float,
    causal: bool = True,
    num_kv_splits: int = -1,
    *,
    return_lse: bool = False,
    kv_scale: float | torch.Tensor | None = None,
    head_dim_v: int | None = None,
    validate: bool = False,
):
    """Multi-head latent attention of ragged queries over a paged latent cache (sgl-kernel-xpu
    drop-in): prefill and chunked prefill with a cached prefix.

    For request ``b`` with queries ``cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1`` (``q_len`` of them)
    and ``kv_len = seq_lens_k[b]`` keys (its cached prefix and its new tokens, already written to
    the cache), each query row ``t`` and head ``h``:
    ``out = softmax(sm_scale * [q_nope, q_pe] . K^T) V`` with ``K`` = the cache rows (all ``R + Dr``
    channels) and ``V = K[:, :R]``; with ``causal`` query ``t`` sees keys
    ``j <= kv_len - q_len + t`` (bottom-right aligned: the prefix is fully visible), else all
    ``kv_len`` keys.

    Parameters
    ----------
    q_nope : torch.Tensor
        ``[total_q, H, R]`` fp16/bf16/fp32, the latent (absorbed) part of the queries, ragged by
        ``cu_seqlens_q``. Any token and head strides; a last dim that is not contiguous is copied.
        When ``q_pe`` is None, the combined ``[total_q, H, R + Dr]`` queries (see ``head_dim_v``).
    q_pe : torch.Tensor or None
        ``[total_q, H, Dr]`` rope part of the queries, q_nope's dtype.
    kv_c_and_k_pe_cache : torch.Tensor
        ``[num_pages, page_size, R + Dr]`` (sgl-kernel-xpu's layout) or
        ``[num_pages, page_size, 1, R + Dr]``: per token the latent ``c_kv`` (R channels, also V)
        followed by ``k_pe`` (Dr channels). q's dtype or fp8 (e4m3/e5m2, dequantised with
        ``kv_scale``); any page and row strides with ``stride(-1) == 1``; ``page_size`` a power of
        two 1..256.
    cu_seqlens_q : torch.Tensor
        ``[B + 1]`` int32 (or int64): query offsets, ``cu_seqlens_q[0] == 0``, non-decreasing,
        ``cu_seqlens_q[B] <= total_q``. Rows from ``cu_seqlens_q[B]`` on are padding: 0 and LSE -inf.
    seq_lens_k : torch.Tensor
        ``[B]`` int32 (or int64): KV length of each request, its new tokens included.
    max_seqlen_q : int or None
        Longest query length (sgl-kernel-xpu's argument). Not needed: the grid is sized from
        ``total_q`` and ``B``; it is only type-checked (a non-negative int, or None).
    page_table : torch.Tensor
        ``[B, max_pages]`` int32 (or int64), page-granular. Lengths beyond
        ``max_pages * page_size`` are clamped to it.
    workspace : torch.Tensor or None
        Unused (``flash_mla_prefill_get_workspace_size`` gives 0 bytes); any tensor or None.
    sm_scale : float
        Softmax scale applied to the full ``R + Dr`` dot (DeepSeek: ``192 ** -0.5``).
    causal : bool
        Bottom-right causal mask (sglang's call); False: every query sees all ``kv_len`` keys.
    num_kv_splits : int
        -1 (sgl-kernel-xpu's default), 0 or 1: no KV split (the only mode); larger counts raise.
    return_lse : bool
        Also return the natural-log LSE of the scaled logits (our extension).
    kv_scale : float or torch.Tensor, optional
        Per-tensor dequantisation scale of the cache (``real = stored * kv_scale``): a float or a
        one-element float tensor on the device.
    head_dim_v : int, optional
        ``R`` when ``q_pe`` is None (default 512 for width 576, 256 for width 288).
    validate : bool
        Check, with a host sync, ``cu_seqlens_q`` (starts at 0, non-decreasing, within
        ``total_q``), that every ``seq_lens_k`` fits the page table and that every page id read
        lies in ``[0, num_pages)``; raise ``ValueError`` otherwise.

    Returns
    -------
    torch.Tensor or tuple[torch.Tensor, torch.Tensor]
        ``out [total_q, H, R]`` in q's dtype; with ``return_lse`` also ``lse [total_q, H]`` fp32
        (the layout of :func:`flash_mla_decode`'s LSE). A query with no visible key gives 0 and
        LSE -inf.
    """
    check_tensor("q_nope", q_nope, dtypes=FLOAT_DTYPES, ndim=3)
    q_nope, q_pe = split_queries(q_nope, q_pe, head_dim_v)
    dtype = q_nope.dtype
    total_q, num_heads, R = q_nope.shape
    DR = q_pe.shape[-1]
    cache = kv_c_and_k_pe_cache
    page_size = check_latent_cache(cache, dtype, R, DR)
    check_tensor("cu_seqlens_q", cu_seqlens_q, dtypes=INDEX_DTYPES, ndim=1)
    if cu_seqlens_q.shape[0] < 1:
        raise ValueError("cu_seqlens_q must hold B + 1 >= 1 offsets, got an empty tensor")
    batch = cu_seqlens_q.shape[0] - 1
    check_tensor("seq_lens_k", seq_lens_k, dtypes=INDEX_DTYPES, shape=(batch,))
    max_seqlen_q = check_int(max_seqlen_q, "max_seqlen_q", minimum=0, allow_none=True)
    check_tensor("page_table", page_table, dtypes=INDEX_DTYPES, ndim=2, last_dim_contiguous=True)
    if page_table.shape[0] != batch:
        raise ValueError(f"page_table must have {batch} rows (one per request), got shape {list(page_table.shape)}")
    if workspace is not None:
        check_tensor("workspace", workspace)
    sm_scale = check_sm_scale(sm_scale)
    causal = check_bool(causal, "causal")
    _check_splits(num_kv_splits)
    device = check_same_device(
        q_nope=q_nope, q_pe=q_pe, kv_c_and_k_pe_cache=cache, cu_seqlens_q=cu_seqlens_q, seq_lens_k=seq_lens_k,
        page_table=page_table, workspace=workspace,
    )
    host_scale, scale_tensor = as_kv_scale(kv_scale, device)
    if check_bool(validate, "validate"):
        _validate_queries(cu_seqlens_q, total_q, max_seqlen_q)
        validate_lengths_and_pages("seq_lens_k", seq_lens_k, page_table, page_size, cache.shape[0])

    out = torch.empty((total_q, num_heads, R), dtype=dtype, device=device)
    return_lse = check_bool(return_lse, "return_lse")
    lse = torch.empty((total_q, num_heads), dtype=torch.float32, device=device) if return_lse else None
    if total_q == 0 or num_heads == 0:
        return (out, lse) if return_lse else out
    if cache.shape[0] == 0:  # no page to read (any length is then impossible): no key anywhere
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return (out, lse) if return_lse else out

    # the interpreter's bf16 arithmetic is wrong: bf16 runs in fp32 there (no copy when compiled)
    dest = out
    q_nope, q_pe, cache, out = interpreter_float32(q_nope, q_pe, cache, out)
    compute_units = _device.compute_units(device)
    fields = {"h": tune.pow2_bucket(num_heads, 16, 128), "r": R,
              "w": tune.work_bucket(cdiv(total_q * num_heads, 64), compute_units),
              "kv": "gather" if page_size < 16 else "page", "dtype": str(dtype).replace("torch.", "")}
    config = tune.lookup("mla_prefill", fields, _heuristic_config(R, dtype), device=device)
    block_r = max(16, next_power_of_2(R))
    block_dr = max(16, next_power_of_2(DR))
    block_h = max(16, int(config["BLOCK_H"]))
    block_n = max(16, int(config["BLOCK_N"]))
    block_dv = int(config.get("BLOCK_DV", 0) or block_r)
    block_dv = max(16, min(block_dv, block_r))
    num_dv = block_r // block_dv
    # every request's row tiles plus one spare number per request, and the padding "request"
    num_tiles = cdiv(total_q * num_heads, block_h) + batch + 1
    grid = (num_tiles * num_dv, 1, 1)

    qn_s, qp_s = q_nope.stride(), q_pe.stride()
    latent_descs = latent_descriptors(cache, R, config, block_n, block_dv, device)
    # 2D latent tiles through device-side descriptors (XPU with Intel's Triton >= 3.4) or block
    # pointers; ragged q rows are (token, head) pairs, read through pointers
    latent_desc = bool(config.get("latent_chunk")) and latent_device_desc(cache, R)
    chunk = latent_chunk(config, page_size, block_n, block_r, latent_descs, latent_desc)
    with device_guard(device):
        _mla_attention_kernel[grid](
            q_nope, q_pe, 0, qn_s[0], qn_s[1], 0, qp_s[0], qp_s[1],
            cache, cache.stride(0), cache.stride(1),
            *latent_descs,
            seq_lens_k, page_table, page_table.stride(0), page_table.shape[1], cache.shape[0],
            scale_tensor if scale_tensor is not None else seq_lens_k,
            out, out.stride(0), out.stride(1), 0,
            lse if lse is not None else out, *((lse.stride(0), lse.stride(1)) if lse is not None else (0, 0)), 0,
            sm_scale * host_scale * LOG2E, host_scale,
            num_heads, 1,
            cu_seqlens_q, batch, total_q,
            Q_LEN=1, R=R, DR=DR, PAGE_SIZE=page_size,
            BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_R=block_r, BLOCK_DR=block_dr, BLOCK_DV=block_dv,
            HAS_KV_SCALE=scale_tensor is not None,
            PREFETCH_PAGES=bool(config.get("PREFETCH_PAGES", 1)),
            SPLIT=False,
            WRITE_LSE=lse is not None,
            DOT_PRECISION="ieee" if q_nope.dtype == torch.float32 else "tf32",
            RAGGED=True, CAUSAL=causal,
            KV_DESC=latent_descs[0] is not None,
            **launch_constexprs(config, chunk, latent_desc, device,
                                   max(block_n, block_dv or block_r) if q_nope.dtype == torch.float32 else 0),
        )
    if out is not dest:
        dest.copy_(out)
    return (dest, lse) if return_lse else dest
