# combine tiling sweep: graph-replay medians of combine_splits alone, per (BLOCK_DV cap, tile floats, warps)
import os, sys, itertools
sys.path.insert(0, os.getcwd())
import torch
from triton.testing import do_bench
from triton_xpu_attn.ops import merge_state as ms
dev = "cuda"
print(torch.cuda.get_device_name())

def graph_us(f):
    for _ in range(2): f()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s): f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): f()
    return do_bench(g.replay, warmup=10, rep=50, return_mode="median") * 1e3

shapes = [(1, 32, 4, 128), (1, 32, 32, 128), (1, 8, 64, 128), (16, 8, 32, 128), (1, 32, 64, 128),
          (1, 16, 8, 512), (1, 16, 32, 512), (1, 16, 64, 512), (1, 128, 16, 512), (1, 128, 32, 512), (1, 128, 64, 512),
          (16, 16, 16, 512), (64, 16, 4, 512), (16, 128, 4, 512), (128, 16, 2, 512)]
variants = list(itertools.product((64, 128, 512), (1024, 2048, 4096), (1, 2, 4)))
results = {}
for (n, h, s, dv) in shapes:
    po = torch.randn(n, h, s, dv, device=dev); pl = torch.randn(n, h, s, device=dev)
    out = torch.empty(n, h, dv, device=dev, dtype=torch.bfloat16); lse = torch.empty(n, h, device=dev)
    row = {}
    for (bdv, tile, w) in variants:
        if bdv > dv:
            continue
        ms.COMBINE_BLOCK_DV, ms.COMBINE_TILE, ms.COMBINE_WARPS = bdv, tile, w
        row[(bdv, tile, w)] = graph_us(lambda: ms.combine_splits(po, pl, out, lse))
    results[(n, h, s, dv)] = row
    best = min(row, key=row.get)
    old = row.get((dv, 4096, 4)) or row.get((128, 4096, 4))
    print(f"n={n} h={h} S={s} dv={dv}: old(dv,4096,4)={old:.2f} best={best} {row[best]:.2f}", flush=True)
# the best single setting over all shapes (geomean)
import math
geo = {}
for v in variants:
    vals = []
    for shp, row in results.items():
        key = v if v[0] <= shp[3] else (shp[3], v[1], v[2])
        vals.append(row[key])
    geo[v] = math.exp(sum(map(math.log, vals)) / len(vals))
for v, g in sorted(geo.items(), key=lambda kv: kv[1])[:8]:
    print("geomean", v, f"{g:.2f}", " ".join(f"{results[shp][v if v[0] <= shp[3] else (shp[3], v[1], v[2])]:.1f}" for shp in results))
print("old    ", " ".join(f"{(row.get((shp[3], 4096, 4)) or row.get((128, 4096, 4))):.1f}" for shp, row in results.items()))
