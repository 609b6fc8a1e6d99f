# How much of a small decode call is the split combine? graph-replay medians (do_bench, like bench/)
import os, sys
sys.path.insert(0, os.getcwd())
import torch
from triton.testing import do_bench
import triton_xpu_attn as ours
from triton_xpu_attn.ops import paged_attention as pa, mla_decode as mla

def graph(f):
    for _ in range(3): f()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s): f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): f()
    return do_bench(g.replay, warmup=25, rep=200, return_mode="median") * 1e3

real_pa, real_mla = pa.combine_splits, mla.combine_splits
noop = lambda *a, **k: None
dev = "cuda"
print("case full_us attn_only_us combine_us(gap incl)")
for (B, Hq, Hkv, D, L, P) in [(1, 32, 8, 128, 1024, 64), (1, 32, 8, 128, 8192, 64), (1, 8, 1, 128, 8192, 64),
                              (1, 32, 8, 64, 8192, 64), (16, 8, 1, 128, 8192, 64), (16, 32, 8, 128, 1024, 64), (64, 32, 8, 128, 8192, 64)]:
    n = L // P
    k = torch.randn(B*n+1, P, Hkv, D, device=dev, dtype=torch.bfloat16); v = torch.randn_like(k)
    table = torch.randperm(B*n+1, device=dev)[:B*n].view(B, n).int()
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16)
    sl = torch.full((B,), L, device=dev, dtype=torch.int32)
    f = lambda: ours.flash_attn_with_kvcache(q, k, v, cache_seqlens=sl, page_table=table, causal=True)
    pa.combine_splits = real_pa; full = graph(f)
    pa.combine_splits = noop; attn = graph(f)
    pa.combine_splits = real_pa
    print(f"PA B={B} {Hq}/{Hkv}/{D} L={L} P={P}: {full:.1f} {attn:.1f} {full-attn:.1f}")
for (B, H, L, P) in [(1, 16, 1024, 64), (1, 16, 4096, 64), (1, 128, 4096, 64), (16, 16, 4096, 64), (1, 16, 4096, 1)]:
    n = L // P
    cache = torch.randn(B*n+1, P, 576, device=dev, dtype=torch.bfloat16)
    table = torch.randperm(B*n+1, device=dev)[:B*n].view(B, n).int()
    qn = torch.randn(B, H, 512, device=dev, dtype=torch.bfloat16); qp = torch.randn(B, H, 64, device=dev, dtype=torch.bfloat16)
    sl = torch.full((B,), L, device=dev, dtype=torch.int32)
    ws = torch.empty(ours.flash_mla_get_workspace_size(L, B, H, P, -1), dtype=torch.uint8, device=dev)
    f = lambda: ours.flash_mla_decode(qn, qp, cache, sl, table, ws, 576**-0.5, -1)
    mla.combine_splits = real_mla; full = graph(f)
    mla.combine_splits = noop; attn = graph(f)
    mla.combine_splits = real_mla
    print(f"MLA B={B} H={H} L={L} P={P}: {full:.1f} {attn:.1f} {full-attn:.1f}")
