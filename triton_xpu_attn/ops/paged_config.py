"""Tile choices of the paged attention launcher: the XPU tile rules (``xpu_tiles``), the CUDA
heuristics (``_heuristic_config``), the K/V load path (pointers, block pointers, tensor
descriptors) and q / out rows per program. Config files override these through ``tune.lookup``."""
from __future__ import annotations

import torch

from .. import device as _device
from .._common import (
    next_power_of_2,
    paged_rows_descriptors,
)


def xpu_tiles(decode_like: bool, head_dim: int, page_size: int, fp8_kv: bool = False) -> dict:
    """Tiles and launch options for Intel GPUs, chosen so the native code (triton-xpu 3.3 ->
    ocloc, bench/results/xpu_codegen.md) reads K/V by 2D block reads and spills nothing at 256 GRF;
    compiler facts, no Intel GPU timed them. Warps split the query rows, so each sub-group holds
    the whole ``[D, BLOCK_N]`` K^T and ``[BLOCK_N, Dv]`` V tiles: 64-key tiles at D = 128 fill the
    256-GRF file (~11 KB spilled at 1-32 warps), 32 keys do not (16 at D > 128). Pages of 16
    tokens take 16-key tiles (a tile must lie in one page for a 2D read); shorter pages gather
    rows through pointers. Tiles in one page ask for 2D reads both ways, ``kv_device_desc`` and
    ``kv_block_ptr``: the launcher takes device-side tensor descriptors where Triton builds them
    (Intel's 3.4 on: the 2D load newer Intel Triton prefers) and block pointers where only they
    exist (triton-xpu 3.3), ``_kv_load``. fp8 caches take 16-key tiles on 16 warps (32 keys on 8 warps
    spill 320 B at D = 128, 448 B at 64 packed heads: the dequantised K^T beside the 8-bit one).
    Above D = 128 prefill tiles hold one head's tokens (``pack_gqa`` off) and fp8 decode runs the
    score dot over head-dim chunks (``score_chunk``) on 32-key tiles. Used by the heuristic on XPU
    and by ``autotune_configs/seed_xpu_configs.py`` for the shipped files."""
    wide = head_dim > 128
    chunked = wide and fp8_kv and decode_like  # fp8 decode at D > 128: score dot in chunks, 32 keys
    block_n = 32 if chunked or not (wide or fp8_kv) else 16
    if 16 <= page_size < block_n:
        block_n = page_size
    in_page = page_size == 0 or page_size >= block_n  # every key tile inside one page: 2D reads
    tiles = dict(
        BLOCK_N=block_n,
        BLOCK_M=64 if decode_like or wide else 128,
        num_warps=8 if decode_like and not fp8_kv else 16,
        num_stages=1 if in_page else 2,
        grf_mode="256",
        kv_block_ptr=in_page,
        kv_device_desc=in_page,
    )
    if wide and not decode_like:
        # GQA prefill tiles at D > 128 take one head's tokens: q and out become 2D blocks (packed
        # (token, head) rows read q by gathers and spilled 4.3-7.0 KB at D = 256; one head: 0 B, no
        # SLM). Each head of a group reads the K/V tile again (from cache: prefill is compute-bound)
        tiles["pack_gqa"] = False
    if head_dim > 256:
        # Dv = 512 (Gemma 4): the output channels in 128-wide slices on 4 programs, each repeating
        # the score dot. Whole-head tiles spilled 13-17 KB at 256 GRF, 256-channel slices 3.3-4.2 KB,
        # 128: 0 B on PVC and BMG, decode and prefill (bench/results/xpu_native/tiles.txt)
        tiles["BLOCK_DV"] = 128
        if not fp8_kv:
            # 16-bit caches: the cheapest by the cost model over the native code
            # (bench/experiments/xpu_cost_model.py, record bench/results/xpu/cost_model.md): 256-channel
            # slices on 2 programs with the score dot in 128-column chunks, 0 B spilled (K read twice,
            # not 4 times: 1.5x the minimum K/V bytes, 2.5x before); warps at 8 rows each (decode's 16
            # rows on 8 warps repeated both dots 4 times; the model ties 2-16 warps there, memory-bound,
            # and ties go to the least DPAS work). Whole 512-channel rows spill 6.6-17 KB with
            # any chunking (every sub-group holds 8 rows x Dv fp32: 16 KB, the whole 256-GRF file)
            tiles.update(BLOCK_DV=256, score_chunk=128, num_warps=2 if decode_like else 8)
    if head_dim > 512:
        # D = 576 (512 + a 64-channel tail, the kernel's D_TAIL): the score dot in 64-column chunks
        # over both, the D = 512 tiles otherwise: 0 B spilled on PVC and BMG, decode and prefill;
        # whole 512-channel V rows on one program spill 6.7-13 KB at 2-8 warps (the cost model's
        # pick too: 1.53x the minimum against 3.1x for the one-program tile, cost_model.md)
        tiles["score_chunk"] = 64
    if chunked:
        # fp8 K^T has no 2D read: gathered 8-bit K^T beside its 16-bit copy spilled 8.4-8.8 KB at
        # D = 256; the score dot over 128-column chunks with 32-key tiles spills 0 (16-key tiles,
        # i.e. 16-token pages, still 4.5 KB: bench/results/xpu_native/tiles.txt)
        tiles["score_chunk"] = 128
    return tiles


