import os, sys, itertools
sys.path.insert(0, os.getcwd())
import torch
from triton.testing import do_bench
import triton_xpu_attn as ours
from triton_xpu_attn import tune
dev = "cuda"
print(torch.cuda.get_device_name())
def graph_us(f):
    for _ in range(2): f()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s): f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): f()
    return do_bench(g.replay, warmup=5, rep=30, return_mode="median") * 1e3
for (Hq, Hkv, D, B, L, P) in [(64, 8, 128, 64, 8192, 16), (32, 8, 128, 64, 8192, 16), (8, 1, 128, 64, 32768, 64), (64, 8, 128, 64, 8192, 64)]:
    n = L // P
    k = torch.randn(B*n+1, P, Hkv, D, device=dev, dtype=torch.bfloat16); v = torch.randn_like(k)
    table = torch.randperm(B*n+1, device=dev)[:B*n].view(B, n).int()
    sl = torch.full((B,), L, device=dev, dtype=torch.int32)
    res = {}
    for S in (1, 4):
        q = torch.randn(B, S, Hq, D, device=dev, dtype=torch.bfloat16)
        f = lambda: ours.flash_attn_with_kvcache(q, k, v, cache_seqlens=sl, page_table=table, causal=True)
        res[(S, "default")] = graph_us(f)
        for bn, w, st in itertools.product((32, 64, 128), (2, 4, 8), (1, 2, 3)):
            with tune.override("paged_attention", dict(BLOCK_N=bn, num_warps=w, num_stages=st)):
                try:
                    res[(S, (bn, w, st))] = graph_us(f)
                except Exception as e:
                    pass
    d1 = {c: t for (s, c), t in res.items() if s == 1}; d4 = {c: t for (s, c), t in res.items() if s == 4}
    b1 = min(d1, key=d1.get); b4 = min(d4, key=d4.get)
    print(f"{Hq}/{Hkv}/{D} B={B} L={L} P={P}: decode default {d1['default']:.1f} best {b1} {d1[b1]:.1f} | q4 default {d4['default']:.1f} best {b4} {d4[b4]:.1f} (q4 at decode-best {d4.get(b1, float('nan')):.1f})")
    print("   q4 top5:", sorted(((round(t, 1), c) for c, t in d4.items()))[:5])
    print("   d1 top5:", sorted(((round(t, 1), c) for c, t in d1.items()))[:5])
    del k, v
