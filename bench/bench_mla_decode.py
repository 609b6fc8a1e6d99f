"""MLA decode benchmark: triton_xpu_attn.flash_mla_decode vs sglang's Triton MLA decode, side by side.

Grid (bf16, DeepSeek latent 512 + rope 64, paged cache with random page order):
B in {1, 16, 64, 128} x H in {16, 128} x L in {1k, 4k, 16k} x page size in {1, 64}.
Ours runs with automatic KV splits; sglang's kernel (``decode_attention_fwd`` with ``has_mla=True``,
the grouped kernel that splits 576 into 512 + 64) with its static 8 splits, as sglang uses it on XPU.
Both are checked against a float32 reference (on the first requests) before they are timed.

Prints per case: time, GB/s (latent cache bytes read / time), % of a measured copy roofline,
TFLOP/s (2 B H L (576 + 512) / time), ours/sglang speedup, and the geometric mean; writes
CSV + markdown to --out (default bench/results/).

usage:
  python bench/bench_mla_decode.py [--quick] [--out DIR] [--peers DIR] [--sweep]

--peers DIR: a folder holding sgl_loader.py (from ../shared/peers/) and the sglang wheel, unpacked
under DIR/unpacked (extracted from DIR/sglang-*.whl when missing); see ../shared/peers/README.md.
Without it only our kernel is timed. On a machine without a GPU, --quick runs one tiny case
through the Triton interpreter as a smoke test.
--sweep: also time a few kernel configs per case (BLOCK_H, BLOCK_N, warps, stages) and report the
best, to seed autotune_configs/.
"""
from __future__ import annotations

import argparse
import csv
import glob
import importlib.util
import math
import os
import pathlib
import sys
import time
import zipfile

import torch

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import triton_xpu_attn as ours  # noqa: E402  (selects the interpreter on a machine without a GPU)
from triton_xpu_attn import device as _device  # noqa: E402
from triton_xpu_attn import tune  # noqa: E402

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


def load_sglang(peers: str | None):
    if not peers:
        return None
    peers = os.path.abspath(peers)
    root = os.path.join(peers, "unpacked")
    if not os.path.isdir(os.path.join(root, "sglang")):
        wheels = sorted(glob.glob(os.path.join(peers, "sglang-*.whl")))
        if not wheels:
            raise SystemExit(f"--peers {peers}: no unpacked/ folder and no sglang-*.whl to extract")
        zipfile.ZipFile(wheels[-1]).extractall(root)
    spec = importlib.util.spec_from_file_location("sgl_loader", os.path.join(peers, "sgl_loader.py"))
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    return loader.load(root)


def bench_ms(fn, device_type):
    """Median milliseconds of eager calls."""
    if device_type == "cpu":
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def graph_ms(fn, device_type):
    """Median milliseconds of ``fn`` captured in a CUDA graph and replayed (how serving engines run
    decode: no launch or Python overhead); NaN where graphs are unavailable or capture fails."""
    if device_type != "cuda":
        return float("nan")
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return bench_ms(graph.replay, device_type)
    except Exception as exc:  # noqa: BLE001
        print(f"graph capture failed: {exc!r}"[:160])
        return float("nan")


def copy_bandwidth(dev):
    if dev.type == "cpu":
        return float("nan")
    x = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    gbs = 2 * x.numel() / bench_ms(lambda: y.copy_(x), dev.type) / 1e6
    del x, y
    return gbs


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
    return ((out[: ref.shape[0]].float() - ref).norm() / ref.norm()).item()


def run_case(sgl, B, H, L, page, dev, dtype, bw, sweep):
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
    if "sweep_best_cfg" in row:
        cells.append(f"sweep best {row['sweep_best_us']:.1f}us {row['sweep_best_tflops']:.1f}TF [{row['sweep_best_cfg']}]")
    return f"{name} | " + " | ".join(cells)


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short grid (on CPU: one tiny interpreter case)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--peers", default=None, help="folder with sgl_loader.py and the sglang wheel (unpacked/)")
    ap.add_argument("--sweep", action="store_true", help="also time a few kernel configs per case")
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
    import triton

    header = (f"device {_device.device_name()} ({_device.compute_units()} compute units) torch {torch.__version__} "
              f"triton {triton.__version__} copy roofline {bw:.0f} GB/s")
    print(header, flush=True)
    rows = []
    for B, H, L, P in grid:
        row = run_case(sgl, B, H, L, P, dev, dtype, bw, args.sweep)
        rows.append(row)
        print(fmt_row(row), flush=True)
        torch.cuda.empty_cache() if dev.type == "cuda" else None

    speedups = [r["speedup"] for r in rows if "speedup" in r]
    summary = []
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

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"mla_decode_{_device.device_key()}" + ("_quick" if args.quick or dev.type == "cpu" else "")
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(out / f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    with open(out / f"{stem}.md", "w") as f:
        f.write(f"# MLA decode, bf16, R {R} + Dr {DR}\n\n{header}\n\n")
        f.write("Ours: automatic KV splits. sglang: Triton `decode_attention_fwd(has_mla=True)`, 8 static splits. "
                "Times are CUDA-graph replays (eager calls in brackets); GB/s = latent cache bytes / time; "
                "% of the measured copy roofline; TFLOP/s = 2 B H L (2 R + Dr) / time; speedup = sglang time / ours.\n\n")
        f.write("| B | H | L | P | ours us (eager) | ours GB/s | ours % roof | ours TF/s | splits | sglang us (eager) | sglang GB/s | sglang % roof | sglang TF/s | speedup |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")

        def cell(r, k, spec):
            return format(r[k], spec) if k in r else ("ERR" if k.split("_")[0] + "_error" in r else "-")

        for r in rows:
            f.write(f"| {r['B']} | {r['H']} | {r['L']} | {r['page']} | {cell(r, 'ours_us', '.1f')} ({cell(r, 'ours_eager_us', '.1f')}) | {cell(r, 'ours_gbs', '.0f')} | "
                    f"{cell(r, 'ours_pct', '.0f')} | {cell(r, 'ours_tflops', '.1f')} | {r.get('ours_splits', '-')} | "
                    f"{cell(r, 'sglang_us', '.1f')} ({cell(r, 'sglang_eager_us', '.1f')}) | {cell(r, 'sglang_gbs', '.0f')} | {cell(r, 'sglang_pct', '.0f')} | "
                    f"{cell(r, 'sglang_tflops', '.1f')} | {cell(r, 'speedup', '.2f')} |\n")
        f.write("\n" + "\n".join(f"- {s}" for s in summary) + "\n")
        errors = [fmt_row(r) for r in rows if any(k.endswith("_error") for k in r)]
        if errors:
            f.write("\nErrors:\n\n" + "\n".join(f"- {e}" for e in errors) + "\n")
    print(f"wrote {out / stem}.csv and .md")


if __name__ == "__main__":
    main()