def _heuristic_config(decode_like: bool, head_dim: int, work: int, page_size: int, max_q: int | None = None,
                      fp8_kv: bool = False, head_dim_v: int | None = None, q_bytes: int = 2) -> dict:
    """Built-in config when no tuned file covers the bucket (measured on H200: a small decode
    batch wants long tiles over many splits, a full one shorter tiles; prefill on the H100,
    bench/results/NVIDIA_H100_80GB_HBM3/experiments/prefill_tiles.txt and prefill_desc.txt)."""
    if decode_like:
        # H200 tuning: long key tiles until the batch fills the device, then 64 (128 for D <= 64)
        block_n = 128 if work <= 4 or head_dim <= 64 else 64
    else:
        block_n = 64
    if head_dim > 128:
        block_n = min(block_n, 32)  # [BLOCK_N, D] tiles of K and V must fit the registers
    # D > 256 (Gemma 4's 512): whole-head tiles of 32 keys (16 where one request's splits fill the
    # device). H100, 32/8/512 P = 16 (experiments/wide_tiles.txt): decode 16 rows x 32 keys on 4
    # warps 2826 us at B = 64, 8k keys (16 keys: 3256 us, 3 programs per SM against 2, whose
    # 512 programs leave a partial second wave); 1.00x at B = 16; B = 1 1.03x slower, so 16 there.
    # Prefill 64 x 32 on 8 warps 199 TF/s (64 x 16: 125; 128-row and 4-warp tiles 0.3-0.7x). With
    # float32 operands (q_bytes 4) 32-key tiles need 264 KB of shared memory (232 KB on an H100): 16
    very_wide = max(head_dim, head_dim_v or 0) > 256
    if very_wide:
        block_n = 16 if (decode_like and work <= 2) or q_bytes > 2 else 32
    # prefill, D = 128, pages of whole 64-key tiles: K/V through tensor descriptors (TMA), page
    # rows read one tile ahead, 3 stages: 1.2-1.3x over pointer loads (H100, 32/8/128 causal
    # prefill, B = 1, L = 8k: 375 -> 460-486 TF/s). D = 64 stays on pointers (descriptors 0.95x
    # there). Contiguous K/V (page_size 0) with the unmasked tiles in a loop of their own: 1.14-1.25x
    # at 4k-8k queries a request, 0.95x at 1k (experiments/prefill_pages.txt), so from 2k on.
    # Off on XPU until measured there (a config file may turn it on: Intel's Triton >= 3.5 lowers
    # them to 2D block IO).
    # Pages of half a tile (P = 32) load one page per descriptor, two a tile: 1.31x over the
    # gathers (H100, 32/8/128, B = 1, L = 8k: 294 -> 384 TF/s; experiments/prefill_pages.txt);
    # P = 16 stays on gathers (four pages a tile: 0.63-0.83x, two with 32-key tiles: 0.96x).
    whole_pages = page_size >= block_n or 2 * page_size == block_n
    long_contiguous = page_size == 0 and (max_q or 0) >= 2048
    kv_desc = (not decode_like and head_dim == 128 and (whole_pages or long_contiguous)
               and _device.backend() == "cuda")
    # prefill over pages shorter than a key tile (row gathers): 128-row query tiles on 8 warps,
    # 1.30x at P = 16 (H100, 32/8/128, B = 1, L = 8k: 260 -> 338 TF/s); below 16 from 512 queries a
    # request (P = 1: 1.04-1.11x at 512-8k queries, 0.96x at 256; experiments/prefill_pages.txt)
    gather_prefill = (not decode_like and 0 < page_size < block_n and not kv_desc
                      and (page_size >= 16 or (max_q or 0) >= 512))
    # D <= 64 prefill of 1k+ queries a request over one-tile pages or contiguous K/V: 128-row tiles
    # on 8 warps, 3 stages (H100, 32/8/64: 1.04-1.12x at P = 64 and contiguous; 0.98x at P = 128/256
    # and 0.95x at 256 queries, which keep 64-row tiles; experiments/prefill_pages.txt)
    narrow_prefill = (not decode_like and head_dim <= 64 and page_size in (0, block_n)
                      and (max_q or 0) >= 1024)
    tiles = dict(
        BLOCK_N=block_n,
        BLOCK_M=128 if gather_prefill or narrow_prefill else 64,  # query rows (token x head) of a prefill tile
        num_warps=8 if gather_prefill or narrow_prefill else 4,
        num_stages=3 if kv_desc or narrow_prefill else 2,
        grf_mode="256" if head_dim > 128 else None,  # XPU only: 256 registers per thread
    )
    if very_wide:  # 16-row decode tiles on 4 warps (a draft's rows take several); 64-row prefill tiles on 8
        tiles.update(BLOCK_M=16 if decode_like else 64, num_warps=4 if decode_like else 8, num_stages=2)
    if _device.backend() == "xpu":
        tiles = xpu_tiles(decode_like, max(head_dim, head_dim_v or 0), page_size, fp8_kv)
    return dict(
        **tiles,
        # a split covers at least this many keys; at most max_splits splits (H200, B=1: 8/1/128
        # at 32k keys runs 1.18x faster on 128 splits than on 64; 32/8/128 at 1k 1.2x on 8 than 4)
        min_split_tokens=128,
        waves=2,  # aim for this many programs per compute unit when splitting
        max_splits=128,
        kv_desc=kv_desc,
        # page ids read a tile ahead of the K/V gather (pages shorter than the key tile): where it was
        # measured to pay, one-query decode on CUDA at D = 128 over one-token pages (H100: 0.976-0.994x
        # the time from B = 64 at 8k keys, 1.00-1.01x at B = 1; H200 0.952-1.014x) and above D = 256
        # over pages shorter than the 32-key tile (H200, 16-token pages: 0.963-0.995x; H100
        # 0.995-1.001x). Elsewhere off: D = 64 P = 1 lost programs per SM (5 -> 4, up to 1.03x
        # slower), 3-stage draft tiles doubled their shared memory, and D = 128 P = 16 moved within
        # noise (experiments/prefetch_pages_p1.txt); a config file may ask for it
        PREFETCH_PAGES=int(decode_like and max_q == 1 and _device.backend() == "cuda"
                           and ((page_size == 1 and head_dim == 128) or (very_wide and page_size < block_n))),
        # one-query decode on CUDA: the grid's KV heads first, so a request's heads are neighbouring
        # programs (H200, B = 64 8k keys: 64/8/128 P = 1 504.9 -> 501.8 us, 32/8/128 P = 16
        # 501.2 -> 498.7, others level; experiments/block_order.txt)
        heads_first=int(decode_like and max_q == 1 and _device.backend() == "cuda"),
    )


