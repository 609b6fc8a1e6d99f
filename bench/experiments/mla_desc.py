"""MLA decode with the latent cache read through tensor descriptors (issue 22 lever "a 64-token page
is one contiguous 64 x 576 block: load K tiles through tensor descriptors"): an old copy of
ops/mla.py (today's kernel family; ops/mla_decode.py before the split) against this one with pointer loads (kv_desc off: the refactor
alone) and with descriptors (kv_desc on), the shipped tiles otherwise, on issue 22's grid. GPU only;
medians of CUDA-graph replays, TFLOP/s as bench_mla_decode counts them.

    python bench/experiments/mla_desc.py OLD_COPY_OF_mla.py
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import triton_xpu_attn as ours  # noqa: E402  (first: selects the backend before triton loads)
import torch  # noqa: E402

from bench import bench_mla_decode as bench_mla  # noqa: E402
from bench.common import graph_ms, rel_err  # noqa: E402
from bench.experiments.sweeps import load_old_mla  # noqa: E402
from triton_xpu_attn import tune  # noqa: E402


def main(old_path):
    old = load_old_mla(old_path)
    grid = [(64, 128, 4096, 64), (132, 128, 4096, 64), (64, 128, 1024, 64), (16, 128, 1024, 64), (64, 64, 4096, 64),
            (64, 32, 4096, 64), (64, 16, 4096, 64), (128, 16, 1024, 64), (1, 16, 4096, 64), (64, 128, 4096, 1)]
    print(torch.cuda.get_device_name(), torch.__version__)
    ratios = []
    for B, H, L, P in grid:
        cache, q, table, _, lens = bench_mla.make_case(B, H, L, P, "cuda", torch.bfloat16)
        qn, qp = q[..., :512].contiguous(), q[..., 512:].contiguous()
        ws = torch.empty(max(ours.flash_mla_get_workspace_size(L, B, H, P, -1), 16), dtype=torch.uint8, device="cuda")
        flops = 2 * B * H * L * (576 + 512)
        calls = {
            "old": lambda: old.flash_mla_decode(qn, qp, cache, lens, table, ws, 576**-0.5, -1),
            "new": lambda: ours.flash_mla_decode(qn, qp, cache, lens, table, ws, 576**-0.5, -1),
        }
        base = calls["old"]().clone()
        res = {}
        for name, fn in calls.items():
            for kv_desc in ((False, True) if name == "new" else (None,)):
                label = name if kv_desc is None else f"{name}{'+desc' if kv_desc else ''}"
                if kv_desc is None:
                    t = graph_ms(fn, 10, 50) * 1e3
                    err = 0.0
                else:
                    with _with_knob(kv_desc):
                        err = rel_err(fn(), base)
                        t = graph_ms(fn, 10, 50) * 1e3
                res[label] = (t, err)
        line = f"B={B} H={H} L={L} P={P}: " + " | ".join(
            f"{k} {flops / t / 1e6:.0f} TF/s ({t:.0f} us, err {e:.1e})" for k, (t, e) in res.items())
        line += f" | new/old {res['old'][0] / res['new'][0]:.3f} desc/old {res['old'][0] / res['new+desc'][0]:.3f}"
        ratios.append((res['old'][0] / res['new'][0], res['old'][0] / res['new+desc'][0]))
        print(line, flush=True)
    import math
    g = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    print(f"geomean new/old {g([a for a, _ in ratios]):.3f} (min {min(a for a, _ in ratios):.3f}); "
          f"desc/old {g([b for _, b in ratios]):.3f} (min {min(b for _, b in ratios):.3f}, max {max(b for _, b in ratios):.3f})")


class _with_knob:
    """Force ``kv_desc`` on top of the config the launcher would pick (file or heuristic): wraps
    tune.lookup for the mla_decode op."""

    def __init__(self, value):
        self.value = value

    def __enter__(self):
        self.orig = tune.lookup
        value = self.value

        def lookup(op, fields, heuristic, **kw):
            cfg = self.orig(op, fields, heuristic, **kw)
            return {**cfg, "kv_desc": value} if op == "mla_decode" else cfg
        tune.lookup = lookup

    def __exit__(self, *exc):
        tune.lookup = self.orig


if __name__ == "__main__":
    main(sys.argv[1])
