"""The paged attention kernel's XPU compile variants (``.ci/xpu_compile_check.py`` compiles each
for PVC and BMG and reads the native code): the shapes and constexprs the XPU launches use."""
from __future__ import annotations

from .. import device as _device
from .._common import LaunchShape, cdiv, register_xpu_compile
from .paged_kernel import _PER_REQUEST, _SEARCH, _UNIFORM, _paged_attention_kernel


def xpu_launch_shape(c: dict, q_heads: int, kv_heads: int, keys: int = 4096, q_len: int = 1, batch: int = 1,
                     splits: int = 1, kv_bytes: int = 2) -> LaunchShape:
    """The work of one launch with the kernel's constexprs ``c`` (``LaunchShape``: the XPU
    native-code table's work columns, bench/experiments/xpu_cost_model.py): ``batch`` requests of
    ``q_len`` tokens (causal, bottom-right) over ``keys`` cached tokens, ``q_heads`` / ``kv_heads``
    heads, ``splits`` KV splits. A program loads per key tile ``BLOCK_N`` rows of K (all ``BLOCK_D``
    channels: the score dot) and of its ``BLOCK_DV`` value channels; the minimum reads each K/V byte
    once per KV head and multiplies each visible (query head, key) pair once over ``D + Dv``."""
    group = q_heads // kv_heads
    d, dv, n, block_q = c["BLOCK_D"] + c["D_TAIL"], c["BLOCK_DV"] * c["NUM_DV"], c["BLOCK_N"], c["BLOCK_Q"]
    q_tiles = cdiv(q_len, block_q)
    # keys each query tile visits (its last row's causal limit), and the visible pairs of a head
    tiles = [cdiv(cdiv(keys - q_len + min((t + 1) * block_q, q_len), splits), n) for t in range(q_tiles)]
    pairs = sum(keys - q_len + t + 1 for t in range(q_len))
    return LaunchShape(
        shape=f"B{batch} H{q_heads}/{kv_heads} D{d}" + (f" q{q_len}" if q_len > 1 else "") + f" L{keys}"
        + (f" s{splits}" if splits > 1 else ""),
        programs=batch * kv_heads * cdiv(group, c["HEADS_PER_BLOCK"]) * q_tiles * c["NUM_DV"] * splits,
        iterations=round(sum(tiles) / q_tiles),
        loaded_bytes=n * (d + c["BLOCK_DV"]) * kv_bytes,
        min_macs=batch * q_heads * pairs * (d + dv),
        min_bytes=batch * kv_heads * keys * (d + dv) * kv_bytes,
    )


