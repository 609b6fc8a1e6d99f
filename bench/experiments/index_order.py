"""Sparse MLA: does the order of a token's index list matter? Times ``flash_mla_sparse_fwd`` and
``flash_mla_with_kvcache`` (CUDA graphs) on bench_mla_sparse.py's inputs with the lists as drawn
(random order; ``ours``), sorted ascending, grouped in 4-32 cache regions (``buckets``: on the host
beforehand, or ``op_buckets``: by the op, ``index_order.py``), the op's own choice (``ours_op``), the
sort itself, and vLLM's Triton kernel on the lists as drawn and sorted.

    python bench/experiments/index_order.py --peers .peers [--cases prefill16l,decode16b128,...]

Softmax attention does not depend on the order of the entries, so an op may reorder a list for
locality: sorted lists make every program walk the cache from low to high rows, and programs
running together then read nearby rows (shared L2 lines, DRAM pages).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
from unittest import mock

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import triton_xpu_attn as ours  # noqa: E402
from triton_xpu_attn.ops import index_order  # noqa: E402

import torch  # noqa: E402

from bench import common  # noqa: E402
from bench.bench_mla_sparse import (  # noqa: E402
    D_QK, D_V, D_V4, DTYPE, TOPK, V4_HEADS, V4_PAGE, V4_TOPK, V4_X_PAGE, V4_X_TOPK, distinct_indices, load_vllm,
    v4_cache,
)

CASES = {
    "prefill16l": ("prefill", (1024, 16, 131072)),
    "prefill16l8k": ("prefill", (8192, 16, 131072)),
    "prefill32l": ("prefill", (1024, 32, 131072)),
    "prefill16s": ("prefill", (1024, 16, 8192)),
    "prefill16m": ("prefill", (1024, 16, 65536)),
    "prefill16m32": ("prefill", (1024, 16, 32768)),
    "decode16b128": ("decode", (128, 1, 16)),
    "decode16b128q2": ("decode", (128, 2, 16)),
    "decode128b32": ("decode", (32, 1, 128)),
    "v4b32q2": ("v4", (32, 2)),
    "v4b128q2": ("v4", (128, 2)),
    "v4b32": ("v4", (32, 1)),
}


def sort_rows(idx):
    return torch.sort(idx, dim=-1).values


#: bucket orders timed beside the full sort (entries grouped by idx * n // s_kv, random within a group)
BUCKETS = (4, 8, 16, 32)


def bucket_order(idx, s_kv, n):
    pos = torch.argsort(torch.rand(idx.shape, device=idx.device), dim=-1)
    shuffled = torch.gather(idx, -1, pos)
    key = (shuffled.long() * n // s_kv) * idx.shape[-1] + torch.arange(idx.shape[-1], device=idx.device)
    return torch.gather(shuffled, -1, torch.sort(key, dim=-1).indices)


def build(kind, shape, dev, gen, vllm):
    """``{label: fn}`` for one case."""
    fns = {}
    if kind == "prefill":
        s_q, h, s_kv = shape
        q = torch.randn(s_q, h, D_QK, device=dev, generator=gen).to(DTYPE)
        kv = torch.randn(s_kv, 1, D_QK, device=dev, generator=gen).to(DTYPE)
        idx = torch.cat([distinct_indices(min(s_q, 256), TOPK, s_kv, dev, gen)] * -(-s_q // 256))[:s_q, None]
        srt = sort_rows(idx)
        scale = D_QK**-0.5

        def call(i, buckets=None):
            if buckets is None:  # the op's own choice
                return ours.flash_mla_sparse_fwd(q, kv, i, scale, D_V)[0]
            with mock.patch.object(index_order, "locality_buckets", lambda *args: buckets):
                return ours.flash_mla_sparse_fwd(q, kv, i, scale, D_V)[0]

        fns["ours"] = lambda: call(idx, 0)
        fns["ours_op"] = lambda: call(idx)
        fns["ours_sorted"] = lambda: call(srt, 0)
        fns["sort"] = lambda: sort_rows(idx)
        fns["ours_sort_inside"] = lambda: call(sort_rows(idx), 0)
        for nb in BUCKETS:
            fns[f"ours_buckets{nb}"] = (lambda b: lambda: call(b, 0))(bucket_order(idx, s_kv, nb))
            fns[f"ours_op_buckets{nb}"] = (lambda n: lambda: call(idx, n))(nb)
        if vllm is not None:
            fns["vllm"] = lambda: vllm(q, kv, idx, scale)[0]
            fns["vllm_sorted"] = lambda: vllm(q, kv, srt, scale)[0]
    elif kind == "decode":
        B, q_len, h = shape
        share, page = 16384, 64
        pool = B * share
        cache = torch.randn(-(-pool // page), page, 1, D_QK, device=dev, generator=gen).to(DTYPE)
        base = (torch.arange(B, device=dev) * share).repeat_interleave(q_len)
        idx = distinct_indices(B * q_len, TOPK, share, dev, gen, base)
        q = torch.randn(B, q_len, h, D_QK, device=dev, generator=gen).to(DTYPE)
        scale = D_QK**-0.5
        idx3, srt3 = idx.view(B, q_len, TOPK), sort_rows(idx).view(B, q_len, TOPK)
        call = lambda i: ours.flash_mla_with_kvcache(q, cache, None, None, D_V, None, None, scale, indices=i)[0]  # noqa: E731
        fns["ours"] = lambda: call(idx3)
        fns["ours_sorted"] = lambda: call(srt3)
        fns["sort"] = lambda: sort_rows(idx3)
        fns["ours_sort_inside"] = lambda: call(sort_rows(idx3))
        if vllm is not None:
            flat, qf = cache.view(-1, 1, D_QK), q.view(-1, h, D_QK)
            fns["vllm"] = lambda: vllm(qf, flat, idx[:, None], scale)[0]
            fns["vllm_sorted"] = lambda: vllm(qf, flat, sort_rows(idx)[:, None], scale)[0]
    else:
        B, q_len = shape
        T = B * q_len
        main_pool = max(4 * V4_PAGE, B * V4_PAGE)
        x_pool = max(4096, B * 4096)
        cache, _ = v4_cache(main_pool // V4_PAGE, V4_PAGE, dev, gen)
        x_cache, _ = v4_cache(x_pool // V4_X_PAGE, V4_X_PAGE, dev, gen)
        idx = distinct_indices(T, V4_TOPK, main_pool, dev, gen).view(B, q_len, -1)
        x_idx = distinct_indices(T, V4_X_TOPK, x_pool, dev, gen).view(B, q_len, -1)
        q = torch.randn(B, q_len, V4_HEADS, D_V4, device=dev, generator=gen).to(DTYPE)
        scale = D_V4**-0.5
        call = lambda i, x: ours.flash_mla_with_kvcache(  # noqa: E731
            q, cache, None, None, D_V4, None, None, scale, False, True, i, None, x_cache, x)[0]
        srt, x_srt = sort_rows(idx), sort_rows(x_idx)
        fns["ours"] = lambda: call(idx, x_idx)
        fns["ours_sorted"] = lambda: call(srt, x_srt)
        fns["sort"] = lambda: (sort_rows(idx), sort_rows(x_idx))
        fns["ours_sort_inside"] = lambda: call(sort_rows(idx), sort_rows(x_idx))
    return fns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers")
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    dev = torch.device("cuda")
    vllm = load_vllm(args.peers)
    print(common.header(), flush=True)
    for case in args.cases.split(","):
        kind, shape = CASES[case]
        gen = torch.Generator(device=dev).manual_seed(0)
        fns = build(kind, shape, dev, gen, vllm)
        ref = fns["ours"]().float()
        line = f"{case} {kind} {shape}:"
        times = {}
        for label, fn in fns.items():
            if label.startswith("ours_"):
                diff = (fn().float() - ref).abs().max().item()
                line += f" [{label} max|diff| {diff:.1e}]"
            times[label] = common.graph_ms(fn) * 1e3
            line += f" {label} {times[label]:.1f} us"
        if "vllm" in times:
            line += (f" | vllm/ours {times['vllm'] / times['ours']:.2f}x, vllm/ours_sort_inside "
                     f"{times['vllm'] / times['ours_sort_inside']:.2f}x")
        print(line, flush=True)
        del fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
