"""Benchmark: DeepSeek sparse attention's indexer top-k (``fast_topk_transform_fused``,
``fast_topk_transform_ragged_fused``, ``fast_topk_v2``) against ``torch.topk`` plus the transform
written in torch.

    python bench/bench_dsa_topk.py [--quick] [--out DIR] [--ops transform,ragged,v2] [--kinds decode,prefill]
                                   [--no-graph] [--time-budget S]

Shapes are DeepSeek-V3.2's (topk 2048):

* decode: ``B`` requests of ``next_n`` query rows (1: decode, 2: target verify), context ``L``: scores
  ``[B * next_n, L]``, each request's length drawn in ``[3L/4, L]``, a ``[B, L]`` page table (one
  request per row: ``cu_seqlens_q = arange(0, B * next_n + 1, next_n)``);
* prefill: one request of ``rows`` new tokens after a prefix, ragged keys: row ``t`` sees keys
  ``0 .. prefix + t`` (``row_starts = 0``, ``lengths = prefix + t + 1``), scores ``[rows, prefix + rows]``.

The torch baseline does what a torch fallback does: mask each row outside its section to ``-inf``
(``masked_fill``), ``torch.topk(k=2048, sorted=False)`` over the row, positions relative to the
start, ``-1`` where a masked column was picked, then the transform (page-table gather through a
row -> request map computed before timing, or the ragged offset). ``torch.topk`` alone (no mask,
no transform) is timed beside it. Times are medians of ``triton.testing.do_bench``, eager and
replayed from a CUDA graph (the serving path); the speedup is torch's over ours, graph against
graph where both captured. ``check`` compares our selection with torch's on sampled rows as sets
(scores are random normals: ties, where torch may pick another position, are rare; mismatches are
counted, as sgl-kernel-xpu's tests count them). ``GB/s``: score bytes in the sections / our time.
Under the CPU interpreter ``--quick`` runs a tiny smoke case (times mean nothing there).
Prints a markdown table (device, versions, date, command first) and writes ``dsa_topk.csv`` /
``.md`` / ``.json`` to ``--out/<device_key>/`` (quick runs: ``quick/``).
"""
from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton_xpu_attn as tx  # noqa: E402  (first: selects the interpreter on a CPU-only machine)

import torch  # noqa: E402

from bench import common  # noqa: E402

TOPK = 2048
DECODE_B = (1, 8, 32, 64, 128)
DECODE_NEXT_N = (1, 2)
DECODE_L = (4096, 16384, 65536, 131072)
PREFILL = ((1024, 4096), (1024, 16384), (4096, 16384), (4096, 61440), (8192, 57344))  # (rows, prefix)


