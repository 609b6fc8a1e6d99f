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

import triton_xpu_attn as tx  # noqa: E402

import torch  # noqa: E402

from bench import bench_mla_sparse as sparse  # noqa: E402


def profiled(fn):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def v4(B: int, q_len: int):
    dev, gen = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(0)
    h, T = sparse.V4_HEADS, B * q_len
    main_pool = max(4 * sparse.V4_PAGE, B * sparse.V4_PAGE)
    x_pool = max(4096, B * 4096)
    cache, _ = sparse.v4_cache(main_pool // sparse.V4_PAGE, sparse.V4_PAGE, dev, gen)
    x_cache, _ = sparse.v4_cache(x_pool // sparse.V4_X_PAGE, sparse.V4_X_PAGE, dev, gen)
    idx = sparse.distinct_indices(T, sparse.V4_TOPK, main_pool, dev, gen).view(B, q_len, -1)
    x_idx = sparse.distinct_indices(T, sparse.V4_X_TOPK, x_pool, dev, gen).view(B, q_len, -1)
    q = torch.randn(B, q_len, h, sparse.D_V4, device=dev, generator=gen).to(sparse.DTYPE)
    print(f"v4 B={B} q_len={q_len}", flush=True)
    profiled(lambda: tx.flash_mla_with_kvcache(q, cache, None, None, sparse.D_V4, None, None, sparse.D_V4**-0.5,
                                               False, True, idx, None, x_cache, x_idx))


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