def _kv_descriptors(k: torch.Tensor, v: torch.Tensor, page_size: int, config: dict, device):
    """(K, V) host tensor descriptors of the caches seen as ``[token rows, row]`` (paged: pages
    of ``page_size`` rows flattened; ``page_size = 0``: contiguous ``[total_k, H_kv, D]``) with
    ``[BLOCK_N, D]`` / ``[BLOCK_N, Dv]`` blocks (``[P, D]`` when a tile is two pages of ``P >= 16``
    rows), or None where the config does not ask for them (``kv_desc``) or they cannot be used
    (``paged_rows_descriptors``; a key tile must lie in one page or two whole ones, and the head
    dims must be powers of two: the block is the whole head)."""
    block_n = config["BLOCK_N"]
    if not config.get("kv_desc") or (0 < page_size < block_n and (page_size < 16 or block_n != 2 * page_size)):
        return None
    rows = min(page_size, block_n) if page_size else block_n  # two pages a tile: one load a page
    descriptors = []
    for cache in (k, v):
        num_kv_heads, dim = cache.shape[-2:]
        if dim != next_power_of_2(dim) or dim < 16:  # the block is the whole head, at least tl.dot's K
            return None
        row_width = (num_kv_heads - 1) * cache.stride(-2) + dim
        found = paged_rows_descriptors(cache, page_size, row_width, [(rows, dim)], device)
        if found is None:
            return None
        descriptors += found
    return tuple(descriptors)


