"""Reports over a results folder ``bench/results/<device_key>/``: the headline numbers per op, the
suite's ``summary.md`` and the roofline picture ``roofline.png``.

Pure Python over the files the benchmarks write (``<op>.csv`` and ``<op>.json``): no torch, no
Triton, so ``python -m bench --plot-only bench/results/<device_key>`` can draw the picture on any
machine with matplotlib.
"""
from __future__ import annotations

import csv
import json
import math
import os
import pathlib
import statistics

REPO = pathlib.Path(__file__).resolve().parent.parent
#: the order ops appear in the summary and the legend
OP_ORDER = ("paged_attention", "prefill", "varlen_attention", "mla_decode", "mla_prefill", "local_attention", "swa_spec")
CONFIG_DIR_ENV = "TRITON_XPU_ATTN_CONFIG_DIR"  # as triton_xpu_attn.tune


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def geomean(xs) -> float:
    xs = [x for x in xs if finite(x) and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _num(v):
    """CSV cell -> float where it is a number (ints stay ints), else the text."""
    if isinstance(v, (int, float)) or v is None:
        return v
    try:
        f = float(v)
    except ValueError:
        return v
    return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f


def read_rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: _num(v) for k, v in r.items()} for r in csv.DictReader(f)]


def rates(rows: list[dict]) -> list[tuple[float, float, float, float]]:
    """(bytes, flops, GB/s, TFLOP/s) per row with a positive time and bytes (``time_us``, ``bytes``,
    ``flops``: the roofline columns every op writes for our kernel)."""
    out = []
    for r in rows:
        t, b, f = r.get("time_us"), r.get("bytes"), r.get("flops") or 0
        if finite(t) and t > 0 and finite(b) and b > 0:
            out.append((float(b), float(f) if finite(f) else 0.0, b / t / 1e3, (f / t / 1e6) if finite(f) else 0.0))
    return out


def headline(rows: list[dict], bw: float, tf: float, *, speedup: str | None = None, peer: str | None = None,
             note: str = "") -> dict:
    """The op's headline numbers: % of the copy roofline (best, median over cases), best GB/s,
    best TFLOP/s (and % of the matmul ceiling), speedup vs the peer (geomean, min, max)."""
    out: dict = dict(cases=len(rows), peer=peer, note=note)
    rs = rates(rows)
    gbs = [g for _, _, g, _ in rs]
    tfs = [t for _, f, _, t in rs if f > 0]
    if gbs:
        out.update(best_gbs=max(gbs))
        if finite(bw) and bw > 0:
            out.update(best_pct_copy=100 * max(gbs) / bw, median_pct_copy=100 * statistics.median(gbs) / bw)
    if tfs:
        out.update(best_tflops=max(tfs))
        if finite(tf) and tf > 0:
            out.update(best_pct_matmul=100 * max(tfs) / tf)
    if speedup:
        ratios = [r[speedup] for r in rows if finite(r.get(speedup)) and r[speedup] > 0]
        if ratios:
            out.update(speedup_geomean=geomean(ratios), speedup_min=min(ratios), speedup_max=max(ratios),
                       speedup_cases=len(ratios))
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}


