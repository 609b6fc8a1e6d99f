"""One call of each DSA kernel under a profiler range, for Nsight Compute: the DeepSeek-V4 sparse
decode (packed fp8 cache, 64 heads, ``flash_mla_with_kvcache`` with indices and the extra cache) and
a many-row top-k (``fast_topk_v2``, the two-kernel path).

    ncu --profile-from-start off --set full -o OUT python bench/experiments/kernel_profile.py [v4 B q_len] [topk rows width]
    ncu -i OUT.ncu-rep --page details          # per kernel: throughput, occupancy, warp stalls
    ncu -i OUT.ncu-rep --page source --csv --print-source sass -k KERNEL   # stalls per instruction

Each op runs twice first (compile, warm caches); only the third call lies inside the range.
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import triton_xpu_attn as tx  # noqa: E402

import torch  # noqa: E402

from mla_sparse_sweep import build  # noqa: E402


def profiled(fn):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def v4(B: int, q_len: int):
    # mla_sparse_sweep's DeepSeek-V4 case (its caches, lists and call)
    _, fn = build("v4", dict(B=B, q_len=q_len), torch.device("cuda"))
    print(f"v4 B={B} q_len={q_len}", flush=True)
    profiled(fn)


def topk(rows: int, width: int):
    gen = torch.Generator().manual_seed(0)
    score = torch.randn(rows, width, generator=gen).cuda()
    lengths = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    print(f"topk rows={rows} width={width}", flush=True)
    profiled(lambda: tx.fast_topk_v2(score, lengths, 2048))


def main() -> int:
    args = sys.argv[1:] or ["v4", "32", "2", "topk", "1024", "17408"]
    while args:
        what, a, b, args = args[0], int(args[1]), int(args[2]), args[3:]
        (v4 if what == "v4" else topk)(a, b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