def query_heads_per_block(group_size: int, max_q: int | None, config: dict | None = None) -> int:
    """Query heads one program packs as rows (``HEADS_PER_BLOCK``): the group's, rounded up to a
    power of two, at most 64. With block-pointer K/V (``kv_block_ptr``; on XPU device-side
    descriptor K/V, ``kv_device_desc``, too) and one query a request, at least 16 (heads past the
    group are out of bounds) instead of a few heads times padded tokens, so q and out are plain
    2D blocks (the kernel's ``QO_BLOCK`` / ``QO_DESC``: 2D block IO, no layout conversion through
    SLM; XPU native code: bench/results/xpu_codegen.md). A config with ``pack_gqa`` false asks
    for one head's tokens (1), as FlashAttention-3's ``pack_gqa=False``."""
    if config is not None and config.get("pack_gqa") is False:
        return 1
    heads = min(next_power_of_2(group_size), 64)
    two_d = config is not None and (config.get("kv_block_ptr")
                                    or (config.get("kv_device_desc") and _device.backend() == "xpu"))
    if two_d and max_q == 1:
        heads = max(heads, 16)
    return heads


def _kv_load(page_size: int, config: dict, kv_descriptors, caches=()) -> int:
    """``KV_LOAD`` of a launch: 1 when K/V tensor descriptors were made (``_kv_descriptors``);
    where every key tile lies in one page (or contiguous K/V): 3, device-side tensor descriptors,
    where the config asks for them (``kv_device_desc``), Triton builds them
    (``device.device_descriptors``) and the ``caches`` (K, V) are 16-byte aligned row by row; 2,
    block pointers, where the config asks (``kv_block_ptr``) and Triton builds them
    (``device.block_pointers``) and, on Intel GPUs, every K/V tile's base is 64-byte aligned
    (``XPU_BLOCK_BASE_ALIGN``); else 0, pointer loads. The XPU tiles (``xpu_tiles``) ask for
    both, so Intel's Triton with descriptors (3.4 on: 3.7 in torch's XPU wheels, Intel's main,
    whose block pointers are removed) gets 3, triton-xpu 3.3 gets 2, and a Triton with neither
    pointer loads."""
    if kv_descriptors is not None:
        return 1
    if page_size and page_size < config["BLOCK_N"]:
        return 0
    if config.get("kv_device_desc") and _device.device_descriptors() and all(map(_rows_aligned, caches)):
        return 3
    if config.get("kv_block_ptr") and _device.block_pointers() and (
            _device.backend() != "xpu" or all(_rows_aligned(c, XPU_BLOCK_BASE_ALIGN) for c in caches)):
        return 2
    return 0


#: bytes a block-pointer tile's base must be aligned to on Intel GPUs: triton-xpu 3.3 hands a base
#: off 64 bytes to the 2D block read as it is and also adds the offset to x and the width, so the
#: read lands that many bytes too far right where the base's low 6 bits count (BMG;
#: intel-xpu-backend-for-triton #4304). A tile's base is the cache's plus page, row and head strides
XPU_BLOCK_BASE_ALIGN = 64


def _rows_aligned(cache: torch.Tensor, align: int = 16) -> bool:
    """The base and every stride but the last ``align``-byte aligned: 16 for a device-side
    descriptor's base and row pitch (TMA on Hopper, Intel's descriptor rules), 64 for block-pointer
    tiles on Intel GPUs."""
    size = cache.element_size()
    return cache.data_ptr() % align == 0 and all(stride * size % align == 0 for stride in cache.stride()[:-1])


def score_chunk(config: dict, kv_load: int, head_dim: int, d_tail: int = 0) -> int:
    """``SCORE_CHUNK`` of a launch: the config's ``score_chunk`` (head-dim columns per score dot)
    where K/V use block pointers or device-side descriptors (``KV_LOAD`` 2 or 3) and it is
    narrower than the padded head dim; else 0 (one dot). With a tail chunk (``d_tail``, the
    kernel's ``D_TAIL``) the chunks are at most its width, so they tile it."""
    chunk = config.get("score_chunk", 0)
    if d_tail and chunk:
        chunk = min(chunk, d_tail)
    return chunk if kv_load in (2, 3) and 0 < chunk < next_power_of_2(head_dim) else 0


def query_rows_descriptors(kv_load: int, block_q: int, heads_per_block: int, q: torch.Tensor,
                           out: torch.Tensor) -> bool:
    """``QO_DESC`` of a launch: q and out through device-side tensor descriptors, on Intel GPUs
    with descriptor K/V (``KV_LOAD = 3``) where a program's rows form a plain 2D block (one
    token's heads, ``BLOCK_Q = 1``, or one head's tokens) and both are 16-byte aligned row by
    row, as block-pointer K/V reads them through block pointers (the kernel's ``QO_BLOCK``)."""
    return (kv_load == 3 and _device.backend() == "xpu" and (block_q == 1 or heads_per_block == 1)
            and _rows_aligned(q) and _rows_aligned(out))
