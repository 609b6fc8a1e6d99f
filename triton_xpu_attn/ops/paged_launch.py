"""The paged attention launch: ``_launch`` (tiles, splits, the kernel and the combine of its
splits) and the argument checks the public ops of ``paged_attention.py``, ``varlen_attention.py``
and ``append_kv.py`` share before it (``_check_heads``, ``_as_scale``, ``_as_alibi_slopes``,
``_validate``).

The split count is chosen on the host from shapes only and refined per request on the device
(``whole_wave_splits`` over the compiled split kernel's occupancy), so a launch never syncs with
the host and the whole call can be captured in a CUDA/XPU graph.
"""
from __future__ import annotations

import torch

from .. import device as _device
from .. import tune
from .._common import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    MAX_GRID_DIM_1,
    cdiv,
    check_bool,
    check_int,
    check_real,
    check_tensor,
    check_window,
    device_guard,
    interpreter_float32,
    next_power_of_2,
    validate_lengths_and_pages,
    validate_query_offsets,
    whole_wave_splits,
)
from .merge_state import combine_splits
from .paged_config import _heuristic_config, _kv_descriptors, _kv_load, query_heads_per_block, query_rows_descriptors, score_chunk
from .paged_kernel import _SEARCH, _UNIFORM, MAX_HEAD_DIM, MAX_HEAD_DIM_QK, _paged_attention_kernel

#: (device, dtypes, constexprs) -> programs of the split kernel the device runs at once (or None)
_RESIDENT_PROGRAMS: dict = {}

def _validate(cache_seqlens, page_table, page_size, num_pages, cu_seqlens_q, uniform_q_len, total_q,
              max_q=None) -> None:
    """validate=True: the checks that need the lengths and page ids on the host."""
    validate_lengths_and_pages("cache_seqlens", cache_seqlens, page_table, page_size, num_pages)
    lens = cache_seqlens.long().cpu()
    if cu_seqlens_q is not None:
        cu = cu_seqlens_q.long().cpu()
        q_lens = cu[1:] - cu[:-1]
        if int(cu[0]) < 0 or (q_lens < 0).any() or int(cu[-1]) > total_q:
            raise ValueError(f"cu_seqlens_q must be non-decreasing from >= 0 up to at most total_q = {total_q}")
        validate_query_offsets(cu, max_q)
    else:
        q_lens = torch.full_like(lens, uniform_q_len)
    if (q_lens > lens).any():
        b = int((q_lens > lens).nonzero()[0])
        raise ValueError(f"request {b} has {int(q_lens[b])} queries but only {int(lens[b])} keys (cache_seqlens includes the new tokens)")


def _as_scale(name: str, scale, batch: int, num_kv_heads: int, device) -> torch.Tensor | None:
    """A descale as a float32 tensor addressed with (b, kv_head) strides (0 along a broadcast dim).

    Accepted, as vLLM and sgl-kernel pass them: a Python number or one-element tensor (every
    sequence and head); ``[B]`` (per sequence); ``[B, H_kv]``; and in two dims any size-1 dim or a
    dim of stride 0 (a single value expanded, e.g. ``k_scale.expand(num_seqs, H)`` with H not the
    KV head count: Intel's kernel reads its first element). Anything else is ambiguous and raises,
    naming the argument."""
    if scale is None:
        return None
    if not isinstance(scale, torch.Tensor):
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"{name} must be a float, a 1-element tensor or a [B, H_kv] tensor")
        return torch.full((1, 1), float(scale), dtype=torch.float32, device=device).expand(batch, num_kv_heads)
    check_tensor(name, scale, dtypes=FLOAT_DTYPES)
    if scale.device != device:
        raise ValueError(f"{name} is on {scale.device} but q is on {device}")
    if scale.numel() == 1:
        return scale.reshape(1, 1).to(torch.float32).expand(batch, num_kv_heads)
    if scale.ndim == 1 and scale.shape[0] == batch:
        scale = scale[:, None]
    if scale.ndim == 2:
        picked = scale
        for dim, size in ((0, batch), (1, num_kv_heads)):
            if scale.shape[dim] == size:
                continue
            if scale.shape[dim] == 1 or scale.stride(dim) == 0:  # one value along this dim
                picked = picked.narrow(dim, 0, 1)
            else:
                picked = None
                break
        if picked is not None:
            return picked.to(torch.float32).expand(batch, num_kv_heads)
    raise ValueError(f"{name} must be a scalar, [{batch}] (per sequence), or [{batch}, {num_kv_heads}] with any "
                     f"dim of size 1 or stride 0 (one value expanded), got {list(scale.shape)} with strides "
                     f"{list(scale.stride())}: ambiguous")


