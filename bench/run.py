"""The benchmark suite: run every op's benchmark, then write the device's summary and roofline.

    python -m bench [--quick] [--ops paged_attention,mla_decode,mla_prefill,local_attention,swa_spec,varlen_attention,prefill]
                    [--peers .peers] [--out bench/results] [--flex] [--vs-heuristic] [--time-budget S]
    python -m bench --plot-only bench/results/<device_key>      # summary.md + roofline.png from CSVs
    python bench/run.py ...                                      # the same

Each op's benchmark (``bench/bench_<op>.py``) runs in this process, one after the other (the device
ceilings, copy bandwidth and bf16 matmul throughput, are measured once) and writes
``<out>/<device_key>/<op>.csv`` / ``.md`` / ``.json`` (``--quick``: ``<out>/<device_key>/quick/``, which git
ignores: smoke results a user did not ask to keep leave the checkout clean).
Then ``summary.md`` (one table: per op, % of the copy roofline, TFLOP/s, speedup vs its peer and the
tuned-vs-heuristic gain from the device's config file) and ``roofline.png`` are written from every
op's files in that folder, so a suite split over several calls with ``--ops`` ends with a complete
summary. Without matplotlib the picture is skipped; ``--plot-only`` draws it later (it needs neither
torch nor Triton). ``--peers DIR`` (a folder with sglang's Triton kernels, sgl_loader.py and the unpacked sglang wheel,
and FlashInfer's, flashinfer_peer.py and its prebuilt bundle)
goes to the benchmarks that compare with them (paged_attention and mla_decode: sglang;
mla_prefill, varlen_attention and prefill: FlashInfer). Under the CPU interpreter
(no GPU) every benchmark runs a tiny smoke case; the times mean nothing there.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import sys
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: op -> (module under bench/, takes --peers)
OPS = {
    "paged_attention": ("bench_paged_attention", True),
    "mla_decode": ("bench_mla_decode", True),
    "mla_prefill": ("bench_mla_prefill", True),
    "local_attention": ("bench_local_attention", False),
    "swa_spec": ("bench_swa_spec", False),
    "varlen_attention": ("bench_varlen_attention", True),
    "prefill": ("bench_prefill", True),
}


def plot_only(folder: str) -> int:
    from bench import report

    folder = pathlib.Path(folder)
    if not folder.is_dir():
        print(f"--plot-only: {folder} is not a folder", file=sys.stderr)
        return 2
    report.write_missing_tables(folder)
    picture = report.plot_roofline(folder)
    report.write_summary(folder)  # after the picture, so the summary links it
    return 0 if picture is not None else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--quick", action="store_true", help="each benchmark's short grid (results in <device_key>/quick/)")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, from {', '.join(OPS)} (default: all)")
    ap.add_argument("--peers", default=None, help="folder with sgl_loader.py and the sglang wheel (unpacked/), "
                    "flashinfer_peer.py and the FlashInfer bundle (flashinfer/)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"), help="results folder (default bench/results)")
    ap.add_argument("--flex", action="store_true", help="paged_attention: also time FlexAttention (slow: compiles per shape)")
    ap.add_argument("--vs-heuristic", action="store_true", help="paged_attention, mla_decode: also time the built-in "
                    "heuristic config per case (tuned_gain column, summarised in summary.md)")
    ap.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="paged_attention, mla_decode, mla_prefill, prefill: start no new case once S seconds have passed since the suite "
                    "began (what ran is written; keep S a minute or two under a hard limit)")
    ap.add_argument("--plot-only", metavar="DIR", help="only write summary.md and roofline.png from the results in DIR")
    args = ap.parse_args(argv)
    if args.plot_only:
        return plot_only(args.plot_only)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        ap.error(f"unknown ops {unknown}; choose from {', '.join(OPS)}")
    if args.peers and not os.path.isdir(args.peers):
        ap.error(f"--peers {args.peers}: not a folder")

    from bench import common, report  # imports triton_xpu_attn first (interpreter on a CPU-only machine)

    common.COMMAND = "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv)
    if not common.on_gpu() and not args.quick:
        print("no GPU: running every benchmark's --quick smoke case under the Triton interpreter")
        args.quick = True
    common.set_time_budget(args.time_budget)
    print(common.header(), flush=True)
    failed, timings = [], []
    t_all = time.perf_counter()
    for op in ops:
        module_name, takes_peers = OPS[op]
        op_argv = ["--out", args.out] + (["--quick"] if args.quick else [])
        if takes_peers and args.peers:
            op_argv += ["--peers", args.peers]
        if op == "paged_attention" and args.flex:
            op_argv.append("--flex")
        if op in ("paged_attention", "mla_decode") and args.vs_heuristic:
            op_argv.append("--vs-heuristic")
        print(f"\n=== {op}: bench/{module_name}.py {' '.join(op_argv)}", flush=True)
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(f"bench.{module_name}")
            rc = module.main(op_argv)
            if rc:
                raise RuntimeError(f"exit status {rc}")
        except BaseException as exc:  # noqa: BLE001  (SystemExit from argparse or a missing peer too)
            if isinstance(exc, KeyboardInterrupt):
                raise
            traceback.print_exc()
            failed.append(op)
        timings.append((op, time.perf_counter() - t0))
        common.free_memory()
    folder = common.results_dir(args.out, quick=args.quick)
    print()
    report.plot_roofline(folder)
    report.write_summary(folder)
    print("\n" + "  ".join(f"{op} {s:.0f}s" for op, s in timings) + f"  | total {time.perf_counter() - t_all:.0f}s")
    if not common.on_gpu():
        print(f"every op ran its smoke case ({common.INTERPRETER_NOTE}); time them on a GPU")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