def load_results(folder) -> dict[str, dict]:
    """op -> {"meta": <op>.json, "rows": <op>.csv rows} for every op with both files in ``folder``."""
    folder = pathlib.Path(folder)
    found = {}
    for meta_path in sorted(folder.glob("*.json")):
        csv_path = meta_path.with_suffix(".csv")
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError:
            continue
        if not isinstance(meta, dict) or "op" not in meta or not csv_path.exists():
            continue
        found[meta["op"]] = dict(meta=meta, rows=read_rows(csv_path))
    order = {op: i for i, op in enumerate(OP_ORDER)}
    return dict(sorted(found.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


def config_file(backend: str, device_key: str) -> pathlib.Path | None:
    """The config file the kernels read on that device: the user's folder, else the shipped one."""
    candidates = []
    if os.environ.get(CONFIG_DIR_ENV):
        candidates.append(pathlib.Path(os.environ[CONFIG_DIR_ENV]) / backend / f"{device_key}.json")
    candidates += [REPO / "autotune_configs" / backend / f"{device_key}.json",
                   REPO / "triton_xpu_attn" / "autotune_configs" / backend / f"{device_key}.json"]
    return next((p for p in candidates if p.is_file()), None)


def tuning_gains(backend: str, device_key: str) -> tuple[pathlib.Path | None, dict]:
    """(config file, op -> {buckets, geomean, min, max}) from the file's ``gain_over_heuristic``
    block (the tuner writes, per op and bucket, heuristic_us, tuned_us and speedup)."""
    path = config_file(backend, device_key)
    if path is None:
        return None, {}
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return path, {}
    gains = {}
    for op, buckets in (data.get("gain_over_heuristic") or {}).items():
        ratios = [b.get("speedup") for b in buckets.values() if isinstance(b, dict) and finite(b.get("speedup"))]
        if ratios:
            gains[op] = dict(buckets=len(ratios), geomean=geomean(ratios), min=min(ratios), max=max(ratios),
                             measured=bool(data.get("measured_on_hardware")))
    return path, gains


def _fmt(v, spec: str, suffix: str = "") -> str:
    return format(v, spec) + suffix if finite(v) else "-"


def summary_markdown(folder) -> str:
    results = load_results(folder)
    if not results:
        return f"# Benchmark summary\n\nNo results in {folder}.\n"
    first = next(iter(results.values()))["meta"]
    device, key, backend = first.get("device", "?"), first.get("device_key", "?"), first.get("backend", "?")
    cfg_path, gains = tuning_gains(backend, key)
    lines = [f"# Benchmark summary: {device}", ""]
    lines.append(f"device key `{key}`, backend {backend}, {first.get('compute_units', '?')} compute units, "
                 f"torch {first.get('torch', '?')}, triton {first.get('triton', '?')}; measured copy roofline "
                 f"{_fmt(first.get('copy_gbs'), '.0f')} GB/s, {'fp32' if backend == 'interpreter' else 'bf16'} matmul "
                 f"{_fmt(first.get('matmul_tflops'), '.3g')} TFLOP/s.")
    if any(r["meta"].get("quick") for r in results.values()):
        lines.append("")
        lines.append("**Quick run** (a short grid): not the full benchmark.")
    interpreter = backend == "interpreter"
    if interpreter:
        lines += ["", "**Triton interpreter on a CPU**: interpreter times are not performance; the table shows no rate "
                  "or ratio, only the cases that ran."]
    lines += ["", "| op | cases | best % of copy roofline (median) | best GB/s | best TFLOP/s (% of matmul) | "
              "speedup vs peer: geomean [min, max] | tuned vs heuristic: geomean [min, max] |",
              "|---|---|---|---|---|---|---|"]
    peers = []
    for op, res in results.items():
        meta = res["meta"]
        h = headline(res["rows"], meta.get("copy_gbs", float("nan")), meta.get("matmul_tflops", float("nan")),
                     **meta.get("headline_kw", {}))
        pct = f"{_fmt(h.get('best_pct_copy'), '.0f', '%')} ({_fmt(h.get('median_pct_copy'), '.0f', '%')})"
        tfl = f"{_fmt(h.get('best_tflops'), '.1f')} ({_fmt(h.get('best_pct_matmul'), '.0f', '%')})" if "best_tflops" in h else "-"
        spd = (f"{h['speedup_geomean']:.2f}x [{h['speedup_min']:.2f}, {h['speedup_max']:.2f}]"
               if "speedup_geomean" in h else "-")
        g = gains.get(op)
        gain = f"file: {g['geomean']:.2f}x [{g['min']:.2f}, {g['max']:.2f}] ({g['buckets']} buckets)" if g else ""
        grid = [r["tuned_gain"] for r in res["rows"] if finite(r.get("tuned_gain")) and r["tuned_gain"] > 0]
        if grid:
            gain += ("; " if gain else "") + (f"this grid: {geomean(grid):.2f}x [{min(grid):.2f}, {max(grid):.2f}] "
                                              f"({len(grid)} cases)")
        gain = gain or "-"
        if interpreter:
            pct = tfl = spd = gain = "-"
        lines.append(f"| {op} | {h['cases']} | {pct} | {_fmt(h.get('best_gbs') if not interpreter else None, '.0f')} "
                     f"| {tfl} | {spd} | {gain} |")
        if h.get("peer"):
            peers.append(f"- {op}: peer = {h['peer']}; command `{meta.get('command', '?')}`")
    lines += ["", "Peers and commands:", ""] + peers
    lines += ["", "Columns: rates are for our kernel (`time_us`: CUDA-graph replay where available); % of copy roofline = "
              "bytes the op must move / time / measured device-to-device copy bandwidth; speedup = peer time / ours; "
              "tuned vs heuristic = heuristic time / tuned time, \"file\": the config file's `gain_over_heuristic` "
              "(the tuner's buckets and problems), \"this grid\": the benchmark's own cases (`--vs-heuristic`)"
              + (f", from `{cfg_path.relative_to(REPO) if cfg_path.is_relative_to(REPO) else cfg_path}`." if cfg_path else
                 "; no config file for this device.")]
    notes = [f"- {op}: {s}" for op, res in results.items() for s in res["meta"].get("summary") or []]
    if notes:
        lines += ["", "Per-op notes:", ""] + notes
    lines += ["", "Per-case tables: " + ", ".join(f"[{op}]({op}.md)" for op in results) + "."]
    if (pathlib.Path(folder) / "roofline.png").exists():
        lines += ["", "![roofline](roofline.png)"]
    return "\n".join(lines) + "\n"


def header_line(info: dict) -> str:
    """One line: device, compute units, torch, triton, measured ceilings, date (a run's ``info``)."""
    return (f"device {info['device']} ({info['compute_units']} compute units, {info['backend']}) | torch {info['torch']} | "
            f"triton {info['triton']} | copy roofline {info['copy_gbs']:.0f} GB/s | "
            f"{'bf16' if info['backend'] in ('cuda', 'xpu') else 'fp32'} matmul {info['matmul_tflops']:.3g} TFLOP/s | "
            f"{info['date']}")


def op_markdown(title: str, info: dict, command: str, table: str, notes: str = "", summary: list[str] | None = None) -> str:
    """An op's ``<op>.md``: title, the run's header line, command, notes, table, summary lines."""
    text = f"# {title}\n\n{header_line(info)}\n\ncommand: `{command}`\n\n"
    if notes:
        text += notes.strip() + "\n\n"
    text += table
    if summary:
        text += "\n" + "\n".join(f"- {s}" for s in summary) + "\n"
    return text


def _cell(v) -> str:
    if isinstance(v, float):
        return "-" if not finite(v) else f"{v:.3g}"
    return "" if v is None else str(v).replace("|", "\\|")  # e.g. bucket keys in config sources


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> str:
    keys = columns or list(dict.fromkeys(k for r in rows for k in r))
    if not rows:
        return "(no cases)\n"
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"



def write_missing_tables(folder) -> list[pathlib.Path]:
    """``<op>.md`` for every op whose CSV and JSON are in ``folder`` but whose table is not (a
    results folder fetched from a machine that returns few files): title, the run's header line,
    command and summary from the JSON, every CSV column as the table."""
    written = []
    for op, res in load_results(folder).items():
        path = pathlib.Path(folder) / f"{op}.md"
        if path.exists():
            continue
        m = res["meta"]
        text = op_markdown(m["title"], m, m["command"], markdown_table(res["rows"]), summary=m.get("summary"))
        path.write_text(text)
        written.append(path)
        print(f"wrote {path}")
    return written


def write_summary(folder) -> pathlib.Path:
    path = pathlib.Path(folder) / "summary.md"
    path.write_text(summary_markdown(folder))
    print(f"wrote {path}")
    return path


def plot_roofline(folder) -> pathlib.Path | None:
    """``roofline.png`` in ``folder``: left, the classic roofline (x = arithmetic intensity in
    FLOP/byte, y = TFLOP/s; roofs = measured copy bandwidth and bf16 matmul throughput) with a point
    per case of every op that does arithmetic; right, achieved GB/s against bytes moved, with the
    copy roofline, for every op. Returns None (and says so) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no roofline picture. Later, on a machine with matplotlib: "
              f"python -m bench --plot-only {folder}")
        return None
    results = load_results(folder)
    if not results:
        print(f"no results in {folder}: nothing to plot")
        return None
    first = next(iter(results.values()))["meta"]
    bw, tf = first.get("copy_gbs", float("nan")), first.get("matmul_tflops", float("nan"))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5))
    markers = "osD^vP*X"
    ais, gb_x = [], []
    for i, (op, res) in enumerate(results.items()):
        rs = rates(res["rows"])
        style = dict(marker=markers[i % len(markers)], s=22, alpha=0.75, label=op, color=f"C{i}")
        pts = [(f / b, t) for b, f, _, t in rs if f > 0]
        if pts:
            ax1.scatter([p[0] for p in pts], [p[1] for p in pts], **style)
            ais += [p[0] for p in pts]
        if rs:
            ax2.scatter([b for b, _, _, _ in rs], [g for _, _, g, _ in rs], **style)
            gb_x += [b for b, _, _, _ in rs]
    if finite(bw) and finite(tf) and bw > 0 and tf > 0:
        ridge = tf * 1e3 / bw  # FLOP/byte where the two roofs meet
        lo = min(ais + [ridge]) / 4
        hi = max(ais + [ridge]) * 4
        xs = [lo * (hi / lo) ** (k / 200) for k in range(201)]
        ax1.plot(xs, [min(bw * x / 1e3, tf) for x in xs], color="k", lw=1.5)
        ax1.annotate(f"copy {bw:.0f} GB/s", (lo * 1.3, bw * lo * 1.3 / 1e3), rotation=0, fontsize=8, va="bottom")
        ax1.annotate(f"bf16 matmul {tf:.0f} TFLOP/s", (ridge * 1.1, tf * 1.05), fontsize=8, va="bottom")
        ax1.axvline(ridge, color="0.7", lw=0.8, ls=":")
    if finite(bw) and bw > 0:
        ax2.axhline(bw, color="k", lw=1.5)
        ax2.annotate(f"copy roofline {bw:.0f} GB/s", (min(gb_x or [1]), bw * 1.02), fontsize=8, va="bottom")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax1.set_ylabel("TFLOP/s")
    ax1.set_title("roofline (ops with arithmetic)")
    ax1.grid(True, which="both", alpha=0.3)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("bytes moved per call")
    ax2.set_ylabel("achieved GB/s")
    ax2.set_title("bandwidth (every op)")
    ax2.grid(True, which="both", alpha=0.3)
    for ax in (ax1, ax2):
        if ax.collections:
            ax.legend(fontsize=8, loc="lower right")
    quick = " (quick run)" if any(r["meta"].get("quick") for r in results.values()) else ""
    fig.suptitle(f"{first.get('device', '?')}{quick}: torch {first.get('torch', '?')}, triton {first.get('triton', '?')}, "
                 f"{first.get('date', '')}", fontsize=10)
    fig.tight_layout()
    path = pathlib.Path(folder) / "roofline.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
    return path