def _as_alibi_slopes(alibi_slopes, batch: int, num_q_heads: int) -> torch.Tensor | None:
    """ALiBi slopes as FlashAttention takes them: a float32 tensor ``[Hq]`` (every request) or
    ``[B, Hq]``; a last dim that is not contiguous is copied (the kernel reads it with stride 1,
    rows with ``stride(0)``: 0 for ``[Hq]`` or an expanded ``[B, Hq]``)."""
    if alibi_slopes is None:
        return None
    check_tensor("alibi_slopes", alibi_slopes, dtypes=(torch.float32,))
    if tuple(alibi_slopes.shape) not in ((num_q_heads,), (batch, num_q_heads)):
        raise ValueError(f"alibi_slopes must have shape [{num_q_heads}] (Hq) or [{batch}, {num_q_heads}] (B, Hq), "
                         f"got {list(alibi_slopes.shape)}")
    if alibi_slopes.shape[-1] > 1 and alibi_slopes.stride(-1) != 1:
        alibi_slopes = alibi_slopes.contiguous()
    return alibi_slopes


def _check_heads(q: torch.Tensor, k_name: str, num_kv_heads: int, head_dim: int, head_dim_v: int) -> None:
    """q's head dim equals K's, both head dims are supported (D up to MAX_HEAD_DIM_QK, Dv up to
    MAX_HEAD_DIM), and Hq is a multiple of H_kv."""
    if q.shape[-1] != head_dim:
        raise ValueError(f"q's head dim ({q.shape[-1]}) must equal {k_name}'s ({head_dim})")
    for name, dim, most in (("head dim D", head_dim, MAX_HEAD_DIM_QK), ("value head dim Dv", head_dim_v, MAX_HEAD_DIM)):
        if dim % 8 or not 8 <= dim <= most:
            raise ValueError(f"{name} must be a multiple of 8 from 8 to {most}, got {dim}")
    if q.shape[-2] % num_kv_heads != 0:
        raise ValueError(f"the query heads ({q.shape[-2]}) must be a multiple of the KV heads ({num_kv_heads})")


