"""MLA decode benchmark: triton_xpu_attn.flash_mla_decode vs sglang's Triton MLA decode, side by side.

Grid (bf16, DeepSeek latent 512 + rope 64, paged cache with random page order):
B in {1, 16, 64, 128} x H in {16, 128} x L in {1k, 4k, 16k} x page size in {1, 64}.
Ours runs with automatic KV splits; sglang's kernel (``decode_attention_fwd`` with ``has_mla=True``,
the grouped kernel that splits 576 into 512 + 64) with its static 8 splits, as sglang uses it on XPU.
Both are checked against a float32 reference (on the first requests) before they are timed.

Prints per case: time, GB/s (latent cache bytes read / time), % of a measured copy roofline,
TFLOP/s (2 B H L (576 + 512) / time), ours/sglang speedup, and the geometric mean; writes
CSV + markdown + JSON to --out/<device_key>/ (default bench/results/; quick runs in quick/).

usage:
  python bench/bench_mla_decode.py [--quick] [--out DIR] [--peers DIR] [--sweep] [--vs-heuristic]

--peers DIR: a folder holding sgl_loader.py (from the peers harness, which lives outside the
repository: bench/README.md, "Peers") and the sglang wheel, unpacked under DIR/unpacked (extracted
from DIR/sglang-*.whl when missing).
Without it only our kernel is timed. On a machine without a GPU, --quick runs one tiny case
through the Triton interpreter as a smoke test.
--sweep: also time a few kernel configs per case (BLOCK_H, BLOCK_N, warps, stages) and report the
best, to seed autotune_configs/.
--vs-heuristic: also time ours with the built-in heuristic config forced (``tuned_gain`` = heuristic
time / time with this device's config file).
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import triton_xpu_attn as ours  # noqa: E402  (selects the interpreter on a machine without a GPU)
from triton_xpu_attn import device as _device  # noqa: E402
from triton_xpu_attn import tune  # noqa: E402

import torch  # noqa: E402

from bench import common  # noqa: E402
from bench.common import load_sglang  # noqa: E402,F401

GRID_B = [1, 16, 64, 128]
GRID_H = [16, 128]
GRID_L = [1024, 4096, 16384]
GRID_P = [1, 64]
R, DR = 512, 64

SWEEP_CONFIGS = [
    dict(BLOCK_H=16, BLOCK_N=32, num_warps=4, num_stages=2),
    dict(BLOCK_H=16, BLOCK_N=64, num_warps=4, num_stages=2),
    dict(BLOCK_H=16, BLOCK_N=32, num_warps=8, num_stages=3),
    dict(BLOCK_H=32, BLOCK_N=32, num_warps=4, num_stages=2),
    dict(BLOCK_H=64, BLOCK_N=32, num_warps=8, num_stages=2),
    dict(BLOCK_H=64, BLOCK_N=32, num_warps=8, num_stages=1),
    dict(BLOCK_H=64, BLOCK_N=16, num_warps=4, num_stages=2),
    dict(BLOCK_H=64, BLOCK_N=64, num_warps=8, num_stages=1),
    dict(BLOCK_H=64, BLOCK_N=64, num_warps=8, num_stages=2),
    dict(BLOCK_H=128, BLOCK_N=32, num_warps=16, num_stages=1),
]


def bench_ms(fn, device_type):
    """Median milliseconds of eager calls (one wall-clock call under the interpreter)."""
    return common.bench_ms(fn, warmup=25, rep=200, repeats=1)


def graph_ms(fn, device_type):
    """Median milliseconds of ``fn`` captured in a device graph and replayed (how serving engines run
    decode: no launch or Python overhead); NaN where graphs are unavailable or capture fails."""
    return common.graph_ms(fn, warmup=25, rep=200)


def copy_bandwidth(dev):
    return common.copy_bandwidth()  # measured once per process (a host copy under the interpreter)


def make_case(B, H, L, page, dev, dtype):
    n = -(-L // page)
    num_pages = B * n + 8
    pages = torch.randperm(num_pages, device=dev)[: B * n].view(B, n)
    slots = (pages[:, :, None] * page + torch.arange(page, device=dev)).reshape(B, n * page)[:, :L]
    kv4 = torch.randn(num_pages, page, R + DR, device=dev, dtype=dtype)
    q = torch.randn(B, H, R + DR, device=dev, dtype=dtype)
    seqlens = torch.full((B,), L, device=dev, dtype=torch.int32)
    return kv4, q, pages.to(torch.int32), slots, seqlens


def reference(q, kv4, slots, scale, rows=4):
    """float32 reference for the first ``rows`` requests."""
    kv3 = kv4.view(-1, R + DR)
    K = kv3[slots[:rows].long()].float()  # [rows, L, 576]
    s = torch.einsum("bhd,bld->bhl", q[:rows].float(), K) * scale
    return torch.einsum("bhl,bld->bhd", s.softmax(-1), K[..., :R])


def rel_err(out, ref):
    return common.rel_err(out[: ref.shape[0]], ref)


def run_case(sgl, B, H, L, page, dev, dtype, bw, sweep, vs_heuristic=False):
    torch.manual_seed(0)
    kv4, q, table, slots, seqlens = make_case(B, H, L, page, dev, dtype)
    scale = 1 / math.sqrt(192)
    ref = reference(q, kv4, slots, scale)
    q_nope, q_pe = q[..., :R].contiguous(), q[..., R:].contiguous()
    byts = B * L * (R + DR) * kv4.element_size()
    flops = 2 * B * H * L * (R + DR + R)
    row = dict(B=B, H=H, L=L, page=page)

    def record(name, fn, out_of):
        try:
            fn()
            err = rel_err(out_of(), ref)
            eager = bench_ms(fn, dev.type)
            replay = graph_ms(fn, dev.type)
        except Exception as exc:  # noqa: BLE001
            row[f"{name}_error"] = repr(exc)[:120]
            return
        ms = replay if replay == replay else eager  # rates from the graph-replayed time when there is one
        row[f"{name}_eager_us"] = eager * 1e3
        row[f"{name}_us"] = ms * 1e3
        row[f"{name}_gbs"] = byts / ms / 1e6
        row[f"{name}_pct"] = 100 * byts / ms / 1e6 / bw if bw == bw else float("nan")
        row[f"{name}_tflops"] = flops / ms / 1e9
        row[f"{name}_err"] = err

    ws = torch.empty(ours.flash_mla_get_workspace_size(L, B, H, page, -1, device=dev), dtype=torch.uint8, device=dev)
    holder = {}

    def ours_fn():
        holder["o"] = ours.flash_mla_decode(q_nope, q_pe, kv4, seqlens, table, ws, scale, -1)

    record("ours", ours_fn, lambda: holder["o"])
    row["ours_config"] = tune.LAST_SOURCE.get("mla_decode", "-")
    if vs_heuristic and "ours_us" in row:
        with tune.override("mla_decode", {}):  # an empty override = the built-in heuristic config
            ms = graph_ms(ours_fn, dev.type)
            ms = ms if ms == ms else bench_ms(ours_fn, dev.type)
        row["heuristic_us"] = ms * 1e3
        row["tuned_gain"] = row["heuristic_us"] / row["ours_us"]
    from triton_xpu_attn.ops import mla_decode as mla_mod

    row["ours_splits"] = mla_mod._auto_splits(B, H, table.shape[1] * page, _device.compute_units(dev))
    if sweep and dev.type != "cpu":
        best = None
        for cfg in SWEEP_CONFIGS:
            try:
                with tune.override("mla_decode", dict(BLOCK_DV=0, **cfg)):
                    ours_fn()
                    if rel_err(holder["o"], ref) > 2e-2:
                        continue
                    ms = graph_ms(ours_fn, dev.type)
            except Exception:  # noqa: BLE001  (out of resources etc.)
                continue
            if best is None or ms < best[0]:
                best = (ms, cfg)
        if best is not None:
            row["sweep_best_us"] = best[0] * 1e3
            row["sweep_best_tflops"] = flops / best[0] / 1e9
            row["sweep_best_cfg"] = " ".join(f"{k}={v}" for k, v in best[1].items())

    if sgl is not None:
        splits = 8
        kv3 = kv4.view(-1, 1, R + DR)
        o = torch.empty(B, H, R, device=dev, dtype=dtype)
        logits = torch.empty(B, H, splits, R, device=dev, dtype=torch.float32)
        lse = torch.empty(B, H, splits, device=dev, dtype=torch.float32)
        nsplit = torch.full((B,), splits, device=dev, dtype=torch.int32)
        indptr = torch.arange(0, (B + 1) * L, L, device=dev, dtype=torch.int32)
        indices = slots.reshape(-1).to(torch.int32)

        def sgl_fn():
            sgl.decode_attention_fwd(q, kv3, kv3[..., :R], o, indptr, indices, logits, lse, nsplit, splits, scale, 1.0, 1.0,
                                     has_mla=True, page_size=page)

        record("sglang", sgl_fn, lambda: o)
    if "ours_us" in row and "sglang_us" in row:
        row["speedup"] = row["sglang_us"] / row["ours_us"]
    if "ours_us" in row:
        row.update(time_us=row["ours_us"], bytes=byts, flops=flops)
    return row


def fmt_row(row):
    name = f"B={row['B']:<3} H={row['H']:<3} L={row['L']:<5} P={row['page']:<2}"
    cells = []
    for peer in ("ours", "sglang"):
        if f"{peer}_error" in row:
            cells.append(f"{peer}: ERROR {row[peer + '_error']}")
        elif f"{peer}_us" in row:
            cells.append(f"{peer}: {row[peer + '_us']:8.1f}us (eager {row[peer + '_eager_us']:.1f}) "
                         f"{row[peer + '_gbs']:5.0f}GB/s {row[peer + '_pct']:3.0f}% "
                         f"{row[peer + '_tflops']:6.1f}TF err {row[peer + '_err']:.1e}")
    if "ours_splits" in row:
        cells.append(f"splits {row['ours_splits']}")
    if "speedup" in row:
        cells.append(f"ours/sglang {row['speedup']:.2f}x")
    if "tuned_gain" in row:
        cells.append(f"config {row.get('ours_config')} x{row['tuned_gain']:.2f} vs heuristic")
    if "sweep_best_cfg" in row:
        cells.append(f"sweep best {row['sweep_best_us']:.1f}us {row['sweep_best_tflops']:.1f}TF [{row['sweep_best_cfg']}]")
    return f"{name} | " + " | ".join(cells)


def geomean(xs):
    return common.geomean(xs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short grid (on CPU: one tiny interpreter case)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--peers", default=None, help="folder with sgl_loader.py and the sglang wheel (unpacked/)")
    ap.add_argument("--sweep", action="store_true", help="also time a few kernel configs per case")
    ap.add_argument("--vs-heuristic", action="store_true",
                    help="also time our kernel with the built-in heuristic config (tuned_gain = heuristic / tuned time)")
    ap.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="stop starting new cases after S seconds (results so far are written)")
    args = ap.parse_args(argv)

    dev = _device.default_device()
    if dev.type == "cpu":
        global R, DR
        R, DR = 32, 16  # interpreter smoke test: tiny latent
        grid = [(1, 16, 64, 16), (2, 3, 40, 1)]
        dtype = torch.float16
        sgl = None
    else:
        dtype = torch.bfloat16
        sgl = load_sglang(args.peers)
        if args.quick:
            grid = [(B, H, L, P) for B in (1, 64) for H in GRID_H for L in (1024, 4096) for P in GRID_P]
        else:
            grid = [(B, H, L, P) for H in GRID_H for B in GRID_B for L in GRID_L for P in GRID_P]
    bw = copy_bandwidth(dev)
    print(common.header(), flush=True)
    rows, stopped = [], []
    common.set_time_budget(args.time_budget)
    for index, (B, H, L, P) in enumerate(grid):
        if common.out_of_time():
            stopped.append(f"stopped after {index} of {len(grid)} cases: time budget (--time-budget) spent")
            print(stopped[-1], flush=True)
            break
        try:
            row = run_case(sgl, B, H, L, P, dev, dtype, bw, args.sweep, args.vs_heuristic)
        except Exception as exc:  # noqa: BLE001  (keep the grid going: out of memory, ...)
            row = dict(B=B, H=H, L=L, page=P, ours_error=repr(exc)[:120])
        rows.append(row)
        print(fmt_row(row), flush=True)
        common.free_memory()

    speedups = [r["speedup"] for r in rows if "speedup" in r]
    summary = list(stopped)
    if speedups:
        summary.append(f"ours/sglang geomean {geomean(speedups):.2f}x, min {min(speedups):.2f}x over {len(speedups)} cases")
    for H in GRID_H:
        tf = [r["ours_tflops"] for r in rows if r["H"] == H and "ours_tflops" in r]
        if tf:
            summary.append(f"H={H}: ours TFLOP/s max {max(tf):.1f}")
    mem = [r["ours_pct"] for r in rows if r["H"] == 16 and r["B"] >= 64 and r["L"] >= 4096 and "ours_pct" in r]
    if mem:
        summary.append(f"H=16, B>=64, L>=4k: ours {min(mem):.0f}-{max(mem):.0f}% of the copy roofline")
    for line in summary:
        print(line)

    def cell(r, k, spec):
        return format(r[k], spec) if k in r else ("ERR" if k.split("_")[0] + "_error" in r else "-")

    table = ("| B | H | L | P | ours us (eager) | ours GB/s | ours % roof | ours TF/s | splits | sglang us (eager) | sglang GB/s "
             "| sglang % roof | sglang TF/s | speedup |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        table += (f"| {r['B']} | {r['H']} | {r['L']} | {r['page']} | {cell(r, 'ours_us', '.1f')} ({cell(r, 'ours_eager_us', '.1f')}) | "
                  f"{cell(r, 'ours_gbs', '.0f')} | {cell(r, 'ours_pct', '.0f')} | {cell(r, 'ours_tflops', '.1f')} | "
                  f"{r.get('ours_splits', '-')} | {cell(r, 'sglang_us', '.1f')} ({cell(r, 'sglang_eager_us', '.1f')}) | "
                  f"{cell(r, 'sglang_gbs', '.0f')} | {cell(r, 'sglang_pct', '.0f')} | {cell(r, 'sglang_tflops', '.1f')} | "
                  f"{cell(r, 'speedup', '.2f')} |\n")
    errors = [fmt_row(r) for r in rows if any(k.endswith("_error") for k in r)]
    if errors:
        table += "\nErrors:\n\n" + "\n".join(f"- {e}" for e in errors) + "\n"
    common.write_results(
        "mla_decode", rows, out=args.out, quick=args.quick or dev.type == "cpu", title=f"MLA decode, {str(dtype)[6:]}, R {R} + Dr {DR}",
        notes="Ours: automatic KV splits. sglang: Triton `decode_attention_fwd(has_mla=True)`, 8 static splits. "
              "Times are CUDA-graph replays (eager calls in brackets); GB/s = latent cache bytes / time; "
              "% of the measured copy roofline; TFLOP/s = 2 B H L (2 R + Dr) / time; speedup = sglang time / ours.",
        summary=summary, table=table, headline_kw=dict(speedup="speedup", peer="sglang Triton MLA decode"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
