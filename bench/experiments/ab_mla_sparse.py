"""Sparse MLA A/B of whole package trees (same process, CUDA graphs, both ways round):
``flash_mla_sparse_fwd`` and ``flash_mla_with_kvcache`` on mla_sparse_sweep.py's cases, each tree
with its own kernels and config files.

    python bench/experiments/ab_mla_sparse.py OLD_TREE/ . [--cases decode16,v4b8,...]
    # OLD_TREE: git archive REV triton_xpu_attn autotune_configs | tar -x -C OLD_TREE

Prints each tree's time over the first's per case (< 1 faster) with the largest output difference,
and the geometric mean; exits 1 naming every case where a tree is slower than ``SLOWER`` (1.03x).
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import triton_xpu_attn  # noqa: E402,F401  (first: selects the interpreter on a CPU machine)

import torch  # noqa: E402

from ab_prefill import alternated_best_us, load_copy  # noqa: E402
from bench.common import capture_graph  # noqa: E402
from mla_sparse_sweep import CASES, build  # noqa: E402
from sweeps import SLOWER  # noqa: E402

ROUNDS = 4
DEFAULT = "decode16,decode16b128q2,decode16b32,decode128,decode128b8,v4b8,v4b32,v4b32q2,v4b128,prefill16l,prefill128"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--cases", default=DEFAULT)
    args = ap.parse_args()
    mods = [load_copy(p, i) for i, p in enumerate(args.trees)]
    names = [pathlib.Path(p).resolve().name for p in args.trees]
    dev = torch.device("cuda")
    ratios = [[] for _ in mods]
    slower = []
    for case in args.cases.split(","):
        kind, shape = CASES[case]
        runs = [build(kind, shape, dev, m)[1] for m in mods]
        outs = [r().float() for r in runs]
        graphs = [capture_graph(r) or r for r in runs]
        best = alternated_best_us(graphs, ROUNDS, 20)
        line = f"{case} {shape}: {names[0]} {best[0]:.1f} us"
        for i in range(1, len(mods)):
            ratios[i].append(best[i] / best[0])
            diff = (outs[i] - outs[0]).abs().max().item()
            line += f" | {names[i]} {best[i]:.1f} us {best[i] / best[0]:.3f}x (max|diff| {diff:.1e})"
            if best[i] / best[0] > SLOWER:
                slower.append(f"{case}: {names[i]} {best[i] / best[0]:.3f}x")
        print(line, flush=True)
        del runs, graphs, outs
        torch.cuda.empty_cache()
    for i in range(1, len(mods)):
        print(f"{names[i]}/{names[0]} geomean {math.exp(sum(map(math.log, ratios[i])) / len(ratios[i])):.3f}")
    for line in slower:
        print(f"SLOWER than {SLOWER}x: {line}")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
