"""Decode time of whole package versions, each in its own process: for bisecting a regression
across commits whose kernels, launchers and configs all changed (``sweeps.py ab_paged`` swaps one
module inside today's package and cannot load a copy many commits old).

    # package trees: git archive REV triton_xpu_attn autotune_configs | tar -x -C trees/REV
    python3 bench/experiments/tree_timing.py [--cases 64/32/8/128/8192/16,64/64/8/128/8192/16/4,...] [--out DIR] TREE...
    # prefill as engines and the peers call it (ragged q [B * Q, Hq, D] with cu_seqlens_q):
    python3 bench/experiments/tree_timing.py --ragged --cases 4/32/8/64/4096/64/4096 TREE...
    # config candidates on one tree (tune.override, JSON per candidate):
    python3 bench/experiments/tree_timing.py --configs '{"num_warps": 2}' '{"BLOCK_N": 32}' -- TREE

Each tree runs in a child with only that tree on ``PYTHONPATH``: ``flash_attn_with_kvcache`` on
bench_paged_attention's case (random page permutation, full lengths, bf16), captured in a CUDA
graph, median of ``do_bench``. ``--ragged``: q given ragged ``[B * Q, Hq, D]`` with ``cu_seqlens_q``
and ``max_seqlen_q`` (the launcher's per-request query mapping; the default ``[B, Q, Hq, D]`` takes
the uniform one, a different kernel specialization). The children run in the order given, then once more in reverse
(the faster of the two kept per case; ``--once``: one pass), so drift does not read as a regression. With
``--out``, the PTX and the register / spill / shared-memory counts of every kernel a child compiled
are written there (``TREE/KERNEL.ptx``), to diff the code of two versions.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

CHILD = r"""
import json, os, sys
import torch
import triton_xpu_attn as tx
from triton.testing import do_bench

cases, forced, out_dir, ragged = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
dev = torch.device("cuda")
rows = {}
for text in cases:
    B, Hq, Hkv, D, L, P, q_len = ([int(x) for x in text.split("/")] + [1])[:7]
    g = torch.Generator(device=dev).manual_seed(0)
    n = L // P
    num_pages = B * n + 8
    table = torch.randperm(num_pages, device=dev, generator=g)[: B * n].view(B, n).to(torch.int32)
    k = torch.randn(num_pages, P, Hkv, D, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(num_pages, P, Hkv, D, device=dev, dtype=torch.bfloat16, generator=g)
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16, generator=g).expand(B, q_len, Hq, D).contiguous()
    lens = torch.full((B,), L, device=dev, dtype=torch.int32)
    extra = {}
    if ragged:
        q = q.view(B * q_len, Hq, D)
        extra = dict(cu_seqlens_q=torch.arange(B + 1, device=dev, dtype=torch.int32) * q_len, max_seqlen_q=q_len)
    run = lambda: tx.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, page_table=table,
                                             softmax_scale=D**-0.5, causal=True, **extra)
    for name, config in forced.items() or [("shipped", None)]:
        if config is not None:
            from triton_xpu_attn import tune
            ctx = tune.override("paged_attention", config)
        else:
            import contextlib
            ctx = contextlib.nullcontext()
        with ctx:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    run()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
        rows[f"{text} {name}"] = do_bench(graph.replay, warmup=25, rep=200, return_mode="median") * 1e3
# (bench/residency.py's _compiled_kernels does this for today's package; this child runs an old
# tree alone on the path, where the repository's bench package cannot be imported)
kernels = []
for mod in list(sys.modules.values()):
    if not getattr(mod, "__name__", "").startswith("triton_xpu_attn.ops"):
        continue
    for attr, fn in vars(mod).items():
        caches = getattr(fn, "device_caches", None)
        if not caches or not isinstance(caches, dict):
            continue
        for entry in caches.values():
            for i, compiled in enumerate(entry[0].values()):
                compiled._init_handles()
                label = f"{attr}.{i}"
                kernels.append(dict(kernel=label, regs=compiled.n_regs, spills=compiled.n_spills,
                                    shared=compiled.metadata.shared, warps=compiled.metadata.num_warps,
                                    stages=compiled.metadata.num_stages))
                if out_dir:
                    os.makedirs(out_dir, exist_ok=True)
                    with open(os.path.join(out_dir, label + ".ptx"), "w") as f:
                        f.write(compiled.asm["ptx"])
print("RESULT " + json.dumps(dict(rows=rows, kernels=kernels)))
"""


def run_tree(tree: str, cases: list[str], configs: dict, out: str | None, ragged: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(tree).resolve()))
    out_dir = os.path.join(out, pathlib.Path(tree).name) if out else ""
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases), json.dumps(configs), out_dir,
                           str(int(ragged))],
                          env=env, capture_output=True, text=True, cwd="/")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{tree}: no result\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="package trees (each holds triton_xpu_attn/)")
    parser.add_argument("--cases", default="64/32/8/128/8192/16,64/32/8/128/1024/16",
                        help="comma-separated B/Hq/Hkv/D/L/P[/Q] cases (Q: queries a request, default 1)")
    parser.add_argument("--configs", nargs="*", default=[], help="JSON configs forced with tune.override")
    parser.add_argument("--out", default=None, help="folder for each tree's PTX and kernel counts")
    parser.add_argument("--once", action="store_true", help="one pass (no reverse pass): a bisect of a large step")
    parser.add_argument("--ragged", action="store_true", help="q ragged with cu_seqlens_q (as engines call prefill)")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    configs = {c: json.loads(c) for c in args.configs}
    best: dict = {}
    for tree in args.trees + ([] if args.once else args.trees[::-1]):
        try:
            result = run_tree(tree, cases, configs, args.out, args.ragged)
        except RuntimeError as exc:
            print(str(exc)[:3000], flush=True)
            continue
        for row, us in result["rows"].items():
            key = (tree, row)
            best[key] = min(best.get(key, float("inf")), us)
        name = pathlib.Path(tree).name
        kernels = " ".join(f"{k['kernel']}:r{k['regs']}/s{k['spills']}/w{k['warps']}/st{k['stages']}"
                           for k in result["kernels"])
        print(f"{name}: " + "  ".join(f"{row} {us:.1f}us" for row, us in result["rows"].items()) + f"  [{kernels}]",
              flush=True)
    print("\n# faster of the two runs per tree (us)")
    rows = sorted({row for _, row in best})
    print("tree".ljust(16) + "".join(row.rjust(36) for row in rows))
    for tree in args.trees:
        print(pathlib.Path(tree).name.ljust(16) + "".join(f"{best.get((tree, row), float('nan')):36.1f}" for row in rows))


if __name__ == "__main__":
    main()
