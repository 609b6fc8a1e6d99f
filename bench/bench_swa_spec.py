"""Benchmark: prepare_swa_spec_page_table (Triton, translation fused) vs the torch-indexing reference.

    python bench/bench_swa_spec.py [--quick] [--out DIR]

Shapes follow EAGLE tree verification (topk > 1): ``rows = B * ndt`` destination rows, prefix
table width ``len_a`` (the batch's max KV length), expand table width ``ndt``, destination width
``len_a + ndt``. Prefix lengths are drawn in ``[len_a / 2, len_a]``, visible drafts in ``[1, ndt]``.
Times are medians of ``triton.testing.do_bench`` (on a GPU) or of wall-clock repeats (``--quick``
under the CPU interpreter, a smoke test only). The reference (``triton_xpu_attn.reference``) runs
on the same device and allocates its result; the kernel writes in place.
``GB/s`` counts the kernel's useful traffic: produced slots written + read (+ 8 B of mapping each).
Prints a markdown table and writes ``swa_spec.csv`` / ``.md`` / ``.json`` to ``--out/<device_key>/``
(default bench/results/; quick runs in quick/).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton_xpu_attn  # noqa: E402,F401  (selects the interpreter on a CPU-only machine)
from triton_xpu_attn import device as tdevice  # noqa: E402
from triton_xpu_attn import prepare_swa_spec_page_table  # noqa: E402
from triton_xpu_attn import reference as ref  # noqa: E402

import torch  # noqa: E402

from bench import common  # noqa: E402

NDT = 8
FULL_POOL = 1 << 22  # full-pool slots; the mapping has FULL_POOL + 1 entries


def _time_ms(fn, quick: bool) -> float:
    """Median milliseconds: do_bench on a GPU, wall-clock repeats under the interpreter."""
    return common.bench_ms(fn, warmup=25, rep=100, repeats=2 if quick else 5)


def _case(rows: int, len_a: int, mapped: bool, device, gen):
    batch = rows // NDT
    table_a = torch.randint(1, FULL_POOL, (batch, len_a), generator=gen, dtype=torch.int32)
    table_b = torch.randint(1, FULL_POOL, (rows, NDT), generator=gen, dtype=torch.int32)
    seq_len_a = torch.randint(len_a // 2, len_a + 1, (batch,), generator=gen, dtype=torch.int32)
    seq_len_b = torch.randint(1, NDT + 1, (rows,), generator=gen, dtype=torch.int32)
    full_to_swa = None
    if mapped:
        full_to_swa = torch.randint(0, FULL_POOL // 4, (FULL_POOL + 1,), generator=gen, dtype=torch.int64)
        full_to_swa[-1] = -1
    dst = torch.zeros(rows, len_a + NDT, dtype=torch.int32)
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    return [move(t) for t in (dst, table_a, table_b, seq_len_a, seq_len_b, full_to_swa)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU interpreter smoke test)")
    parser.add_argument("--out", default=str(common.RESULTS_DIR), help="results folder (a <device_key>/ folder is made in it)")
    args = parser.parse_args(argv)

    device = tdevice.default_device()
    if args.quick:
        rows_list, widths = [8], [256, 1024]
    else:
        rows_list, widths = [64, 256, 1024], [1024, 4096, 32768]
    gen = torch.Generator().manual_seed(0)
    results = []
    for rows in rows_list:
        for len_a in widths:
            for mapped in (False, True):
                dst, a, b, la, lb, mapping = _case(rows, len_a, mapped, device, gen)
                kernel = lambda: prepare_swa_spec_page_table(dst, a, b, la, lb, NDT, full_to_swa=mapping)  # noqa: E731
                torch_ref = lambda: ref.prepare_swa_spec_page_table(dst, a, b, la, lb, NDT, full_to_swa=mapping)  # noqa: E731
                expected = torch_ref()
                if not torch.equal(kernel(), expected):
                    raise AssertionError(f"mismatch at rows={rows} len_a={len_a} mapped={mapped}")
                t_kernel = _time_ms(kernel, args.quick)
                t_ref = _time_ms(torch_ref, args.quick)
                produced = int((la.long().repeat_interleave(NDT) + lb.long()).sum())
                nbytes = produced * (4 + 4 + (8 if mapped else 0))
                results.append(
                    dict(
                        rows=rows, ndt=NDT, len_a=len_a, dst_width=len_a + NDT, mapped=mapped,
                        triton_us=round(t_kernel * 1e3, 2), torch_us=round(t_ref * 1e3, 2),
                        speedup=round(t_ref / t_kernel, 2), triton_gbps=round(nbytes / (t_kernel * 1e-3) / 1e9, 1),
                        time_us=round(t_kernel * 1e3, 2), bytes=nbytes, flops=0,
                    )
                )
                del dst, a, b, la, lb, mapping, expected

    backend = tdevice.backend()
    name = {"cuda": lambda: torch.cuda.get_device_name(), "xpu": lambda: torch.xpu.get_device_name()}.get(backend, lambda: backend)()
    common.print_table(f"prepare_swa_spec_page_table on {name} (median; torch = torch-indexing reference)", results)
    common.write_results(
        "swa_spec", results, out=args.out, quick=args.quick, title="prepare_swa_spec_page_table",
        notes="Median us; `torch` = the torch-indexing reference on the same device (allocates its result; the kernel "
              "writes in place). GB/s count produced slots written + read (+ 8 B of mapping each).",
        headline_kw=dict(speedup="speedup", peer="torch-indexing reference"),
    )


if __name__ == "__main__":
    sys.exit(main())