def decode_case(B: int, next_n: int, L: int, device, gen) -> dict:
    rows = B * next_n
    lengths_req = torch.randint(3 * L // 4, L + 1, (B,), generator=gen, dtype=torch.int32)
    # query t of next_n sees its request's keys up to its own position
    lengths = (lengths_req.repeat_interleave(next_n) - (next_n - 1) + torch.arange(next_n).repeat(B)).to(torch.int32)
    return dict(
        kind="decode", label=f"B={B} next_n={next_n} L={L}", rows=rows, width=L,
        score=torch.randn(rows, L, generator=gen).to(device),
        lengths=lengths.to(device), row_starts=None,
        page_table=torch.randint(1, 1 << 24, (B, L), generator=gen, dtype=torch.int32).to(device),
        cu_seqlens_q=torch.arange(0, rows + 1, next_n, dtype=torch.int32).to(device),
        req_of_row=torch.arange(B).repeat_interleave(next_n).to(device),
        offsets=torch.zeros(rows, dtype=torch.int32).to(device),
    )


def prefill_case(rows: int, prefix: int, device, gen) -> dict:
    width = prefix + rows
    return dict(
        kind="prefill", label=f"rows={rows} prefix={prefix}", rows=rows, width=width,
        score=torch.randn(rows, width, generator=gen).to(device),
        lengths=(prefix + 1 + torch.arange(rows, dtype=torch.int32)).to(device),
        row_starts=torch.zeros(rows, dtype=torch.int32).to(device),
        page_table=torch.randint(1, 1 << 24, (1, width), generator=gen, dtype=torch.int32).to(device),
        cu_seqlens_q=torch.tensor([0, rows], dtype=torch.int32).to(device),
        req_of_row=torch.zeros(rows, dtype=torch.long).to(device),
        offsets=torch.full((rows,), 12345, dtype=torch.int32).to(device),
    )


def torch_select(case: dict, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(relative positions with -1 for masked picks, the row's start) the torch way."""
    score, lengths, row_starts = case["score"], case["lengths"], case["row_starts"]
    cols = torch.arange(score.shape[1], device=score.device)[None, :]
    start = row_starts[:, None].long() if row_starts is not None else torch.zeros_like(lengths[:, None]).long()
    valid = (cols >= start) & (cols < start + lengths[:, None].long())
    values, idx = torch.topk(score.masked_fill(~valid, -math.inf), min(topk, score.shape[1]), dim=-1, sorted=False)
    rel = torch.where(values != -math.inf, idx - start, -1)
    return rel, start


def torch_transform(case: dict, topk: int) -> torch.Tensor:
    rel, _ = torch_select(case, topk)
    slots = case["page_table"][case["req_of_row"][:, None], rel.clamp(min=0)]
    return torch.where(rel >= 0, slots, -1).to(torch.int32)


def torch_ragged(case: dict, topk: int) -> torch.Tensor:
    rel, _ = torch_select(case, topk)
    return torch.where(rel >= 0, rel + case["offsets"][:, None], -1).to(torch.int32)


def torch_v2(case: dict, topk: int) -> torch.Tensor:
    return torch_select(case, topk)[0].to(torch.int32)


def ours(op: str, case: dict, topk: int):
    if op == "transform":
        return lambda: tx.fast_topk_transform_fused(case["score"], case["lengths"], case["page_table"],
                                                    case["cu_seqlens_q"], topk, case["row_starts"])
    if op == "ragged":
        return lambda: tx.fast_topk_transform_ragged_fused(case["score"], case["lengths"], case["offsets"], topk,
                                                           case["row_starts"])
    return lambda: tx.fast_topk_v2(case["score"], case["lengths"], topk, case["row_starts"])


TORCH = {"transform": torch_transform, "ragged": torch_ragged, "v2": torch_v2}


def check(op: str, case: dict, topk: int, sample: int = 4) -> int:
    """Entries on which our result and torch's differ as sets, over ``sample`` spread rows."""
    got = ours(op, case, topk)().cpu()
    expected = TORCH[op](case, topk).cpu()
    rows = sorted({int(r) for r in torch.linspace(0, case["rows"] - 1, sample)})
    return sum(len(set(got[r].tolist()) ^ set(expected[r].tolist())) for r in rows)


def timed(fn, graphs: bool, quick: bool) -> tuple[float, float]:
    if not common.on_gpu():
        return common.bench_ms(fn, repeats=1 if quick else 3) * 1e3, float("nan")
    if graphs:
        return common.bench_both(fn)
    return common.bench_ms(fn) * 1e3, float("nan")


def run_case(op: str, case: dict, topk: int, graphs: bool, quick: bool) -> dict:
    mismatches = check(op, case, topk)
    ours_eager, ours_graph = timed(ours(op, case, topk), graphs, quick)
    torch_eager, torch_graph = timed(lambda: TORCH[op](case, topk), graphs, quick)
    topk_alone = timed(lambda: torch.topk(case["score"], min(topk, case["width"]), dim=-1, sorted=False), graphs,
                       quick)
    ours_t = ours_graph if math.isfinite(ours_graph) else ours_eager
    torch_t = torch_graph if math.isfinite(torch_graph) and math.isfinite(ours_graph) else torch_eager
    section_bytes = int(case["lengths"].clamp(min=0).sum()) * 4
    r2 = lambda x: round(x, 2) if math.isfinite(x) else float("nan")  # noqa: E731
    return dict(
        op=op, kind=case["kind"], case=case["label"], rows=case["rows"], width=case["width"],
        ours_us=r2(ours_eager), ours_graph_us=r2(ours_graph), torch_us=r2(torch_eager), torch_graph_us=r2(torch_graph),
        topk_alone_graph_us=r2(topk_alone[1] if math.isfinite(topk_alone[1]) else topk_alone[0]),
        speedup=round(torch_t / ours_t, 2), gbps=round(section_bytes / (ours_t * 1e-6) / 1e9, 1),
        check=mismatches, time_us=r2(ours_t), bytes=section_bytes, flops=0,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few shapes (under the CPU interpreter: one tiny case)")
    parser.add_argument("--out", default=str(common.RESULTS_DIR), help="results folder (a <device_key>/ folder is made in it)")
    parser.add_argument("--ops", default="transform,ragged,v2", help="comma-separated: transform, ragged, v2")
    parser.add_argument("--kinds", default="decode,prefill", help="comma-separated: decode, prefill")
    parser.add_argument("--no-graph", action="store_true", help="eager times only")
    parser.add_argument("--time-budget", type=float, default=None, help="start no new case after this many seconds")
    parser.add_argument("--batches", default=None, help="comma-separated: only these decode batch sizes B")
    args = parser.parse_args(argv)
    common.set_time_budget(args.time_budget)
    ops = [o for o in args.ops.split(",") if o]
    unknown = set(ops) - set(TORCH)
    if unknown:
        parser.error(f"--ops: unknown {sorted(unknown)} (choose from {sorted(TORCH)})")

    device = common._device.default_device()
    gen = torch.Generator().manual_seed(0)
    topk = TOPK
    if not common.on_gpu():  # the interpreter: one tiny case per path (a smoke test)
        cases = [lambda: decode_case(1, 2, 2200, device, gen), lambda: prefill_case(2, 9000, device, gen)]
    elif args.quick:
        cases = [lambda B=B, L=L: decode_case(B, 1, L, device, gen) for B in (1, 64) for L in (4096, 131072)]
        cases += [lambda: decode_case(32, 2, 65536, device, gen), lambda: prefill_case(4096, 61440, device, gen)]
    else:
        kinds = set(args.kinds.split(","))
        cases = [lambda B=B, n=n, L=L: decode_case(B, n, L, device, gen)
                 for B in DECODE_B for n in DECODE_NEXT_N for L in DECODE_L
                 if not args.batches or str(B) in args.batches.split(",")] if "decode" in kinds else []
        cases += [lambda r=r, p=p: prefill_case(r, p, device, gen) for r, p in PREFILL] if "prefill" in kinds else []

    print(common.header())
    print(f"command: {common.command_line()}")
    rows = []
    for make in cases:
        if common.out_of_time():
            print("time budget spent: remaining cases skipped")
            break
        case = make()
        for op in ops:
            if op == "transform" or case["kind"] == "prefill" or op == "v2":
                rows.append(run_case(op, case, topk, not args.no_graph, args.quick))
                print(rows[-1])
        del case
        common.free_memory()

    backend = common._device.backend()
    name = {"cuda": lambda: torch.cuda.get_device_name(), "xpu": lambda: torch.xpu.get_device_name()}.get(
        backend, lambda: backend)()
    common.print_table(f"DSA top-k (topk {topk}) on {name}: median us; speedup = torch / ours (graphs)", rows)
    slow = [r for r in rows if r["speedup"] < 2.0]
    summary = [f"{len(rows) - len(slow)}/{len(rows)} cases at >= 2x torch (topk + transform in torch)"]
    if slow:
        summary.append("below 2x: " + "; ".join(f"{r['op']} {r['case']} {r['speedup']}x" for r in slow))
    bad = [r for r in rows if r["check"] > 5]
    if bad:
        summary.append("CHECK FAILED (more than 5 entries differ from torch on sampled rows): "
                       + "; ".join(f"{r['op']} {r['case']}" for r in bad))
    for line in summary:
        print(line)
    common.write_results(
        "dsa_topk", rows, out=args.out, quick=args.quick, title="DSA indexer top-k",
        notes="Median us (eager and CUDA-graph replay); torch = masked_fill + torch.topk(2048, sorted=False) + the "
              "transform in torch; speedup = torch / ours, graphs where both captured; check = entries differing "
              "from torch's selection as sets on 4 sampled rows (ties only).",
        summary=summary, headline_kw=dict(speedup="speedup", peer="torch.topk + transform"),
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
