"""Vertical/slash sparse attention (MInference, sglang's dual-chunk path) beside dense causal attention.

Per case (B 1, H 32 query / 8 KV heads, D 128, bf16, causal, contexts 8k-128k):

* ``convert``: ``convert_vertical_slash_indexes`` from sglang-shaped lines (per head the top
  ``NNZ_V`` verticals, ascending, and ``NNZ_S`` slashes, descending, the diagonal included);
* ``sparse``: ``sparse_attn_func`` over those tables (64 x 64 blocks, as sglang);
* ``dense-table``: ``sparse_attn_func`` over tables that name every causal key (blocks only): the
  kernel at full density, checked against the dense peer (relative error above 0.02: WRONG);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` (FlashAttention
  backend on CUDA), the dense time the sparse path is meant to beat.

Times are eager medians (``triton.testing.do_bench``); density is the fraction of the causal
(query, key) pairs the sparse tables name (blocks counted whole, so an estimate).

usage:
  python bench/bench_vertical_slash.py [--quick] [--smoke] [--out DIR]

``--smoke`` (and any run without a GPU): one tiny case through the Triton interpreter.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import triton_xpu_attn as ours  # noqa: E402  (selects the interpreter on a machine without a GPU)

import torch  # noqa: E402

from bench import common  # noqa: E402

HEADS, KV_HEADS, D = 32, 8, 128


def _lines(ctx: int, nnz_v: int, nnz_s: int, device, gen):
    vertical = torch.stack([torch.randperm(ctx, generator=gen)[:nnz_v] for _ in range(HEADS)]).sort(-1)[0]
    slash = torch.stack([torch.randperm(ctx, generator=gen)[:nnz_s] for _ in range(HEADS)])
    slash[:, 0] = 0  # the diagonal
    slash = slash.sort(-1, descending=True)[0]
    return vertical[None].to(torch.int32).to(device), slash[None].to(torch.int32).to(device)


def _dense_tables(ctx: int, block: int, device):
    """Blocks naming every causal key of each row block (offsets 0, block, ...)."""
    rows = -(-ctx // block)
    nnz = rows
    counts = torch.arange(1, rows + 1, dtype=torch.int32).view(1, 1, rows).expand(1, HEADS, rows).contiguous()
    offsets = (torch.arange(nnz, dtype=torch.int32) * block).expand(1, HEADS, rows, nnz).contiguous()
    none = torch.zeros(1, HEADS, rows, dtype=torch.int32)
    return [t.to(device) for t in (counts, offsets, none, torch.zeros(1, HEADS, rows, 0, dtype=torch.int32))]


def _density(tables, ctx: int, block: int) -> float:
    bc, _, cc, _ = (t.long().cpu() for t in tables)
    rows = bc.shape[-1]
    named = (bc * block + cc).clamp(min=0).double()  # keys a row names (blocks counted whole)
    causal = torch.tensor([min((r + 1) * block, ctx) - r * block / 2 for r in range(rows)], dtype=torch.float64)
    return float((named.mean(1)[0] * block).sum() / (causal * block).sum())


def run(cases, out=None, quick=False):
    device = ours.device.default_device()
    gen = torch.Generator().manual_seed(0)
    rows_out = []
    for ctx, nnz_v, nnz_s, block in cases:
        q = torch.randn(1, ctx, HEADS, D, generator=gen).to(torch.bfloat16).to(device)
        k = torch.randn(1, ctx, KV_HEADS, D, generator=gen).to(torch.bfloat16).to(device)
        v = torch.randn(1, ctx, KV_HEADS, D, generator=gen).to(torch.bfloat16).to(device)
        lens = torch.tensor([ctx], dtype=torch.int32, device=device)
        vertical, slash = _lines(ctx, nnz_v, nnz_s, device, gen)
        convert = lambda: ours.convert_vertical_slash_indexes(lens, lens, vertical, slash, ctx, block, block)  # noqa: E731
        tables = convert()
        sparse = lambda: ours.sparse_attn_func(q, k, v, *tables, causal=True, block_size_M=block,  # noqa: E731
                                               block_size_N=block)
        dense_tables = _dense_tables(ctx, block, device)
        dense_sparse = lambda: ours.sparse_attn_func(q, k, v, *dense_tables, causal=True,  # noqa: E731
                                                     block_size_M=block, block_size_N=block)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        kt, vt = (x.repeat_interleave(HEADS // KV_HEADS, 1) for x in (kt, vt))
        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)  # noqa: E731
        err = common.rel_err(dense_sparse(), sdpa().transpose(1, 2))
        row = dict(ctx=ctx, nnz_v=nnz_v, nnz_s=nnz_s, block=block, named_per_causal=round(_density(tables, ctx, block), 4),
                   dense_table_err=f"{err:.1e}" + (" WRONG" if err > 0.02 else ""))
        for name, fn in (("convert", convert), ("sparse", sparse), ("dense-table", dense_sparse), ("sdpa", sdpa)):
            row[f"{name} ms"] = round(common.bench_ms(fn), 4)
        row["sdpa / sparse"] = round(row["sdpa ms"] / (row["sparse ms"] + row["convert ms"]), 2)
        rows_out.append(row)
        common.print_table(f"vertical/slash ctx {ctx}", [row])
        common.free_memory()
    if common.on_gpu():
        common.write_results("vertical_slash", rows_out, out=out, quick=quick,
                             title="vertical/slash sparse attention vs dense causal SDPA")
    return rows_out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two contexts")
    parser.add_argument("--smoke", action="store_true", help="one tiny case (the interpreter's run)")
    parser.add_argument("--out", default=None, help="results folder")
    args = parser.parse_args(argv)
    if args.smoke or not common.on_gpu():
        cases = [(96, 8, 4, 16)]
    elif args.quick:
        cases = [(8192, 1000, 600, 64), (32768, 1000, 600, 64)]
    else:
        cases = [(8192, 1000, 600, 64), (32768, 1000, 600, 64), (65536, 2000, 1200, 64), (131072, 2000, 1200, 64)]
    run(cases, out=args.out, quick=args.quick)


if __name__ == "__main__":
    main()
