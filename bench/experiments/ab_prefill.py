"""Prefill A/B of module copies of ops/paged_attention.py (same process, CUDA graphs, both ways
round) over the peers' prefill grid (the peers harness's ``peers_bench.py --cases prefill``: full prefill
(B, L) = (1, 8k), (4, 4k), (16, 1k) at 32/8/128, (4, 4k) at 32/8/64 and 64/8/128; chunked B = 4
q_len 2k of 8k keys and B = 8 q_len 512 of 4k at 32/8/128; each at pages of 16 and 64 tokens; bf16,
causal, ragged q over a randomly permuted paged cache). The prefill guard beside sweeps.py ab_paged.

    python bench/experiments/ab_prefill.py BASE_COPY.py OTHER_COPY.py [OTHER_COPY.py ...]
    python bench/experiments/ab_prefill.py OLD_TREE/ . # whole package trees (git archive REV triton_xpu_attn
                                                       # autotune_configs), each imported under its own name
    AB_ROUNDS=6 AB_REP_MS=30 AB_CASES="4,32,8,64,4096,4096,64;4,32,8,128,2048,8192,64" python ...
    # AB_CASES: B,Hq,Hkv,D,q_len,L,P cases instead of the grid
    AB_UNIFORM=1 AB_CASES="64,32,8,128,1,8192,16" python ...                      # decode: q [B, 1, Hq, D]

Prints each copy's time over the base's per case (> 1 slower) and exits 1 naming every case where a
copy is slower than ``SLOWER`` (1.03x). A module copy imports today's package helpers (``_common``),
so it must agree with them on the helpers' signatures; a package tree (a folder holding
``triton_xpu_attn/``) brings its own, so any two commits compare in one process, their kernels
alternated (tree_timing.py times trees in processes of their own, where the clock state of each
process moves prefill times by 1-4%).
"""
from __future__ import annotations

import importlib.util
import math
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import triton_xpu_attn  # noqa: E402,F401  (first: selects the interpreter on a CPU machine)

import torch  # noqa: E402

from bench.common import bench_ms, capture_graph  # noqa: E402
from sweeps import SLOWER, load_old_op  # noqa: E402

ROUNDS = int(os.environ.get("AB_ROUNDS", 8))
REP_MS = int(os.environ.get("AB_REP_MS", 3))
#: AB_UNIFORM=1: q as [B, q_len, Hq, D] (decode's uniform mapping) instead of ragged with cu_seqlens_q
UNIFORM = os.environ.get("AB_UNIFORM", "0") == "1"
# (B, Hq, Hkv, D, q_len, L, P): the peers' prefill grid
CASES = [(B, Hq, Hkv, D, S, L, P)
         for B, Hq, Hkv, D, S, L in [(1, 32, 8, 128, 8192, 8192), (4, 32, 8, 128, 4096, 4096),
                                     (16, 32, 8, 128, 1024, 1024), (4, 32, 8, 64, 4096, 4096),
                                     (4, 64, 8, 128, 4096, 4096), (4, 32, 8, 128, 2048, 8192),
                                     (8, 32, 8, 128, 512, 4096)]
         for P in (16, 64)]


def make(B, Hq, Hkv, D, S, L, P, dev="cuda"):
    torch.manual_seed(0)
    pages = B * (L // P)
    k = torch.randn(pages, P, Hkv, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    table = torch.randperm(pages, device=dev).view(B, -1).to(torch.int32)
    q = torch.randn(B * S, Hq, D, device=dev, dtype=torch.bfloat16)
    cu = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * S
    lens = torch.full((B,), L, device=dev, dtype=torch.int32)
    if UNIFORM:  # q [B, S, Hq, D]: the uniform query mapping decode takes (no cu_seqlens_q)
        return dict(q=q.view(B, S, Hq, D), k_cache=k, v_cache=v, cache_seqlens=lens, page_table=table, causal=True)
    return dict(q=q, k_cache=k, v_cache=v, cache_seqlens=lens, page_table=table, cu_seqlens_q=cu, max_seqlen_q=S,
                causal=True)


def load_copy(path: str, index: int):
    """A module copy of ops/paged_attention.py, or a package tree's ``triton_xpu_attn`` imported as
    ``_ab_tree<index>`` (its relative imports resolve inside it)."""
    tree = pathlib.Path(path) / "triton_xpu_attn"
    if not tree.is_dir():
        return load_old_op(path, f"copy{index}")
    name = f"_ab_tree{index}"
    spec = importlib.util.spec_from_file_location(name, tree / "__init__.py", submodule_search_locations=[str(tree)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def alternated_best_us(graphs, rounds: int, rep_ms: int) -> list:
    """Each callable's fastest time (us) over ``rounds`` alternations in both orders: sustained
    runs sit at the power limit, so the clock drifts over seconds and a copy timed later would
    look slower; many short alternations with the fastest kept cancel that."""
    times = [[] for _ in graphs]
    for order in (list(range(len(graphs))), list(reversed(range(len(graphs))))) * rounds:
        for i in order:
            times[i].append(bench_ms(graphs[i], warmup=2, rep=rep_ms) * 1e3)
    return [min(t) for t in times]


def main() -> int:
    cases = CASES
    if os.environ.get("AB_CASES"):  # e.g. "4,32,8,64,4096,4096,64;4,32,8,128,2048,8192,64"
        cases = [tuple(int(x) for x in c.split(",")) for c in os.environ["AB_CASES"].split(";")]
    mods = [load_copy(p, i) for i, p in enumerate(sys.argv[1:])]
    ratios = [[] for _ in mods]
    slower = []
    for B, Hq, Hkv, D, S, L, P in cases:
        args = make(B, Hq, Hkv, D, S, L, P)
        runs = [(lambda m=m: m.flash_attn_with_kvcache(**args)) for m in mods]
        outs = [r() for r in runs]
        graphs = [capture_graph(r) or r for r in runs]
        best = alternated_best_us(graphs, ROUNDS, REP_MS)
        name = f"{Hq}/{Hkv}/{D} B={B} S={S} L={L} P={P}"
        line = f"{name}: base {best[0]:.1f} us"
        for i in range(1, len(mods)):
            ratios[i].append(best[i] / best[0])
            if best[i] / best[0] > SLOWER:
                slower.append(f"{name}: {pathlib.Path(sys.argv[1 + i]).resolve().stem} {best[i] / best[0]:.3f}x the base")
            diff = (outs[i].float() - outs[0].float()).abs().max().item()
            line += f" | {pathlib.Path(sys.argv[1 + i]).resolve().stem} {best[i] / best[0]:.3f} (max|diff| {diff:.1e})"
        print(line, flush=True)
    for i in range(1, len(mods)):
        print(f"{pathlib.Path(sys.argv[1 + i]).resolve().stem}/base geomean "
              f"{math.exp(sum(map(math.log, ratios[i])) / len(ratios[i])):.3f}")
    for line in slower:
        print(f"SLOWER than {SLOWER}x: {line}")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
