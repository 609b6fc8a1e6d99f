"""What portable Triton reaches on causal prefill on this GPU (issue 21): a minimal FlashAttention
forward written here (one query head per program, 128-row query tiles, dense BSHD K/V, causal
bottom-right with q_len == L), in three forms, beside FlashInfer and our paged kernel:

* ``ptr``: pointer loads (what triton-xpu 3.3 compiles too),
* ``desc``: K/V/Q through host tensor descriptors (TMA on Hopper; Triton >= 3.4),
* ``desc+ws``: descriptors and ``tl.range(warp_specialize=True)`` on the key loop,
* ``desc+sw``: descriptors, and the unmasked loop software-pipelined by hand: tile j+1's scores
  ``Q K^T`` are issued before tile j's softmax and ``P V`` (FlashAttention-3's intra-warpgroup
  overlap; session 12), so the tensor cores can run one while the softmax runs.

Dense K/V is an upper bound for paged K/V with pages >= the key tile (a tile then lies in one page).
GPU only; times are medians of CUDA-graph replays (``bench.common.graph_ms``).

    python bench/experiments/prefill_ceiling.py [--flashinfer .peers/flashinfer]
"""
from __future__ import annotations

import argparse
import itertools
import math
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import triton_xpu_attn as ours  # noqa: E402,F401
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench.common import causal_flops, flashinfer_peer_script, graph_ms, rel_err  # noqa: E402

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton < 3.4 (and triton-xpu 3.3)
    TensorDescriptor = None


