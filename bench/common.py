"""What every benchmark script shares: timing (``do_bench`` medians, CUDA-graph replays, a
wall-clock fallback under the CPU interpreter), the device's measured ceilings (copy bandwidth and
bf16 matmul throughput), the header line, the sglang peer loader and the results writer.

Results of an op go to ``<out>/<device_key>/<op>.csv`` + ``<op>.md`` + ``<op>.json`` (``--quick``
runs: ``<out>/<device_key>/quick/``). The JSON holds the run's metadata (device, versions, the
measured ceilings, the command) and the op's headline numbers; ``python -m bench`` reads it to
write ``summary.md`` and ``roofline.png``. Rows carry three standard columns for the roofline,
all for our kernel: ``time_us`` (the headline time: CUDA-graph replay where there is one),
``bytes`` (bytes the op must move) and ``flops`` (0 for ops without arithmetic).

Import order: this module imports ``triton_xpu_attn`` before torch and triton.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import functools
import glob
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import time
import zipfile

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import triton_xpu_attn  # noqa: E402,F401  (first: on a CPU it selects the interpreter before triton loads)
from triton_xpu_attn import device as _device  # noqa: E402

import torch  # noqa: E402

from bench.report import finite, geomean, header_line, headline, markdown_table, op_markdown  # noqa: E402,F401  (pure Python, shared with the reports)

RESULTS_DIR = REPO / "bench" / "results"
#: the roofline columns every op's rows carry (for our kernel)
ROOFLINE_COLUMNS = ("time_us", "bytes", "flops")


# ------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------


#: what the suite says instead of ratios under the Triton interpreter
INTERPRETER_NOTE = "Triton interpreter on a CPU: interpreter times are not performance, no ratio is shown"


def on_gpu() -> bool:
    """True when kernels run compiled on a GPU (timings mean something)."""
    return _device.backend() in ("cuda", "xpu")


def synchronize() -> None:
    backend = _device.backend()
    if backend == "cuda":
        torch.cuda.synchronize()
    elif backend == "xpu":
        torch.xpu.synchronize()


def bench_ms(fn, warmup: int = 25, rep: int = 100, repeats: int = 3) -> float:
    """Median milliseconds of ``fn``: ``triton.testing.do_bench`` (``warmup``/``rep`` in ms) on a
    GPU; under the interpreter one warm call then the median of ``repeats`` wall-clock calls
    (a smoke test, not a measurement)."""
    if on_gpu():
        from triton.testing import do_bench

        return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    fn()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def capture_graph(fn, warm: int = 2):
    """``fn`` captured in a device graph (CUDA graph; XPU graph where torch has one); returns the
    replay callable, or None where graphs are unavailable. Decode in serving engines runs from
    graphs, so this is the launch-overhead-free time every peer is given alike."""
    backend = _device.backend()
    if backend == "cuda":
        mod, graph_cls, ctx = torch.cuda, torch.cuda.CUDAGraph, torch.cuda.graph
    elif backend == "xpu" and hasattr(torch.xpu, "XPUGraph") and hasattr(torch.xpu, "graph"):
        mod, graph_cls, ctx = torch.xpu, torch.xpu.XPUGraph, torch.xpu.graph
    else:
        return None
    stream = mod.Stream()
    stream.wait_stream(mod.current_stream())
    with mod.stream(stream):
        for _ in range(warm):
            fn()
    mod.current_stream().wait_stream(stream)
    graph = graph_cls()
    with ctx(graph):
        fn()
    return graph.replay


def graph_ms(fn, warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds of ``fn`` replayed from a device graph; NaN where graphs are
    unavailable or capture fails."""
    try:
        replay = capture_graph(fn)
    except Exception as exc:  # noqa: BLE001  (a peer that cannot be captured keeps its eager time)
        print(f"graph capture failed: {exc!r}"[:160])
        return float("nan")
    if replay is None:
        return float("nan")
    return bench_ms(replay, warmup=warmup, rep=rep)


