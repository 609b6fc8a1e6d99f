"""Head dim 512 (Gemma 4's global layers) beside the peers, in one process on one GPU: decode and
causal prefill over a paged cache, ours vs FlashInfer (where its bundle holds head-dim-512
modules), sglang's Triton decode, vLLM's Triton kernels and, with ``--sdpa``, dense SDPA (any
backend: flash stops at 256). The checks and timing are the peers tool's own (its float32 references, CUDA-graph timing,
row format); the rows are built from its helpers, ours first and dense SDPA (unforced) last.

    PYTHONPATH=$PWD python3 bench/peers_wide_heads.py .peers [--flashinfer .peers/flashinfer512]
        [--vllm .peers/vllm] [--cases decode,prefill] [--head-dim 512] [--graphs] [--sdpa]

``.peers`` holds the peers harness's drivers (``*.py``; outside the repository: bench/README.md,
"Peers") and the unpacked sglang kernels (``.peers/sglang``).
Rows print as the peers tool prints them; commit the output under bench/results/<device>/.
"""
from __future__ import annotations

import argparse
import os
import sys


def decode_row(pb, peers, B, Hq, Hkv, D, L, page, splits=8, sdpa=False):
    """One decode row as ``peers_bench.gqa_case`` measures it, in another order: ours first, then
    FlashInfer, vLLM, sglang, and dense SDPA only when asked (``--sdpa``), last. At D = 512 SDPA
    runs its math kernel (no flash kernel that wide) for seconds, and after it an H200 read up to
    12% slower for several seconds (ours 2244 vs 1997 us at B = 64, 8k keys, one process), which
    charged SDPA's heat to whatever ran next. sglang is skipped past 2^31 cache elements (its
    int32 offsets read out of bounds)."""
    import math
    import torch
    sgl, vll, fi = peers
    num_pages, table, slots = pb.paged_layout(B, L, page)
    k4 = torch.randn(num_pages, page, Hkv, D, device=pb.dev, dtype=pb.DTYPE)
    v4 = torch.randn(num_pages, page, Hkv, D, device=pb.dev, dtype=pb.DTYPE)
    k3, v3 = k4.view(-1, Hkv, D), v4.view(-1, Hkv, D)
    q = torch.randn(B, Hq, D, device=pb.dev, dtype=pb.DTYPE)
    scale = 1 / math.sqrt(D)
    K, V = k3[slots.long()], v3[slots.long()]
    ref = pb.gqa_reference(q, K, V)
    seqlens = torch.full((B,), L, device=pb.dev, dtype=torch.int32)
    row, memo = {}, {}
    row["ours"] = pb.measure(lambda: lambda: pb.ours.flash_attn_with_kvcache(
        q.view(B, 1, Hq, D), k4, v4, cache_seqlens=seqlens, page_table=table, softmax_scale=scale, causal=True),
        ref, lambda o: o.reshape(B, Hq, D))
    if fi is not None:
        (kf, vf), tf, pf = pb.peer_cache("flashinfer", page, (k4, v4), table, (K, V), memo)
        r = pb.best(*[pb.measure(lambda tc=tc: pb.flashinfer_peer.gqa_decode(fi, q, kf, vf, tf, seqlens, scale, tc), ref)
                      for tc in (True, False)])
        row["flashinfer"] = (*r[:2], f"P{pf} {r[2]}".strip())
    if vll is not None:
        (kv, vv), tv, pv = pb.peer_cache("vllm", page, (k4, v4), table, (K, V), memo)
        r = pb.measure(lambda: pb.vllm_loader.gqa_decode(vll, q, kv, vv, tv, seqlens, scale), ref)
        row["vllm"] = (*r[:2], f"P{pv} {r[2]}".strip())
    if B * L * Hkv * D < 2**31:
        def sglang():
            o = torch.empty_like(q)
            logits = torch.empty(B, Hq, splits, D, device=pb.dev, dtype=torch.float32)
            lse = torch.empty(B, Hq, splits, device=pb.dev, dtype=torch.float32)
            nsplit = torch.full((B,), splits, device=pb.dev, dtype=torch.int32)
            indptr = torch.arange(0, (B + 1) * L, L, device=pb.dev, dtype=torch.int32)
            indices = slots.reshape(-1).to(torch.int32)
            f = lambda: sgl.decode_attention_fwd(q, k3, v3, o, indptr, indices, logits, lse, nsplit, splits,  # noqa: E731
                                                 scale, 1.0, 1.0, page_size=page)
            return lambda: (f(), o)[1]
        row["sglang"] = pb.measure(sglang, ref)
    else:
        row["sglang"] = (float("nan"), "skipped: int32 offsets overflow past 2^31 elements", "")
    del memo
    if sdpa:
        qd, Kd, Vd = q[:, :, None], K.transpose(1, 2).contiguous(), V.transpose(1, 2).contiguous()
        del K, V
        row["sdpa_dense"] = pb.measure(
            lambda: lambda: torch.nn.functional.scaled_dot_product_attention(qd, Kd, Vd, enable_gqa=True), ref,
            lambda o: o[:, :, 0])
    return row, 2 * B * L * Hkv * D * q.element_size(), 4 * B * Hq * L * D


