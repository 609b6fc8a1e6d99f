"""Copies of ops/mla.py (the MLA kernel family; ops/mla_decode.py before the split; each a lever, made with a textual edit of today's kernel) against
today's kernel on issue 22's compute-bound cells, the shipped tiles in both arms. Per cell and
variant: both captured in CUDA graphs, replays timed shipped, variant, variant, shipped (the faster
of each pair kept: the order effect of pair timing cancels), outputs compared. GPU only.

    python bench/experiments/mla_variants.py NAME=COPY.py [NAME=COPY.py ...]
"""
from __future__ import annotations

import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import triton_xpu_attn as ours  # noqa: E402  (first: selects the backend before triton loads)
import torch  # noqa: E402
import triton  # noqa: E402

from bench import bench_mla_decode as bench_mla  # noqa: E402
from bench.common import graph_ms, rel_err  # noqa: E402
from bench.experiments.sweeps import load_old_mla  # noqa: E402

#: (B, H, L, P): the H = 128 / 64 cells of issue 22 (descriptor tiles at P = 64) and one gather cell
GRID = [(64, 128, 4096, 64), (132, 128, 4096, 64), (64, 128, 1024, 64), (64, 64, 4096, 64), (64, 128, 4096, 1)]


def main(pairs: list[str]) -> None:
    variants = {}
    for pair in pairs:
        name, _, path = pair.partition("=")
        variants[name] = load_old_mla(path).flash_mla_decode
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    ratios = {name: [] for name in variants}
    for B, H, L, P in GRID:
        cache, q, table, _, lens = bench_mla.make_case(B, H, L, P, "cuda", torch.bfloat16)
        qn, qp = q[..., :512].contiguous(), q[..., 512:].contiguous()
        ws = torch.empty(max(ours.flash_mla_get_workspace_size(L, B, H, P, -1), 16), dtype=torch.uint8, device="cuda")
        flops = 2 * B * H * L * (576 + 512)

        def call(fn):
            return lambda: fn(qn, qp, cache, lens, table, ws, 576**-0.5, -1)

        shipped = call(ours.flash_mla_decode)
        base = shipped().clone()
        line = [f"B={B} H={H} L={L} P={P}"]
        for name, fn in variants.items():
            variant = call(fn)
            try:
                err = rel_err(variant(), base)
                t_s1, t_v1, t_v2, t_s2 = (graph_ms(f, 10, 50) * 1e3 for f in (shipped, variant, variant, shipped))
            except Exception as exc:  # noqa: BLE001  (a variant that does not compile is a result)
                line.append(f"{name}: {type(exc).__name__} {str(exc)[:80]}")
                continue
            t_s, t_v = min(t_s1, t_s2), min(t_v1, t_v2)
            ratios[name].append(t_s / t_v)
            line.append(f"shipped {flops / t_s / 1e6:.0f} TF/s | {name} {flops / t_v / 1e6:.0f} TF/s "
                        f"(err {err:.1e}) {name}/shipped {t_s / t_v:.3f}")
        print(" | ".join(line), flush=True)
    for name, rs in ratios.items():
        if rs:
            print(f"{name}: geomean {math.exp(sum(map(math.log, rs)) / len(rs)):.3f} min {min(rs):.3f} max {max(rs):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
