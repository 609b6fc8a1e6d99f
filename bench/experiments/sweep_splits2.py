# split-count sweep (graph-replay medians, do_bench like bench/): MLA and small-batch paged attention
import os, sys
sys.path.insert(0, os.getcwd())
import torch
from triton.testing import do_bench
import triton_xpu_attn as ours
from triton_xpu_attn.ops import mla_decode as mla
from triton_xpu_attn import device as dv
dev = "cuda"
cu = dv.compute_units(torch.device(dev))
print(torch.cuda.get_device_name(), "compute units", cu)

def graph_us(f):
    for _ in range(2): f()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s): f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): f()
    return do_bench(g.replay, warmup=10, rep=60, return_mode="median") * 1e3

print("MLA: B H L P | auto | us per splits")
for H in (16, 128):
    for B in (1, 16):
        for L in (1024, 4096, 16384):
            for P in (64, 1):
                n = L // P
                cache = torch.randn(B*n+1, P, 576, device=dev, dtype=torch.bfloat16)
                table = torch.randperm(B*n+1, device=dev)[:B*n].view(B, n).int()
                qn = torch.randn(B, H, 512, device=dev, dtype=torch.bfloat16); qp = torch.randn(B, H, 64, device=dev, dtype=torch.bfloat16)
                sl = torch.full((B,), L, device=dev, dtype=torch.int32)
                auto = mla._auto_splits(B, H, L, cu)
                cands = sorted({max(1, auto // 4), max(1, auto // 2), auto, min(auto * 2, 128), 1})
                res = {}
                for s in cands:
                    ws = torch.empty(max(ours.flash_mla_get_workspace_size(L, B, H, P, s), 16), dtype=torch.uint8, device=dev)
                    res[s] = graph_us(lambda: ours.flash_mla_decode(qn, qp, cache, sl, table, ws, 576**-0.5, s))
                best = min(res, key=res.get)
                print(f"MLA {B} {H} {L} {P} | auto={auto} {res[auto]:.1f} | best={best} {res[best]:.1f} ({res[auto]/res[best]:.3f}x) | " + " ".join(f"{s}:{t:.1f}" for s, t in res.items()), flush=True)
                del cache
print("PA: Hq/Hkv/D B L P | auto | us per num_splits")
for (Hq, Hkv, D) in [(32, 8, 128), (8, 1, 128), (32, 8, 64)]:
    for B in (1, 16):
        for L in (1024, 8192, 32768):
            P = 64
            n = L // P
            k = torch.randn(B*n+1, P, Hkv, D, device=dev, dtype=torch.bfloat16); v = torch.randn_like(k)
            table = torch.randperm(B*n+1, device=dev)[:B*n].view(B, n).int()
            q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16)
            sl = torch.full((B,), L, device=dev, dtype=torch.int32)
            res = {}
            from triton_xpu_attn import tune
            with tune.override("paged_attention", {}):
                heur = graph_us(lambda: ours.flash_attn_with_kvcache(q, k, v, cache_seqlens=sl, page_table=table, causal=True))
            for s in (0, 4, 8, 16, 32, 64, 128):
                res[s] = graph_us(lambda: ours.flash_attn_with_kvcache(q, k, v, cache_seqlens=sl, page_table=table, causal=True, num_splits=s))
            best = min(res, key=res.get)
            print(f"PA {Hq}/{Hkv}/{D} {B} {L} {P} | heur {heur:.1f} | auto {res[0]:.1f} | best={best} {res[best]:.1f} ({res[0]/res[best]:.3f}x) | " + " ".join(f"{s}:{t:.1f}" for s, t in res.items()), flush=True)
            del k, v