def prefill_rows(pb, peers, B, Hq, Hkv, D, q_len, L, pages, sdpa=False):
    """Causal prefill (q_len == L) or a chunk after L - q_len cached tokens, bottom-right aligned;
    the same logical K/V at every page size. Yields (page, row) as peers_bench.prefill_cases does,
    and with ``sdpa`` dense SDPA on whatever backend torch picks, timed last (full-prefill rows only:
    its causal mask is top-left aligned)."""
    import math
    import torch
    _, vll, fi = peers
    K = torch.randn(B, L, Hkv, D, device=pb.dev, dtype=pb.DTYPE)
    V = torch.randn(B, L, Hkv, D, device=pb.dev, dtype=pb.DTYPE)
    q = torch.randn(B * q_len, Hq, D, device=pb.dev, dtype=pb.DTYPE)
    scale = 1 / math.sqrt(D)
    ref = pb.prefill_reference(q, K, V, q_len, scale)
    seqlens = torch.full((B,), L, device=pb.dev, dtype=torch.int32)
    cu_q = torch.arange(0, B + 1, device=pb.dev, dtype=torch.int32) * q_len
    memo, done, rows = {}, {}, []
    for page in pages:
        memo.setdefault(page, pb.repage((K, V), page))
        (k4, v4), table = memo[page]
        row = {"ours": pb.measure(lambda: lambda: pb.ours.flash_attn_with_kvcache(
            q, k4, v4, cache_seqlens=seqlens, page_table=table, cu_seqlens_q=cu_q, max_seqlen_q=q_len,
            softmax_scale=scale, causal=True), ref)}
        if vll is not None:
            (kv, vv), tv, pv = pb.peer_cache("vllm", page, (k4, v4), table, (K, V), memo)
            if ("vllm", pv) not in done:
                done["vllm", pv] = pb.measure(
                    lambda: pb.vllm_loader.gqa_prefill(vll, q, kv, vv, tv, seqlens, cu_q, q_len, scale), ref)
            row["vllm"] = done["vllm", pv]
        if fi is not None:
            (kf, vf), tf, pf = pb.peer_cache("flashinfer", page, (k4, v4), table, (K, V), memo)
            if ("flashinfer", pf) not in done:
                done["flashinfer", pf] = pb.best(*[pb.measure(
                    lambda b=b: pb.flashinfer_peer.gqa_prefill(fi, q, kf, vf, tf, seqlens, cu_q, scale, b), ref)
                    for b in ("fa2", "fa3")])
            row["flashinfer"] = done["flashinfer", pf]
        rows.append((page, row))
    if sdpa and q_len == L:  # after every kernel of the case (see decode_row)
        qd, Kd, Vd = q.view(B, q_len, Hq, D).transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2)
        dense = pb.measure(lambda: lambda: torch.nn.functional.scaled_dot_product_attention(
            qd, Kd, Vd, is_causal=True, scale=scale, enable_gqa=True), ref,
            lambda o: o.transpose(1, 2).reshape(B * q_len, Hq, D))
        for _, row in rows:
            row["sdpa_dense"] = dense
    yield from rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("peers_dir", help="folder with the peers harness's *.py and sglang/ (the unpacked kernels)")
    ap.add_argument("--flashinfer", help="FlashInfer bundle (flashinfer_peer.py pack) with head-dim-512 modules")
    ap.add_argument("--vllm", help="folder from vllm_loader.py extract")
    ap.add_argument("--cases", default="decode,prefill")
    ap.add_argument("--head-dim", type=int, default=512)
    ap.add_argument("--graphs", action="store_true", help="time CUDA-graph replays")
    ap.add_argument("--sdpa", action="store_true", help="also dense SDPA (math at D > 256: slow, and it heats the GPU)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.peers_dir))
    import peers_bench as pb
    import torch
    import triton

    pb.GRAPHS = args.graphs
    torch.manual_seed(0)
    sgl = pb.sgl_loader.load(os.path.join(args.peers_dir, "sglang"))
    vll = pb.vllm_loader.load(args.vllm) if args.vllm else None
    fi = pb.flashinfer_peer.setup(args.flashinfer) if args.flashinfer else None
    peers = (sgl, vll, fi)
    bw = pb.copy_bandwidth()
    D = args.head_dim
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
          f"copy {bw:.0f} GB/s head dim {D}" + (" timing: CUDA graph replays" if args.graphs else ""), flush=True)
    ratios = {}

    def record(kind, row):
        if pb.ok(row.get("ours")):
            for peer in pb.PEERS[1:]:
                if pb.ok(row.get(peer)):
                    ratios.setdefault((kind, peer), []).append(row[peer][0] / row["ours"][0])

    if "decode" in args.cases:  # GQA 4 (32/8) and 8 (16/2) at Gemma-like shapes
        for B, Hq, Hkv, L in [(1, 32, 8, 8192), (16, 32, 8, 8192), (64, 32, 8, 8192), (64, 32, 8, 1024),
                              (64, 16, 2, 8192), (128, 16, 2, 1024)]:
            for page in (16, 64):
                row, byts, flops = decode_row(pb, peers, B, Hq, Hkv, D, L, page, sdpa=args.sdpa)
                print(pb.fmt(f"decode B={B} Hq={Hq} Hkv={Hkv} D={D} L={L} P={page}", row, byts, flops, bw), flush=True)
                record("decode", row)
    if "prefill" in args.cases:
        for B, Hq, Hkv, q_len, L in [(1, 32, 8, 8192, 8192), (4, 32, 8, 2048, 2048), (4, 32, 8, 1024, 8192)]:
            what = "prefill" if q_len == L else f"chunk q={q_len}"
            for page, row in prefill_rows(pb, peers, B, Hq, Hkv, D, q_len, L, (16, 64), sdpa=args.sdpa):
                print(pb.fmt(f"{what} B={B} Hq={Hq} Hkv={Hkv} D={D} L={L} P={page}", row, None,
                             pb.causal_flops(B, Hq, D, q_len, L), bw), flush=True)
                record("prefill", row)
    for (kind, peer), xs in sorted(ratios.items()):
        print(f"{kind}: ours/{peer} geomean {pb.geo(xs):.2f}x, min {min(xs):.2f}x, max {max(xs):.2f}x, n={len(xs)}")


if __name__ == "__main__":
    main()
