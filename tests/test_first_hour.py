"""A newcomer's first hour: importing triton first on a CPU machine gives an error that
says what to do, quick benchmark results leave the checkout clean, and ``python -m bench --help``
points at nothing outside a user's clone."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
NO_GPU = not torch.cuda.is_available() and not (hasattr(torch, "xpu") and torch.xpu.is_available())

IMPORT_TRITON_FIRST = """
import triton
import torch
import triton_xpu_attn as T
q = torch.zeros(1, 1, 2, 64); k = torch.zeros(2, 16, 1, 64)
try:
    T.flash_attn_with_kvcache(q, k, k, cache_seqlens=torch.tensor([3], dtype=torch.int32),
                              page_table=torch.zeros(1, 1, dtype=torch.int32))
except RuntimeError as exc:
    print("RuntimeError:", exc)
"""


@pytest.mark.skipif(not NO_GPU, reason="the interpreter is only selected on a machine without a GPU")
def test_importing_triton_first_on_a_cpu_machine_says_what_to_do():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a user's fresh shell
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", IMPORT_TRITON_FIRST], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert "RuntimeError: triton was imported before triton_xpu_attn" in proc.stdout, proc.stdout + proc.stderr
    assert "Import triton_xpu_attn before triton" in proc.stdout and "TRITON_INTERPRET=1" in proc.stdout


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_quick_benchmark_results_are_ignored_by_git():
    probe = "bench/results/cpu/quick/paged_attention.csv"
    proc = subprocess.run(["git", "check-ignore", "-q", probe], cwd=ROOT)
    assert proc.returncode == 0, f"{probe} would show as untracked after `python -m bench --quick`"


def test_bench_help_points_at_nothing_outside_the_clone():
    proc = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "../shared" not in proc.stdout and "--peers" in proc.stdout