def bench_both(fn, warmup: int = 25, rep: int = 100) -> tuple[float, float]:
    """(eager, graph-replayed) median microseconds; the second is NaN without graphs."""
    eager = bench_ms(fn, warmup=warmup, rep=rep) * 1e3
    return eager, graph_ms(fn, warmup=warmup, rep=rep) * 1e3


#: time.monotonic() after which long benchmarks start no new case (None: no limit)
DEADLINE: float | None = None


def set_time_budget(seconds: float | None) -> None:
    """Start no new case ``seconds`` from now (a script's ``--time-budget``); keeps an earlier,
    tighter deadline (the suite's)."""
    global DEADLINE
    if seconds is not None:
        mine = time.monotonic() + seconds
        DEADLINE = mine if DEADLINE is None else min(DEADLINE, mine)


def out_of_time() -> bool:
    return DEADLINE is not None and time.monotonic() > DEADLINE


# ------------------------------------------------------------------------------------------
# the device's ceilings
# ------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def copy_bandwidth(device=None) -> float:
    """Measured device-to-device copy bandwidth in GB/s (bytes read + written), 1 GiB on a GPU;
    a 64 MiB host copy under the interpreter. Measured once per process."""
    device = torch.device(device) if device is not None else _device.default_device()
    n = (1 << 30) if on_gpu() else (64 << 20)
    x = torch.empty(n, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    gbs = 2 * n / bench_ms(lambda: y.copy_(x)) / 1e6
    del x, y
    return gbs


@functools.lru_cache(maxsize=None)
def matmul_tflops(device=None) -> float:
    """Measured dense matrix throughput in TFLOP/s: an 8192^3 bf16 ``torch.matmul`` on a GPU;
    a 512^3 fp32 one under the interpreter. Measured once per process."""
    device = torch.device(device) if device is not None else _device.default_device()
    n, dtype = (8192, torch.bfloat16) if on_gpu() else (512, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    ms = bench_ms(lambda: torch.matmul(a, b, out=c))
    del a, b, c
    return 2 * n**3 / ms / 1e9


def device_peaks() -> tuple[float, float]:
    """(copy GB/s, matmul TFLOP/s), both measured once per process."""
    return copy_bandwidth(), matmul_tflops()


def describe() -> dict:
    info = _device.describe()
    bw, tf = device_peaks()
    info.update(copy_gbs=float(f"{bw:.4g}"), matmul_tflops=float(f"{tf:.4g}"), date=datetime.date.today().isoformat())
    return info


def header(info: dict | None = None) -> str:
    """One line: device, compute units, torch, triton, measured ceilings, date (this machine's
    when ``info`` is None)."""
    return header_line(info or describe())


def free_memory() -> None:
    backend = _device.backend()
    if backend == "cuda":
        torch.cuda.empty_cache()
    elif backend == "xpu":
        torch.xpu.empty_cache()


# ------------------------------------------------------------------------------------------
# peers
# ------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def load_sglang(peers: str | None):
    """sglang's pure-Triton decode attention module, loaded by ``DIR/sgl_loader.py`` from the
    wheel unpacked under ``DIR/unpacked`` (extracted from ``DIR/sglang-*.whl`` when missing);
    None without ``peers``. The peers harness lives outside the repository (bench/README.md, "Peers")."""
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


#: a peer whose output is further than this (relative error) from the check is WRONG: not timed, in no speedup
BAD_ERR = 0.05
#: FlashInfer's float workspace per wrapper (its own recommendation, as the peers harness uses)
FLASHINFER_WORKSPACE_BYTES = 128 << 20


@functools.lru_cache(maxsize=None)
@functools.lru_cache(maxsize=None)
def flashinfer_peer_script(peers: str):
    """``DIR/flashinfer_peer.py`` (``setup``, ``gqa_prefill``, ...) imported once as a module."""
    spec = importlib.util.spec_from_file_location(
        "flashinfer_peer", os.path.join(os.path.abspath(peers), "flashinfer_peer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_flashinfer(peers: str | None):
    """FlashInfer from the bundle ``DIR/flashinfer``, set up by ``DIR/flashinfer_peer.py``'s
    ``setup`` (modules prebuilt for sm_90a; bench/README.md, "Peers"). Returns the
    ``flashinfer`` module, or None with the reason printed: no ``peers``, no CUDA device, no bundle,
    or a setup that fails."""
    if not peers:
        return None
    if _device.backend() != "cuda":
        print("FlashInfer skipped: it needs a CUDA device", flush=True)
        return None
    peers = os.path.abspath(peers)
    script, bundle = os.path.join(peers, "flashinfer_peer.py"), os.path.join(peers, "flashinfer")
    if not os.path.isfile(script) or not os.path.isdir(bundle):
        print(f"FlashInfer skipped: {peers} holds no flashinfer_peer.py and flashinfer/ bundle", flush=True)
        return None
    try:
        loader = flashinfer_peer_script(peers)
        t0 = time.perf_counter()
        fi = loader.setup(bundle)
    except Exception as exc:  # noqa: BLE001  (a broken bundle: run without the peer, say why)
        print(f"FlashInfer skipped: setup failed: {exc!r}"[:300], flush=True)
        return None
    print(f"FlashInfer {fi.__version__} set up from {bundle} in {time.perf_counter() - t0:.1f}s", flush=True)
    return fi


def flashinfer_workspace(device):
    return torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)


def page_list(page_table, seq_lens, page: int):
    """A dense page table as FlashInfer's page list (CSR): ``indptr [B + 1]`` and ``indices``, the
    pages each request uses (``ceil(seq_len / page)`` of its row), both int32."""
    used = (seq_lens.long() + page - 1) // page
    indptr = torch.zeros(page_table.shape[0] + 1, dtype=torch.int32, device=page_table.device)
    indptr[1:] = torch.cumsum(used, 0)
    columns = torch.arange(page_table.shape[1], device=page_table.device)
    indices = page_table[columns[None, :] < used[:, None]].to(torch.int32).contiguous()
    return indptr, indices


def time_variants(prefix: str, builders: dict, check, row: dict) -> None:
    """Time a peer's variants and keep the fastest correct one, into ``row``.

    ``builders``: label -> make; ``make()`` does the peer's planning (outside the timing) and
    returns ``f``, ``f()`` -> output. Each variant is run once and checked (``check(out)`` -> relative
    error; above :data:`BAD_ERR` it is WRONG and not timed), then timed eager and replayed from a CUDA
    graph. Writes ``<prefix>_<label>_err`` / ``_us`` (the time that counts: graph replay, else eager)
    or ``_note`` per variant, and for the fastest correct one ``<prefix>_variant``, ``_err``,
    ``_eager_us``, ``_us``; ``<prefix>_note`` says why none counts when none does."""
    best = None
    for label, make in builders.items():
        try:
            f = make()
            err = check(f())
            row[f"{prefix}_{label}_err"] = err
            if not err <= BAD_ERR:
                row[f"{prefix}_{label}_note"] = f"WRONG: rel err {err:.2e} > {BAD_ERR}"
                continue
            eager, replay = bench_both(f)
        except Exception as exc:  # noqa: BLE001  (a module not prebuilt, a shape it refuses: keep going)
            row[f"{prefix}_{label}_note"] = f"failed: {exc!r}"[:200]
            continue
        t = replay if finite(replay) else eager
        row[f"{prefix}_{label}_us"] = t
        if best is None or t < best[3]:
            best = (label, err, eager, t, replay)
    if best is None:
        row[f"{prefix}_note"] = "; ".join(f"{k}: {row[f'{prefix}_{k}_note']}" for k in builders
                                          if f"{prefix}_{k}_note" in row)[:300]
        return
    label, err, eager, t, replay = best
    row.update({f"{prefix}_variant": label + ("" if finite(replay) else " eager"), f"{prefix}_err": err,
                f"{prefix}_eager_us": eager, f"{prefix}_us": t})


# ------------------------------------------------------------------------------------------
# numbers
# ------------------------------------------------------------------------------------------


def speedup_line(rows: list[dict], key: str, name: str, target: str = "") -> str | None:
    """``name: geometric mean Gx, min Mx over N cases (target)`` over the finite ``key`` column of
    ``rows``; None when no row has one. Under the interpreter (no GPU) it names no ratio: interpreter
    times are not performance."""
    ratios = [r[key] for r in rows if finite(r.get(key))]
    if not ratios:
        return None
    if not on_gpu():
        return f"{name}: {len(ratios)} cases ran ({INTERPRETER_NOTE})"
    return (f"{name}: geometric mean {geomean(ratios):.2f}x, min {min(ratios):.2f}x over {len(ratios)} cases"
            + (f" ({target})" if target else ""))


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


# ------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------


#: the command recorded in results; the suite sets it (its own argv), scripts derive it from sys.argv
COMMAND: str | None = None


def command_line() -> str:
    if COMMAND:
        return COMMAND
    argv = list(sys.argv) or [""]
    try:
        argv[0] = os.path.relpath(argv[0], REPO) if argv[0] else argv[0]
    except ValueError:  # another drive (Windows)
        pass
    return "python " + " ".join(argv)


def results_dir(out: str | os.PathLike | None, quick: bool = False, device_key: str | None = None) -> pathlib.Path:
    """``<out>/<device_key>`` (``/quick`` for quick runs), created."""
    folder = pathlib.Path(out or RESULTS_DIR) / (device_key or _device.device_key())
    if quick:
        folder = folder / "quick"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_results(op: str, rows: list[dict], *, out=None, quick: bool = False, title: str | None = None,
                  notes: str = "", summary: list[str] | None = None, table: str | None = None,
                  headline_kw: dict | None = None) -> pathlib.Path:
    """Write ``<op>.csv`` (every column), ``<op>.md`` (header, command, notes, ``table`` or all
    columns, summary lines) and ``<op>.json`` (metadata + headline) into :func:`results_dir`.
    Returns the folder."""
    folder = results_dir(out, quick)
    info = describe()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(folder / f"{op}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    command = command_line()
    summary = summary or []
    (folder / f"{op}.md").write_text(
        op_markdown(title or op, info, command, table if table is not None else markdown_table(rows), notes, summary)
    )
    headline_kw = headline_kw or {}
    meta = dict(op=op, title=title or op, quick=quick, command=command, summary=summary, **info, headline_kw=headline_kw,
                headline=headline(rows, info["copy_gbs"], info["matmul_tflops"], **headline_kw))
    (folder / f"{op}.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    print(f"wrote {folder}/{op}.csv, .md, .json")
    return folder


def print_table(title: str, rows: list[dict]) -> None:
    """Print ``rows`` as a markdown table under ``title`` (the scripts' console output)."""
    print(f"\n{title}\n")
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")


def flashinfer_bench_parser(description: str, quick_help: str, unit: str = "cases") -> argparse.ArgumentParser:
    """The command line every benchmark beside FlashInfer takes: ``--quick``, ``--out``,
    ``--time-budget`` (no new ``unit`` after S seconds) and ``--peers`` (the peers folder)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", default=str(RESULTS_DIR), help="results folder (a <device_key>/ folder is made in it)")
    ap.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help=f"stop starting new {unit} after S seconds (results so far are written)")
    ap.add_argument("--peers", default=None, help="folder with flashinfer_peer.py and the FlashInfer bundle flashinfer/")
    return ap


def rate_columns(row: dict, names) -> None:
    """``<name>_time_us`` (the CUDA-graph time, else the eager one) and ``<name>_TFLOPs`` (from
    ``row["flops"]``) for each kernel ``name`` timed into ``row``."""
    for name in names:
        t = row.get(f"{name}_us", float("nan"))
        if not finite(t):
            t = row.get(f"{name}_eager_us", float("nan"))
        row[f"{name}_time_us"] = t
        row[f"{name}_TFLOPs"] = row["flops"] / t / 1e6 if finite(t) else float("nan")


def causal_flops(B: int, Hq: int, D: int, q_len: int, L: int) -> int:
    """Exact FLOPs of causal attention, bottom-right aligned: B requests of ``q_len`` queries over
    ``L`` keys (query t sees ``L - q_len + t + 1`` keys), ``Hq`` heads of width ``D``."""
    return 4 * Hq * D * B * (q_len * (L - q_len) + q_len * (q_len + 1) // 2)