def _register_compile_variants():
    common = dict(
        q_ptr="*bf16", stride_q_t="i64", stride_q_h="i32",
        k_cache_ptr="*bf16", stride_k_page="i64", stride_k_tok="i32", stride_k_head="i32",
        v_cache_ptr="*bf16", stride_v_page="i64", stride_v_tok="i32", stride_v_head="i32",
        page_table_ptr="*i32", stride_pt_b="i32", max_pages="i32", pool_size="i32", cache_seqlens_ptr="*i32",
        cu_seqlens_q_ptr="*i32",
        cu_seqlens_k_ptr="*i32", seqused_q_ptr="*i32",
        k_descale_ptr="*fp32", stride_kd_b="i32", stride_kd_h="i32",
        v_descale_ptr="*fp32", stride_vd_b="i32", stride_vd_h="i32",
        sinks_ptr="*fp32", alibi_ptr=None, stride_alibi_b=None, out_ptr="*bf16", stride_o_t="i64", stride_o_h="i32",
        lse_ptr="*fp32", stride_lse_h="i64", stride_lse_t="i32",
        partial_out_ptr="*fp32", stride_po_t="i64", stride_po_h="i32", stride_po_s="i32",
        partial_lse_ptr="*fp32", stride_pl_t="i32", stride_pl_h="i32",
        batch="i32", total_q="i32", num_q_programs="i32", uniform_q_len="i32", tiles_per_request="i32", num_head_blocks="i32",
        group_size="i32", head_dim="i32", head_dim_v="i32",
        sm_scale="fp32", softcap="fp32", window_left="i32", window_right="i32",
        num_kv_splits="i32", min_split_tokens="i32",
        Q_MAPPING=_PER_REQUEST, PAD_ROWS=True, BLOCK_Q=4, HEADS_PER_BLOCK=4, BLOCK_N=64, BLOCK_D=128, BLOCK_DV=128,
        PAGE_SIZE=64, CAUSAL=True, HAS_SOFTCAP=False, HAS_SINKS=False, HAS_K_DESCALE=False,
        HAS_V_DESCALE=False, SPLIT_KV=True, WRITE_LSE=False, DOT_PRECISION="tf32",
        k_desc=None, v_desc=None, KV_LOAD=0,  # descriptor loads need Triton >= 3.4 (not triton-xpu 3.3)
        HOIST_GATHER=False, SCORE_CHUNK=0, INTEL_GPU=True,  # as the launcher sets it on XPU
        HAS_SEQUSED_Q=False, PREFETCH_PAGES=False, NUM_DV=1,  # the launcher asks for the prefetch on CUDA only
        LAUNCH_DEPENDENTS=False,  # a CUDA launch mode (device.programmatic_launch)
        HEADS_FIRST=False,  # a CUDA grid order (one-query decode)
        QO_DESC=False,  # descriptor q / out go with descriptor K/V (KV_LOAD 3: not triton-xpu 3.3)
        SCALE_IN_EXP=False,  # a CUDA choice (IGC spills with it)
        D_TAIL=0,  # head dims past 512 only
        HAS_ALIBI=False,
    )
    # as XPU launches them (xpu_tiles): K/V tiles inside one page, or contiguous, through block
    # pointers (2D block reads), one stage, 256 GRF
    xpu = dict(num_stages=1, grf_mode=_device.xpu_large_grf_mode())
    register_xpu_compile(  # one query: the group's 4 heads padded to a 16-row block (q/out in 2D too)
        _paged_attention_kernel, "decode,bf16,D128,g4,P64,split",
        {**common, "BLOCK_Q": 1, "HEADS_PER_BLOCK": 16, "BLOCK_N": 32, "KV_LOAD": 2},
        dots=2, num_warps=8, op="paged_attention", block_2d=("Q", "K", "V"),
        launch=lambda c: xpu_launch_shape(c, 32, 8, splits=4), **xpu)
    register_xpu_compile(  # paged prefill, 16-token pages: 16-key tiles (config files compile on this one)
        _paged_attention_kernel, "prefill,bf16,D128,g4,P16,causal",
        {**common, "Q_MAPPING": _SEARCH, "BLOCK_Q": 32, "BLOCK_N": 16, "PAGE_SIZE": 16, "SPLIT_KV": False,
         "HOIST_GATHER": True, "KV_LOAD": 2},
        dots=2, num_warps=16, op="paged_attention", block_2d=("K", "V"), **xpu,
    )
    register_xpu_compile(  # pages shorter than any tile: row gathers through pointers; softcap, sinks, window
        _paged_attention_kernel, "prefill,fp16,D64,g8,P1,window,sinks,softcap",
        {**common, "q_ptr": "*fp16", "k_cache_ptr": "*fp16", "v_cache_ptr": "*fp16", "out_ptr": "*fp16",
         "Q_MAPPING": _SEARCH, "BLOCK_Q": 16, "HEADS_PER_BLOCK": 8, "BLOCK_N": 32, "BLOCK_D": 64, "BLOCK_DV": 64,
         "PAGE_SIZE": 1, "HAS_SOFTCAP": True, "HAS_SINKS": True, "SPLIT_KV": False, "WRITE_LSE": True,
         "HOIST_GATHER": True},
        dots=2, num_warps=16, op="paged_attention", num_stages=2, grf_mode=_device.xpu_large_grf_mode(),
    )
    register_xpu_compile(  # 8-bit K^T has no column-major 2D read (by design): V only
        _paged_attention_kernel, "decode,bf16,fp8-e4m3 KV,D128,g8,P128",
        {**common, "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv", "Q_MAPPING": _UNIFORM, "BLOCK_Q": 2, "PAD_ROWS": False,
         "HEADS_PER_BLOCK": 8, "BLOCK_N": 16, "PAGE_SIZE": 128, "HAS_K_DESCALE": True, "HAS_V_DESCALE": True, "KV_LOAD": 2},
        dots=2, num_warps=16, op="paged_attention", block_2d=("V",), **xpu,
    )
    register_xpu_compile(  # fp8 at D = 256: the score dot in 128-column chunks (q re-read per chunk in 2D)
        _paged_attention_kernel, "decode,bf16,fp8-e4m3 KV,D256,g8,P64,score chunks",
        {**common, "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv", "BLOCK_Q": 1, "HEADS_PER_BLOCK": 16,
         "BLOCK_N": 32, "BLOCK_D": 256, "BLOCK_DV": 256, "HAS_K_DESCALE": True, "HAS_V_DESCALE": True, "KV_LOAD": 2,
         "SCORE_CHUNK": 128},
        dots=2, num_warps=16, op="paged_attention", block_2d=("Q", "V"), **xpu,
    )
    # head dims that are not powers of two (masked channels of a 128- / 64-wide tile) and pages of
    # 512-2048 tokens: a block pointer spans one key tile, never a whole page
    register_xpu_compile(
        _paged_attention_kernel, "decode,bf16,D72,g4,P2048,split",
        {**common, "BLOCK_Q": 1, "HEADS_PER_BLOCK": 16, "BLOCK_N": 32, "PAGE_SIZE": 2048, "KV_LOAD": 2},
        dots=2, num_warps=8, op="paged_attention", block_2d=("Q", "K", "V"), **xpu)
    register_xpu_compile(
        _paged_attention_kernel, "prefill,bf16,D40,Dv24,g2,P512,causal",
        {**common, "Q_MAPPING": _SEARCH, "BLOCK_Q": 64, "HEADS_PER_BLOCK": 2, "BLOCK_N": 32, "BLOCK_D": 64,
         "BLOCK_DV": 32, "PAGE_SIZE": 512, "SPLIT_KV": False, "HOIST_GATHER": True, "KV_LOAD": 2},
        dots=2, num_warps=16, op="paged_attention", block_2d=("K", "V"), **xpu,
    )
    # D = 512 (Gemma 4's global layers): 16-key K tiles, the score dot in 128-column chunks, V and
    # out in 256-channel slices on 2 programs (xpu_tiles: the cost model's pick), q / out in 2D
    register_xpu_compile(
        _paged_attention_kernel, "decode,bf16,D512,g8,P64,split",
        {**common, "BLOCK_Q": 1, "HEADS_PER_BLOCK": 16, "BLOCK_N": 16, "BLOCK_D": 512, "BLOCK_DV": 256, "NUM_DV": 2,
         "KV_LOAD": 2, "SCORE_CHUNK": 128},
        dots=2, num_warps=2, op="paged_attention", block_2d=("Q", "K", "V"),
        launch=lambda c: xpu_launch_shape(c, 32, 4, splits=4), **xpu)
    register_xpu_compile(
        _paged_attention_kernel, "prefill,bf16,D512,g2,P64,causal",
        {**common, "Q_MAPPING": _SEARCH, "BLOCK_Q": 64, "HEADS_PER_BLOCK": 1, "BLOCK_N": 16, "BLOCK_D": 512,
         "BLOCK_DV": 256, "NUM_DV": 2, "SPLIT_KV": False, "HOIST_GATHER": True, "KV_LOAD": 2, "SCORE_CHUNK": 128},
        dots=2, num_warps=8, op="paged_attention", block_2d=("Q", "K", "V"),
        launch=lambda c: xpu_launch_shape(c, 8, 4, keys=4096, q_len=4096), **xpu,
    )
    # D = 576, Dv = 512 (MLA's latent + rope rows with V their first 512 channels, where they do
    # not take the MLA kernels): 512-channel K tiles plus a 64-channel tail (D_TAIL), the score
    # dot in 64-column chunks over both, V and out as the D = 512 tiles
    register_xpu_compile(
        _paged_attention_kernel, "decode,bf16,D576,Dv512,g16,P64,split",
        {**common, "BLOCK_Q": 1, "HEADS_PER_BLOCK": 16, "BLOCK_N": 16, "BLOCK_D": 512, "BLOCK_DV": 256, "NUM_DV": 2,
         "KV_LOAD": 2, "SCORE_CHUNK": 64, "D_TAIL": 64},
        dots=2, num_warps=2, op="paged_attention", block_2d=("Q", "K", "V"),
        launch=lambda c: xpu_launch_shape(c, 16, 1, splits=4), **xpu)
    register_xpu_compile(
        _paged_attention_kernel, "prefill,bf16,D576,Dv512,g16,P64,causal",
        {**common, "Q_MAPPING": _SEARCH, "BLOCK_Q": 64, "HEADS_PER_BLOCK": 1, "BLOCK_N": 16, "BLOCK_D": 512,
         "BLOCK_DV": 256, "NUM_DV": 2, "SPLIT_KV": False, "HOIST_GATHER": True, "KV_LOAD": 2, "SCORE_CHUNK": 64,
         "D_TAIL": 64},
        dots=2, num_warps=8, op="paged_attention", block_2d=("Q", "K", "V"),
        launch=lambda c: xpu_launch_shape(c, 16, 1, keys=4096, q_len=4096), **xpu,
    )
    # contiguous K/V (PAGE_SIZE = 0, flash_attn_varlen_func): prefill-shaped, 128-row query tiles
    register_xpu_compile(
        _paged_attention_kernel, "varlen,bf16,D128,g4,causal",
        {**common, "BLOCK_Q": 32, "HEADS_PER_BLOCK": 4, "BLOCK_N": 32, "PAGE_SIZE": 0, "SPLIT_KV": False,
         "HOIST_GATHER": True, "KV_LOAD": 2},
        dots=2, num_warps=16, op="paged_attention", block_2d=("K", "V"), **xpu,
    )
    register_xpu_compile(  # DeepSeek MLA extend: D = 192, Dv = 128, LSE for merge_state_v2
        _paged_attention_kernel, "varlen,bf16,D192,Dv128,g1,causal,lse",
        {**common, "BLOCK_Q": 64, "HEADS_PER_BLOCK": 1, "BLOCK_N": 16, "BLOCK_D": 256, "BLOCK_DV": 128,
         "PAGE_SIZE": 0, "SPLIT_KV": False, "WRITE_LSE": True, "HOIST_GATHER": True, "KV_LOAD": 2},
        dots=2, num_warps=16, op="paged_attention", block_2d=("Q", "K", "V"), **xpu,
    )

    register_xpu_compile(  # ALiBi (BLOOM, MPT, Baichuan): the per-row slope and distance bias on a prefill tile
        _paged_attention_kernel, "prefill,bf16,D128,g4,P16,causal,alibi",
        {**common, "Q_MAPPING": _SEARCH, "BLOCK_Q": 32, "BLOCK_N": 16, "PAGE_SIZE": 16, "SPLIT_KV": False,
         "HOIST_GATHER": True, "KV_LOAD": 2, "alibi_ptr": "*fp32", "stride_alibi_b": "i32", "HAS_ALIBI": True},
        dots=2, num_warps=16, op="paged_attention", block_2d=("K", "V"), **xpu,
    )


_register_compile_variants()