@triton.jit
def _softmax_pv(s, v_blk, acc, m_i, l_i):
    """Online softmax of the scaled (and masked) scores ``s`` and ``acc += P V``."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v_blk.dtype), v_blk, acc * alpha[:, None], out_dtype=tl.float32)
    return acc, m_new, l_i


@triton.jit
def _tile(q, k_blk, v_blk, acc, m_i, l_i, qk_scale, offs_m, offs_n, n0, MASK: tl.constexpr):
    s = tl.dot(q, tl.trans(k_blk), out_dtype=tl.float32) * qk_scale
    if MASK:
        s = tl.where(offs_m[:, None] >= (n0 + offs_n)[None, :], s, float("-inf"))
    return _softmax_pv(s, v_blk, acc, m_i, l_i)


@triton.jit
def _fa_ptr(q_ptr, k_ptr, v_ptr, o_ptr, L, Hq, group, stride_t, stride_kt, qk_scale,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, STAGES: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # longest (last) query tiles first
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    kvh = h // group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    row0 = (b * L).to(tl.int64)
    q = tl.load(q_ptr + (row0 + offs_m)[:, None] * stride_t + h * D + d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    hi_full = pid_m * BLOCK_M
    for n0 in tl.range(0, hi_full, BLOCK_N, num_stages=STAGES):
        kp = (row0 + n0 + offs_n)[:, None] * stride_kt + kvh * D + d[None, :]
        acc, m_i, l_i = _tile(q, tl.load(k_ptr + kp), tl.load(v_ptr + kp), acc, m_i, l_i, qk_scale, offs_m, offs_n, n0, False)
    for n0 in tl.range(hi_full, hi_full + BLOCK_M, BLOCK_N):
        kp = (row0 + n0 + offs_n)[:, None] * stride_kt + kvh * D + d[None, :]
        acc, m_i, l_i = _tile(q, tl.load(k_ptr + kp), tl.load(v_ptr + kp), acc, m_i, l_i, qk_scale, offs_m, offs_n, n0, True)
    o = acc / l_i[:, None]
    tl.store(o_ptr + (row0 + offs_m)[:, None] * stride_t + h * D + d[None, :], o.to(o_ptr.dtype.element_ty))


@triton.jit
def _fa_desc(q_desc, k_desc, v_desc, o_desc, L, Hq, group, qk_scale,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr,
             SW: tl.constexpr = False):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    kvh = h // group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    row0 = b * L
    q = q_desc.load([row0 + pid_m * BLOCK_M, h * D])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    hi_full = pid_m * BLOCK_M
    if SW:
        if hi_full > 0:
            # scores of tile 0, then each iteration issues tile j+1's scores before tile j's softmax
            s = tl.dot(q, tl.trans(k_desc.load([row0, kvh * D])), out_dtype=tl.float32)
            for n0 in tl.range(0, hi_full - BLOCK_N, BLOCK_N, num_stages=STAGES):
                s_next = tl.dot(q, tl.trans(k_desc.load([row0 + n0 + BLOCK_N, kvh * D])), out_dtype=tl.float32)
                acc, m_i, l_i = _softmax_pv(s * qk_scale, v_desc.load([row0 + n0, kvh * D]), acc, m_i, l_i)
                s = s_next
            acc, m_i, l_i = _softmax_pv(s * qk_scale, v_desc.load([row0 + hi_full - BLOCK_N, kvh * D]), acc, m_i, l_i)
    else:
        for n0 in tl.range(0, hi_full, BLOCK_N, num_stages=STAGES, warp_specialize=WS):
            acc, m_i, l_i = _tile(q, k_desc.load([row0 + n0, kvh * D]), v_desc.load([row0 + n0, kvh * D]),
                                  acc, m_i, l_i, qk_scale, offs_m, offs_n, n0, False)
    for n0 in tl.range(hi_full, hi_full + BLOCK_M, BLOCK_N):
        acc, m_i, l_i = _tile(q, k_desc.load([row0 + n0, kvh * D]), v_desc.load([row0 + n0, kvh * D]),
                              acc, m_i, l_i, qk_scale, offs_m, offs_n, n0, True)
    o = acc / l_i[:, None]
    o_desc.store([row0 + pid_m * BLOCK_M, h * D], o.to(o_desc.dtype))


def fa(kind, q, k, v, out, B, L, Hq, Hkv, D, bm, bn, warps, stages):
    qk_scale = D**-0.5 * 1.4426950408889634
    grid = (L // bm, B * Hq)
    if kind == "ptr":
        return lambda: _fa_ptr[grid](q, k, v, out, L, Hq, Hq // Hkv, q.stride(0), k.stride(0), qk_scale,
                                     BLOCK_M=bm, BLOCK_N=bn, D=D, STAGES=stages, num_warps=warps, num_stages=stages)
    q2, o2 = q.view(B * L, Hq * D), out.view(B * L, Hq * D)
    k2, v2 = k.view(B * L, Hkv * D), v.view(B * L, Hkv * D)
    qd, od = TensorDescriptor.from_tensor(q2, [bm, D]), TensorDescriptor.from_tensor(o2, [bm, D])
    kd, vd = TensorDescriptor.from_tensor(k2, [bn, D]), TensorDescriptor.from_tensor(v2, [bn, D])
    return lambda: _fa_desc[grid](qd, kd, vd, od, L, Hq, Hq // Hkv, qk_scale, BLOCK_M=bm, BLOCK_N=bn, D=D,
                                  STAGES=stages, WS=kind == "desc+ws", SW=kind == "desc+sw", num_warps=warps,
                                  num_stages=stages)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashinfer", default=None)
    ap.add_argument("--kinds", default="ptr,desc,desc+ws", help="comma-separated, from ptr, desc, desc+ws, desc+sw")
    ap.add_argument("--sdpa", action="store_true", help="also time dense torch SDPA (flash backend, GQA)")
    args = ap.parse_args()
    fi = peer = None
    if args.flashinfer:  # the bundle folder; its set-up script flashinfer_peer.py lies beside it
        peer = flashinfer_peer_script(pathlib.Path(args.flashinfer).resolve().parent)
        fi = peer.setup(args.flashinfer)
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    for B, L, Hq, Hkv, D in [(1, 8192, 32, 8, 128), (4, 4096, 32, 8, 128), (4, 4096, 32, 8, 64)]:
        torch.manual_seed(0)
        q = torch.randn(B * L, Hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B * L, Hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B * L, Hkv, D, device="cuda", dtype=torch.bfloat16)
        tf = lambda us: causal_flops(B, Hq, D, L, L) / us / 1e6  # noqa: E731
        qd = q.view(B, L, Hq, D).transpose(1, 2)
        ref = torch.nn.functional.scaled_dot_product_attention(
            qd, k.view(B, L, Hkv, D).transpose(1, 2), v.view(B, L, Hkv, D).transpose(1, 2), is_causal=True,
            enable_gqa=True).transpose(1, 2).reshape(B * L, Hq, D)
        name = f"B={B} L={L} {Hq}/{Hkv}/{D}"
        line = [name]
        cu = torch.arange(B + 1, device="cuda", dtype=torch.int32) * L
        seqlens = torch.full((B,), L, device="cuda", dtype=torch.int32)
        table = torch.arange(B * L // 64, device="cuda", dtype=torch.int32).view(B, L // 64)
        k4, v4 = k.view(-1, 64, Hkv, D), v.view(-1, 64, Hkv, D)
        f_ours = lambda: ours.flash_attn_with_kvcache(q, k4, v4, cache_seqlens=seqlens, page_table=table,  # noqa: E731
                                                      cu_seqlens_q=cu, max_seqlen_q=L, causal=True)
        line.append(f"ours paged P64 {tf(graph_ms(f_ours, 10, 40) * 1e3):.0f} (err {rel_err(f_ours(), ref):.1e})")
        if fi is not None:
            f = peer.gqa_prefill(fi, q, k4, v4, table, seqlens, cu, D**-0.5, "fa3")
            line.append(f"flashinfer fa3 P64 {tf(graph_ms(f, 10, 40) * 1e3):.0f} (err {rel_err(f(), ref):.1e})")
        print(" | ".join(line), flush=True)
        if args.sdpa:
            kd_, vd_ = (x.view(B, L, Hkv, D).transpose(1, 2) for x in (k, v))
            f = lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd_, vd_, is_causal=True, enable_gqa=True)  # noqa: E731
            print(f"  sdpa {tf(graph_ms(f, 10, 40) * 1e3):.0f} TF/s", flush=True)
        kinds = [k_ for k_ in args.kinds.split(",") if k_ == "ptr" or TensorDescriptor is not None]
        best = {}
        for kind, bm, bn, warps, stages in itertools.product(kinds, (128,), (64, 128), (4, 8), (2, 3)):
            out = torch.empty_like(q)
            try:
                f = fa(kind, q, k, v, out, B, L, Hq, Hkv, D, bm, bn, warps, stages)
                f()
                err = rel_err(out, ref)
                t = graph_ms(f, 10, 40) * 1e3
            except Exception as exc:  # noqa: BLE001
                print(f"  {kind} {bm}x{bn} w{warps} s{stages}: {type(exc).__name__} {str(exc)[:100]}")
                continue
            print(f"  {kind} {bm}x{bn} w{warps} s{stages}: {tf(t):.0f} TF/s err {err:.1e}", flush=True)
            if err < 2e-2 and (kind not in best or tf(t) > best[kind][0]):
                best[kind] = (tf(t), f"{bm}x{bn} w{warps} s{stages}")
        print(f"  best: " + "; ".join(f"{k} {v[0]:.0f} TF/s ({v[1]})" for k, v in best.items()), flush=True)


if __name__ == "__main__":
    main()
