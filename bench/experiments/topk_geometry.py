"""Top-k two-kernel path on many rows: ``fast_topk_v2`` (CUDA graph) across the many-row geometry
of ``topk_select`` (``MANY_ROWS_*``: warps of the candidates and select programs, the positions a
compaction step reads, and from how many rows per unit it applies; 10**9 = never, the per-row
geometry of few rows), on prefill-style rows (``row_starts``) and decode-style rows.

    python bench/experiments/topk_geometry.py [rows,width;...]

Each setting's selection is checked equal to the first's (exact selection: same output).
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import triton_xpu_attn as tx  # noqa: E402

import torch  # noqa: E402

from bench.bench_dsa_topk import TOPK  # noqa: E402
from bench.common import bench_ms, capture_graph  # noqa: E402
from triton_xpu_attn.ops import topk_select as ts  # noqa: E402

CASES = [(1024, 17408), (4096, 20480), (4096, 65536), (8192, 65536), (256, 16384), (256, 65536), (132, 131072)]
# (MANY_ROWS_TWO_KERNEL, MANY_ROWS_CANDIDATE_WARPS, MANY_ROWS_SELECT_WARPS, MANY_ROWS_BLOCK)
SETTINGS = [(1, 8, 4, 1024), (10**9, 8, 4, 1024), (1, 8, 8, 1024), (1, 8, 4, 512), (1, 8, 4, 2048), (1, 4, 4, 1024),
            (1, 4, 4, 512), (1, 16, 4, 1024)]
NAMES = ("MANY_ROWS_TWO_KERNEL", "MANY_ROWS_CANDIDATE_WARPS", "MANY_ROWS_SELECT_WARPS", "MANY_ROWS_BLOCK")


def main() -> int:
    cases = CASES
    if len(sys.argv) > 1:
        cases = [tuple(int(x) for x in c.split(",")) for c in sys.argv[1].split(";")]
    dev = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name()} | torch {torch.__version__} | topk {TOPK} | "
          f"CAPACITY {ts.CAPACITY} GROUPS {ts.GROUPS} STREAM_BLOCK {ts.STREAM_BLOCK}")
    saved = {n: getattr(ts, n) for n in NAMES}
    for rows, width in cases:
        gen = torch.Generator().manual_seed(0)
        score = torch.randn(rows, width, generator=gen).to(dev)
        lengths = torch.randint(width - width // 8, width + 1, (rows,), generator=gen, dtype=torch.int32).to(dev)
        starts = torch.zeros(rows, dtype=torch.int32, device=dev)
        want, base = None, None
        line = []
        for setting in SETTINGS:
            for n, v in zip(NAMES, setting):
                setattr(ts, n, v)
            fn = lambda s=score, n=lengths, r=starts: tx.fast_topk_v2(s, n, TOPK, r)  # noqa: E731
            got = fn().sort(dim=-1).values
            if want is None:
                want = got
            elif not torch.equal(got, want):
                print(f"MISMATCH {setting} rows={rows} width={width}")
                return 2
            us = bench_ms(capture_graph(fn)) * 1e3
            base = base or us
            line.append(f"{'/'.join(str(x) if x < 10**9 else 'off' for x in setting)} {us:.1f}us {us / base:.3f}x")
        print(f"rows={rows} width={width}: " + " | ".join(line), flush=True)
        del score
        torch.cuda.empty_cache()
    for n, v in saved.items():
        setattr(ts, n, v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
