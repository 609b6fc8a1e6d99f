"""Where a DSA top-k call spends its time: each kernel of ``fast_topk_v2`` /
``fast_topk_transform_fused`` on bench_dsa_topk's decode rows, from torch.profiler's CUDA
activity (median over the calls), beside the whole call replayed from a CUDA graph.

    python bench/experiments/topk_profile.py [B,next_n,L;...]
"""
from __future__ import annotations

import collections
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import triton_xpu_attn as tx  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench.bench_dsa_topk import TOPK, decode_case  # noqa: E402
from bench.common import bench_ms, capture_graph  # noqa: E402

CASES = [(1, 1, 4096), (1, 1, 16384), (1, 1, 65536), (1, 1, 131072), (8, 1, 65536), (1, 2, 131072), (64, 1, 65536)]


def main() -> int:
    cases = CASES
    if len(sys.argv) > 1:
        cases = [tuple(int(x) for x in c.split(",")) for c in sys.argv[1].split(";")]
    dev = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name()} | torch {torch.__version__}")
    for B, next_n, L in cases:
        case = decode_case(B, next_n, L, dev, torch.Generator().manual_seed(0))
        for op, fn in (("v2", lambda: tx.fast_topk_v2(case["score"], case["lengths"], TOPK)),
                       ("transform", lambda: tx.fast_topk_transform_fused(case["score"], case["lengths"],
                                                                         case["page_table"], case["cu_seqlens_q"],
                                                                         TOPK))):
            graph = capture_graph(fn)
            total = bench_ms(graph) * 1e3
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            times = collections.defaultdict(list)
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    times[ev.name[:60]].append(ev.device_time)
            parts = " | ".join(f"{name} {statistics.median(t):.1f}us x{len(t) // 20}" for name, t in times.items())
            kernel_sum = sum(statistics.median(t) * (len(t) // 20) for t in times.values())
            print(f"{op:9s} B={B} next_n={next_n} L={L}: graph {total:.1f}us, kernels {kernel_sum:.1f}us: {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
