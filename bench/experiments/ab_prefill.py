"""Prefill A/B of module copies of ops/paged_attention.py (same process, CUDA graphs, both ways
round): the peers' prefill shapes (GQA 32/8/128, bf16, causal, ragged q over a paged cache).

    python bench/experiments/ab_prefill.py BASE_COPY.py OTHER_COPY.py [OTHER_COPY.py ...]
    AB_ROUNDS=6 AB_REP_MS=30 AB_CASES="4,4096,4096,64;4,2048,8192,64" python ...   # more rounds, some cases

Prints each copy's time over the base's per case (> 1 slower). The copies import today's package
helpers (``_common``), so they must agree with it on the helpers' signatures.
"""
from __future__ import annotations

import math
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import triton_xpu_attn  # noqa: E402,F401  (first: selects the interpreter on a CPU machine)

import torch  # noqa: E402

from bench.common import bench_ms, capture_graph  # noqa: E402
from sweeps import load_old_op  # noqa: E402

ROUNDS = int(os.environ.get("AB_ROUNDS", 8))
REP_MS = int(os.environ.get("AB_REP_MS", 3))
CASES = [(1, 8192, 8192, 16), (4, 4096, 4096, 64), (4, 2048, 8192, 64), (4, 4096, 4096, 16), (2, 1024, 4096, 256)]


def make(B, S, L, P, dev="cuda"):
    torch.manual_seed(0)
    pages = B * (L // P)
    k = torch.randn(pages, P, 8, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    table = torch.randperm(pages, device=dev).view(B, -1).to(torch.int32)
    q = torch.randn(B * S, 32, 128, device=dev, dtype=torch.bfloat16)
    cu = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * S
    lens = torch.full((B,), L, device=dev, dtype=torch.int32)
    return dict(q=q, k_cache=k, v_cache=v, cache_seqlens=lens, page_table=table, cu_seqlens_q=cu, max_seqlen_q=S,
                causal=True)


def main() -> int:
    cases = CASES
    if os.environ.get("AB_CASES"):  # e.g. "4,4096,4096,64;4,2048,8192,64"
        cases = [tuple(int(x) for x in c.split(",")) for c in os.environ["AB_CASES"].split(";")]
    mods = [load_old_op(p, f"copy{i}") for i, p in enumerate(sys.argv[1:])]
    ratios = [[] for _ in mods]
    for B, S, L, P in cases:
        args = make(B, S, L, P)
        runs = [(lambda m=m: m.flash_attn_with_kvcache(**args)) for m in mods]
        outs = [r() for r in runs]
        graphs = [capture_graph(r) or r for r in runs]
        times = [[] for _ in mods]
        # many short alternations, the fastest of each kept: sustained prefill runs at the power
        # limit, so the clock drifts over seconds and a copy timed later would look slower
        for order in (list(range(len(mods))), list(reversed(range(len(mods))))) * ROUNDS:
            for i in order:
                times[i].append(bench_ms(graphs[i], warmup=2, rep=REP_MS) * 1e3)
        best = [min(t) for t in times]
        line = f"B={B} S={S} L={L} P={P}: base {best[0]:.1f} us"
        for i in range(1, len(mods)):
            ratios[i].append(best[i] / best[0])
            diff = (outs[i].float() - outs[0].float()).abs().max().item()
            line += f" | {pathlib.Path(sys.argv[1 + i]).stem} {best[i] / best[0]:.3f} (max|diff| {diff:.1e})"
        print(line, flush=True)
    for i in range(1, len(mods)):
        print(f"{pathlib.Path(sys.argv[1 + i]).stem}/base geomean "
              f"{math.exp(sum(map(math.log, ratios[i])) / len(ratios[i])):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
