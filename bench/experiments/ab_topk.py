"""Top-k A/B of package trees (same process, CUDA graphs, alternated rounds): ``fast_topk_v2`` and
``fast_topk_transform_fused`` on bench_dsa_topk's decode and prefill cases (DeepSeek-V3.2 indexer
rows, topk 2048).

    # package trees: git archive REV triton_xpu_attn autotune_configs | tar -x -C trees/REV
    python bench/experiments/ab_topk.py BASE_TREE OTHER_TREE [...]
    AB_ROUNDS=6 AB_CASES="1,1,65536;8,2,131072" python bench/experiments/ab_topk.py ...   # B,next_n,L
    AB_PREFILL="1024,16384;4096,16384" python bench/experiments/ab_topk.py ...           # rows,prefix

Prints each tree's median graph time (us) and its ratio to the first tree's (< 1 faster), every
result checked equal to the base tree's first (the selection is exact: same inputs, same output).
"""
from __future__ import annotations

import os
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import triton_xpu_attn  # noqa: E402,F401  (first: selects the interpreter on a CPU machine)

import torch  # noqa: E402

from ab_prefill import load_copy  # noqa: E402
from bench.bench_dsa_topk import TOPK, decode_case, prefill_case  # noqa: E402
from bench.common import bench_ms, capture_graph  # noqa: E402

ROUNDS = int(os.environ.get("AB_ROUNDS", 6))
CASES = [(1, 1, 4096), (1, 1, 16384), (1, 1, 65536), (1, 1, 131072), (1, 2, 65536), (1, 2, 131072),
         (8, 1, 65536), (8, 2, 65536), (32, 1, 16384), (64, 1, 65536), (128, 2, 16384), (128, 1, 131072)]


def calls(tx, case):
    return {
        "v2": lambda: tx.fast_topk_v2(case["score"], case["lengths"], TOPK, case["row_starts"]),
        "transform": lambda: tx.fast_topk_transform_fused(case["score"], case["lengths"], case["page_table"],
                                                          case["cu_seqlens_q"], TOPK, case["row_starts"]),
    }


def main() -> int:
    dev = torch.device("cuda")
    cases = [("decode", c) for c in CASES]
    if os.environ.get("AB_CASES") or os.environ.get("AB_PREFILL"):
        cases = [("decode", tuple(int(x) for x in c.split(","))) for c in os.environ.get("AB_CASES", "").split(";") if c]
        cases += [("prefill", tuple(int(x) for x in c.split(","))) for c in os.environ.get("AB_PREFILL", "").split(";")
                  if c]
    trees = sys.argv[1:]
    mods = [load_copy(p, i) for i, p in enumerate(trees)]
    labels = [pathlib.Path(p).resolve().name if p != "." else "main" for p in trees]
    print(f"device {torch.cuda.get_device_name()} | torch {torch.__version__} | trees {labels} | rounds {ROUNDS}")
    worst = 0.0
    for kind, shape in cases:
        gen = torch.Generator().manual_seed(0)
        case = decode_case(*shape, dev, gen) if kind == "decode" else prefill_case(*shape, dev, gen)
        for op in ("v2", "transform"):
            fns = [calls(m, case)[op] for m in mods]
            base = fns[0]().sort(dim=-1).values
            for i, fn in enumerate(fns[1:], 1):
                if not torch.equal(fn().sort(dim=-1).values, base):
                    print(f"MISMATCH {labels[i]} {op} {case['label']}")
                    return 2
            graphs = [capture_graph(fn) for fn in fns]
            times = [[] for _ in fns]
            for r in range(ROUNDS):
                order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
                for i in order:
                    times[i].append(bench_ms(graphs[i]) * 1e3)
            med = [statistics.median(t) for t in times]
            ratios = " ".join(f"{labels[i]} {med[i]:.2f}us {med[i] / med[0]:.3f}x" for i in range(len(fns)))
            print(f"{op:9s} {case['label']:24s} {ratios}")
            worst = max(worst, *(m / med[0] for m in med[1:]))
        del case
        torch.cuda.empty_cache()
    print(f"slowest ratio over the base: {worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
