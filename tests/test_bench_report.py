"""The benchmark suite's reports (bench/report.py) on fabricated results, and a smoke run of
``python -m bench --quick`` under the interpreter."""
from __future__ import annotations

import csv
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import report  # noqa: E402  (pure Python: no torch, no triton)

BW, TF = 4300.0, 750.0  # an H200-like device


def _write(folder: pathlib.Path, op: str, rows: list[dict], **headline_kw):
    folder.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(folder / f"{op}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    meta = dict(op=op, title=op, quick=False, command=f"python -m bench --ops {op}", summary=[f"{op} note"],
                backend="cuda", device="NVIDIA H200", device_key="FAKE_H200", compute_units=132, torch="2.11",
                triton="3.6.0", copy_gbs=BW, matmul_tflops=TF, date="2026-11-21", headline_kw=headline_kw)
    (folder / f"{op}.json").write_text(json.dumps(meta))


def _fake_results(folder: pathlib.Path) -> None:
    paged = []
    for B in (1, 16, 64):
        for L in (1024, 8192):
            byts = 4 * B * L * 8 * 128
            us = byts / (BW * 1e3) / (0.3 if B == 1 else 0.85)
            paged.append(dict(B=B, L=L, ours_us=us, sglang_us=us * 1.3, speedup_vs_sglang=1.3, time_us=us,
                              bytes=byts, flops=4 * B * 32 * L * 128, tuned_gain=1.1))
    _write(folder, "paged_attention", paged, speedup="speedup_vs_sglang", peer="sglang")
    mla = []
    for H in (16, 128):
        byts, flops = 64 * 4096 * 576 * 2, 2 * 64 * H * 4096 * 1088
        us = max(byts / (BW * 1e3) / 0.8, flops / (TF * 1e6) / 0.4)
        mla.append(dict(B=64, H=H, ours_us=us, speedup=2.0 if H == 16 else 0.5, time_us=us, bytes=byts, flops=flops))
    _write(folder, "mla_decode", mla, speedup="speedup", peer="sglang MLA")
    _write(folder, "swa_spec", [dict(rows=64, time_us=5.0, bytes=1e6, flops=0, speedup=20.0)], speedup="speedup", peer="torch")
    _write(folder, "local_attention", [dict(B=1, time_us="nan", bytes=0, flops=0, speedup="nan")], speedup="speedup")


def test_headline_numbers(tmp_path):
    _fake_results(tmp_path)
    res = report.load_results(tmp_path)
    assert list(res) == ["paged_attention", "mla_decode", "local_attention", "swa_spec"]
    h = report.headline(res["paged_attention"]["rows"], BW, TF, speedup="speedup_vs_sglang")
    assert h["cases"] == 6 and abs(h["best_pct_copy"] - 85) < 0.5 and abs(h["speedup_geomean"] - 1.3) < 1e-6
    h = report.headline(res["mla_decode"]["rows"], BW, TF, speedup="speedup")
    assert abs(h["speedup_geomean"] - 1.0) < 1e-6 and h["speedup_min"] == 0.5 and h["best_tflops"] > 100
    h = report.headline(res["local_attention"]["rows"], BW, TF, speedup="speedup")
    assert h["cases"] == 1 and "best_gbs" not in h and "speedup_geomean" not in h


def test_summary_reads_tuning_gains(tmp_path, monkeypatch):
    results = tmp_path / "results" / "FAKE_H200"
    _fake_results(results)
    configs = tmp_path / "configs" / "cuda"
    configs.mkdir(parents=True)
    (configs / "FAKE_H200.json").write_text(json.dumps(dict(
        measured_on_hardware=True,
        gain_over_heuristic={"paged_attention": {"a": dict(speedup=1.2), "b": dict(speedup=1.5)}},
    )))
    monkeypatch.setenv(report.CONFIG_DIR_ENV, str(tmp_path / "configs"))
    text = report.summary_markdown(results)
    line = next(x for x in text.splitlines() if x.startswith("| paged_attention"))
    assert "85%" in line and "1.30x" in line and "file: 1.34x [1.20, 1.50] (2 buckets)" in line
    assert "this grid: 1.10x [1.10, 1.10] (6 cases)" in line
    assert "| mla_decode | 2 |" in text and "NVIDIA H200" in text


def test_plot_only(tmp_path):
    pytest.importorskip("matplotlib")
    _fake_results(tmp_path)
    from bench import run

    assert run.main(["--plot-only", str(tmp_path)]) == 0
    png = tmp_path / "roofline.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "![roofline](roofline.png)" in (tmp_path / "summary.md").read_text()


def test_suite_quick_smoke(tmp_path):
    """``python -m bench --quick`` runs every benchmark's smoke case under the interpreter (on a GPU
    the quick grid is a real benchmark of minutes: run it by hand there)."""
    from triton_xpu_attn import device as _device

    if not _device.is_interpreter():
        pytest.skip("a GPU is present: the quick suite is a real benchmark there")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    folders = [p.parent for p in tmp_path.glob("*/quick/summary.md")]
    assert len(folders) == 1
    for op in ("paged_attention", "mla_decode", "mla_prefill", "local_attention", "swa_spec"):
        assert (folders[0] / f"{op}.csv").exists() and (folders[0] / f"{op}.json").exists()
    # no ratio of interpreter times: the run says they are not performance instead of "0.00x"
    assert "0.00x" not in proc.stdout and "interpreter times are not performance" in proc.stdout
    summary = (folders[0] / "summary.md").read_text()
    assert "interpreter times are not performance" in summary and "0.00x" not in summary


def test_page_list_and_peer_variants():
    """The FlashInfer glue the prefill benchmarks share (bench/common.py): the page list of a dense
    page table, and the choice among a peer's variants (a WRONG one and a failing one never count)."""
    import torch

    from bench import common

    table = torch.tensor([[7, 2, 9, 0], [4, 1, 3, 5], [8, 6, 0, 0]], dtype=torch.int32)
    indptr, indices = common.page_list(table, torch.tensor([33, 64, 1], dtype=torch.int32), 16)
    assert indptr.tolist() == [0, 3, 7, 8] and indices.tolist() == [7, 2, 9, 4, 1, 3, 5, 8]
    assert indptr.dtype == indices.dtype == torch.int32

    ref = torch.ones(4)

    def refuses():
        raise RuntimeError("no prebuilt module")

    row = {}
    common.time_variants("peer", {"wrong": lambda: (lambda: ref * 2), "ok": lambda: (lambda: ref + 1e-3),
                                  "broken": refuses}, lambda out: common.rel_err(out, ref), row)
    assert row["peer_variant"].split()[0] == "ok" and row["peer_err"] < 1e-2 and common.finite(row["peer_us"])
    assert row["peer_wrong_note"].startswith("WRONG") and "peer_wrong_us" not in row
    assert "no prebuilt module" in row["peer_broken_note"] and "peer_note" not in row
    none = {}
    common.time_variants("peer", {"wrong": lambda: (lambda: -ref)}, lambda out: common.rel_err(out, ref), none)
    assert "peer_variant" not in none and "WRONG" in none["peer_note"]
    rows = [dict(s=2.0), dict(s=0.5), dict()]
    real = common.on_gpu
    try:
        common.on_gpu = lambda: True
        assert common.speedup_line(rows, "s", "x") == "x: geometric mean 1.00x, min 0.50x over 2 cases"
        common.on_gpu = lambda: False  # interpreter times are no performance: no ratio is printed
        assert common.speedup_line(rows, "s", "x") == f"x: 2 cases ran ({common.INTERPRETER_NOTE})"
    finally:
        common.on_gpu = real