def _launch(q, k, v, *, device, batch, page_table, kv_lens, cu_seqlens_k, max_kv_len, mapping, cu_seqlens_q,
            uniform_q_len, max_q, softmax_scale, sinks, causal, window_size, softcap, k_descale, v_descale,
            num_splits, return_softmax_lse, out, seqused_q=None, alibi_slopes=None):
    """The attention both public functions run once their layout arguments are checked.

    ``q`` is ragged 3-D. ``k``/``v`` are a paged cache ``[pages, P, H_kv, D]`` read through
    ``page_table`` (``cu_seqlens_k`` None), or contiguous ``[total_k, H_kv, D]`` rows read from
    ``cu_seqlens_k[b]`` on (``page_table`` None): the kernel's contiguous-K/V mode. ``kv_lens``
    ``[B]`` int32 are the keys of each request (clamped in the kernel to the table / the slice);
    ``max_kv_len`` bounds them on the host (for the split count only). ``seqused_q`` ``[B]`` int32
    (ragged q only): the rows of each request's slice in use (``flash_attn_varlen_func``).
    ``alibi_slopes``: ``[Hq]`` or ``[B, Hq]`` float32, or None.
    """
    contiguous = page_table is None
    num_q_heads, head_dim = q.shape[1], k.shape[-1]
    num_kv_heads, head_dim_v = k.shape[-2], v.shape[-1]
    group_size = num_q_heads // num_kv_heads
    total_q = q.shape[0]
    page_size = 0 if contiguous else k.shape[1]  # 0: the kernel's contiguous-K/V mode

    # the argument contract (_common): every scalar checked once, here, for both public ops
    left, right = check_window(window_size)
    softcap = check_real(softcap, "softcap", minimum=0.0)
    causal = check_bool(causal, "causal")
    return_softmax_lse = check_bool(return_softmax_lse, "return_softmax_lse")
    softmax_scale = check_real(softmax_scale, "softmax_scale", allow_none=True)
    num_splits = check_int(num_splits, "num_splits", minimum=0)
    if sinks is not None:
        check_tensor("sinks", sinks, dtypes=FLOAT_DTYPES, shape=(num_q_heads,))
        sinks = sinks.contiguous()
    alibi = _as_alibi_slopes(alibi_slopes, batch, num_q_heads)
    k_scale = _as_scale("k_descale", k_descale, batch, num_kv_heads, device)
    v_scale = _as_scale("v_descale", v_descale, batch, num_kv_heads, device)
    if out is None:
        out = torch.empty((total_q, num_q_heads, head_dim_v), dtype=q.dtype, device=device)
    else:
        check_tensor("out", out, dtypes=(q.dtype,), shape=(total_q, num_q_heads, head_dim_v), last_dim_contiguous=True)
    lse = torch.empty((num_q_heads, total_q), dtype=torch.float32, device=device) if return_softmax_lse else None
    if total_q == 0 or batch == 0 or k.numel() == 0:  # no query, or no key anywhere: nothing to launch
        if lse is not None:
            lse.fill_(float("-inf"))
        out.zero_()
        return (out, lse) if return_softmax_lse else out
    scale = head_dim**-0.5 if softmax_scale is None else softmax_scale

    # ---- tiling: (token, head) rows of one KV head's query group ----
    decode_like = max_q is not None and max_q <= 16
    heads_per_block = query_heads_per_block(group_size, max_q)
    num_head_blocks = cdiv(group_size, heads_per_block)

    def query_tiling(block_m: int) -> tuple[int, int, int]:
        """(BLOCK_Q, query programs, tiles per request) for a tile of ``block_m`` rows."""
        if decode_like and next_power_of_2(max_q) * heads_per_block <= block_m:
            block_q = next_power_of_2(max_q)  # every query of a request in one tile: KV read once
        else:
            block_q = max(1, block_m // heads_per_block)
        block_q = max(block_q, 16 // heads_per_block)  # tl.dot needs M >= 16
        if mapping == _SEARCH:
            return block_q, cdiv(total_q, block_q) + batch, 0
        # no request has more rows of q than q has: an absurd max_seqlen_q (2^31 - 1) must not size
        # the grid (a request longer than q is impossible input: its rows past the tiles are NaN)
        tiles = cdiv(min(max_q, total_q), block_q) if max_q else 1
        return block_q, batch * tiles, tiles

    compute_units = _device.compute_units(device)
    _, programs_guess, _ = query_tiling(64)
    work = tune.work_bucket(programs_guess * num_kv_heads * num_head_blocks, compute_units)
    # bucket family: one query per request, a few (drafts: their own tiles), or query-tiled prefill
    # (contiguous K/V: "varlen" prefill buckets, page field 256 - its tiles read contiguous rows
    # like a page larger than any tile; files tuned before varlen had buckets give it their
    # largest page's prefill entry)
    q_kind = ("decode" if max_q == 1 else "draft") if decode_like else ("varlen" if contiguous else "prefill")
    fallback = {"draft": {"q": "decode"}, "varlen": {"q": "prefill"}}.get(q_kind)  # files tuned before those buckets
    config = tune.lookup(
        "paged_attention",
        dict(d=head_dim, dv=head_dim_v, g=next_power_of_2(group_size), p=256 if contiguous else page_size,
             q=q_kind, w=work, dtype=str(k.dtype).replace("torch.", "")),
        _heuristic_config(decode_like, head_dim, work, page_size, max_q, k.dtype in FP8_DTYPES, head_dim_v,
                          q.element_size()),
        device=device,
        fallback=fallback,
        # prefill tiles keep Q and 2-3 stages of K/V tiles in shared memory: one tuned at D = 128
        # can overflow at D = 256 (H100: the tuned 64 x 64 / 3-stage varlen tile needs 237 KB).
        # Decode keeps the nearest entry (that rule there: 0.87-1.51x, experiments/size_fields.txt)
        # (above D = 256 decode too: a D = 256 decode tile at D = 512 may not fit at all)
        no_larger=() if decode_like and max(head_dim, head_dim_v) <= 256 else ("d", "dv"),
    )
    heads_per_block = query_heads_per_block(group_size, max_q, config)  # the config may ask for 2D q / out
    num_head_blocks = cdiv(group_size, heads_per_block)
    block_q, num_q_programs, tiles_per_request = query_tiling(config["BLOCK_M"])

    # ---- KV splits: from shapes only (no host sync); refined per request on the device ----
    if left >= 0:
        max_kv_len = min(max_kv_len, left + block_q + config["BLOCK_N"])
    # output channels a program computes: the whole row, or BLOCK_DV-wide slices of it on as many
    # programs (a config's V split: the score dot repeats on each)
    full_dv = max(16, next_power_of_2(head_dim_v))
    block_dv = min(int(config.get("BLOCK_DV") or full_dv), full_dv)
    num_dv = cdiv(head_dim_v, block_dv)
    programs = num_q_programs * num_kv_heads * num_head_blocks * num_dv
    if num_splits == 0:
        splits = cdiv(config["waves"] * compute_units, programs)
        splits = min(splits, config["max_splits"], cdiv(max_kv_len, config["min_split_tokens"]))
    else:
        splits = min(num_splits, max(1, cdiv(max_kv_len, config["BLOCK_N"])), MAX_GRID_DIM_1)  # grid axis 2
    splits = max(1, splits)
    min_split_tokens = config["min_split_tokens"] if num_splits == 0 else config["BLOCK_N"]
    pad_rows = mapping != _UNIFORM  # rows past cu_seqlens_q[B] get defined values
    # the interpreter's bf16 arithmetic is wrong: bf16 runs in fp32 there (no copy when compiled)
    dest = out
    q, k, v, out = interpreter_float32(q, k, v, out)
    if contiguous:
        k_strides, v_strides = (0, k.stride(0), k.stride(1)), (0, v.stride(0), v.stride(1))
        table_args = (cu_seqlens_k, 0, 0, k.shape[0])  # no page table (a placeholder, never read); k's rows
    else:
        k_strides, v_strides = k.stride()[:3], v.stride()[:3]
        table_args = (page_table, page_table.stride(0), page_table.shape[1], k.shape[0])  # pool: the cache's pages
    # (host descriptors span whole rows: not with a V split)
    # D past MAX_HEAD_DIM: 512-channel tiles and a tail chunk of the score dot (the kernel's D_TAIL)
    d_tail = max(16, next_power_of_2(head_dim - MAX_HEAD_DIM)) if head_dim > MAX_HEAD_DIM else 0
    kv_descriptors = _kv_descriptors(k, v, page_size, config if num_dv == 1 else {**config, "kv_desc": False}, device)
    kv_load = _kv_load(page_size, config, kv_descriptors, (k, v))
    if kv_load == 3:
        _device.ensure_scratch_allocator(device)  # descriptors made on the device (CUDA: global scratch)
    kv_descriptors = kv_descriptors or (None, None)
    lse_arg = lse if lse is not None else out

    def launch_args(partial_out, partial_lse, po_strides, pl_strides, num_kv_splits):
        """The kernel's runtime arguments; partials may be dtypes (a compile without launch)."""
        return (
            q, q.stride(0), q.stride(1),
            k, *k_strides,
            v, *v_strides,
            *kv_descriptors,
            *table_args,
            kv_lens,
            cu_seqlens_q if cu_seqlens_q is not None else kv_lens,
            cu_seqlens_k if cu_seqlens_k is not None else kv_lens,
            seqused_q if seqused_q is not None else kv_lens,
            *((k_scale, *k_scale.stride()) if k_scale is not None else (q, 0, 0)),
            *((v_scale, *v_scale.stride()) if v_scale is not None else (q, 0, 0)),
            sinks if sinks is not None else q,
            *((alibi, alibi.stride(0) if alibi.dim() == 2 else 0) if alibi is not None else (None, None)),
            out, out.stride(0), out.stride(1),
            lse_arg, lse_arg.stride(0) if lse is not None else 0, lse_arg.stride(1) if lse is not None else 0,
            partial_out, *po_strides,
            partial_lse, *pl_strides,
            batch, total_q, num_q_programs, uniform_q_len, tiles_per_request, num_head_blocks,
            group_size, head_dim, head_dim_v,
            scale, float(softcap), left, right,
            num_kv_splits, min_split_tokens,
        )

    # the query programs move to the grid's second axis, which holds fewer
    heads_first = bool(config.get("heads_first", 0)) and num_q_programs + int(pad_rows) <= MAX_GRID_DIM_1
    # compile-time arguments, SPLIT_KV aside (it follows the final split count)
    constexprs = dict(
        Q_MAPPING=mapping,
        PAD_ROWS=pad_rows,
        BLOCK_Q=block_q,
        HEADS_PER_BLOCK=heads_per_block,
        BLOCK_N=config["BLOCK_N"],
        BLOCK_D=MAX_HEAD_DIM if d_tail else max(16, next_power_of_2(head_dim)),  # tl.dot's K is at least 16
        BLOCK_DV=block_dv,
        NUM_DV=num_dv,
        PAGE_SIZE=page_size,
        CAUSAL=bool(causal),
        HAS_SOFTCAP=softcap > 0,
        HAS_SINKS=sinks is not None,
        HAS_K_DESCALE=k_scale is not None,
        HAS_V_DESCALE=v_scale is not None,
        WRITE_LSE=lse is not None,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        KV_LOAD=kv_load,
        HOIST_GATHER=not decode_like,
        SCORE_CHUNK=score_chunk(config, kv_load, head_dim, d_tail),
        INTEL_GPU=_device.backend() == "xpu",  # code-generation choices for Intel's compiler (the kernel says which)
        HAS_SEQUSED_Q=seqused_q is not None,
        PREFETCH_PAGES=bool(config.get("PREFETCH_PAGES", 0)),
        LAUNCH_DEPENDENTS=_device.programmatic_launch(device),
        HEADS_FIRST=heads_first,
        QO_DESC=query_rows_descriptors(kv_load, block_q, heads_per_block, q, out),
        # qk_scale applied inside the softmax's exponent, one FMA a score (a positive factor
        # commutes with the row max; softcap and K descales keep scaled scores). H100 prefill
        # 0.94-0.99x the time, decode unchanged (bench/results/NVIDIA_H100_80GB_HBM3/experiments/
        # scale_in_exp.txt). Not on Intel GPUs: IGC spilled 64-192 B a thread on the PVC varlen and
        # 16-token-page prefill tiles with it (0 without)
        SCALE_IN_EXP=softcap <= 0 and k_scale is None and scale > 0 and _device.backend() != "xpu",
        HAS_ALIBI=alibi is not None,
        **tune.launch_options(config, fp32_dot_columns=max(config["BLOCK_N"], block_dv) if q.dtype == torch.float32 else 0),
        **({"D_TAIL": d_tail} if d_tail else {}),
    )
    if (kv_load == 2 and _device.backend() == "xpu") or kv_load == 3:
        # triton-xpu 3.3's pipeliner asserts on block pointers whose address comes from a loaded
        # page id (shared/notes/xpu_native.md), and Triton 3.6's cannot predicate a descriptor
        # made in the loop ("pipeliner doesn't know how to predicate ttng.tensormap_create"): one stage
        constexprs["num_stages"] = 1

    def split_partials(num_kv_splits: int, where):
        """Each split's normalised output [total_q, Hq, splits, Dv] and LSE [total_q, Hq, splits],
        fp32, on ``where`` ("meta": their strides only)."""
        return (torch.empty((total_q, num_q_heads, num_kv_splits, head_dim_v), dtype=torch.float32, device=where),
                torch.empty((total_q, num_q_heads, num_kv_splits), dtype=torch.float32, device=where))

    if num_splits == 0 and splits > 1:
        # automatic splits fill whole waves of what the device runs at once (the compiled split
        # kernel's occupancy, looked up once per specialisation; unknown on XPU: kept as is). The
        # kernel is compiled at the count before the cut: a count's divisibility may change
        # Triton's integer specialisation of the split strides, not registers or shared memory.
        key = (device, q.dtype, k.dtype, tuple(constexprs.items()))
        if key not in _RESIDENT_PROGRAMS:
            def compile_split_kernel():  # compiled (or fetched from Triton's cache), not launched
                po, pl = split_partials(splits, "meta")
                with device_guard(device):
                    return _paged_attention_kernel.warmup(
                        *launch_args(torch.float32, torch.float32, po.stride()[:3], pl.stride()[:2], splits),
                        grid=(1, 1, 1), SPLIT_KV=True, **constexprs,
                    )
            _RESIDENT_PROGRAMS[key] = _device.resident_programs(compile_split_kernel, device)
        splits = whole_wave_splits(splits, programs, _RESIDENT_PROGRAMS[key])
    split_kv = splits > 1

    if split_kv:
        partial_out, partial_lse = split_partials(splits, device)
        po_strides, pl_strides = partial_out.stride()[:3], partial_lse.stride()[:2]
    else:
        partial_out = partial_lse = out  # placeholders, never touched
        po_strides, pl_strides = (out.stride(0), out.stride(1), 0), (out.stride(0), out.stride(1))

    grid = (num_q_programs + int(pad_rows), num_kv_heads * num_head_blocks * num_dv, splits)
    if heads_first:
        grid = (grid[1], grid[0], splits)
    with device_guard(device):
        _paged_attention_kernel[grid](*launch_args(partial_out, partial_lse, po_strides, pl_strides, splits), SPLIT_KV=split_kv, **constexprs)
        if split_kv:
            combine_splits(partial_out, partial_lse, out, lse.T if lse is not None else None, sinks, compute_units,
                           after_partials_kernel=True)
    if out is not dest:
        dest.copy_(out)
    return (dest, lse) if return_softmax_lse else dest
