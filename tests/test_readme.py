"""Issue 19 item 6: the README is a user's guide a fresh CPU-only machine can follow.

* the CPU build of torch is installed first, from PyTorch's CPU wheel index, before the set-up
  commands (otherwise pip resolves `torch` to a CUDA build of about 3 GB);
* the set-up commands are the ones CI and the tests run (`pip install -e ".[cpu,test]"`, the
  self-check, `pytest`), and the package asks for nothing beyond torch and, on the CPU, Triton;
* one table of measured results; the experiment narrative lives in bench/README.md beside the
  results, and every relative link of both files resolves.
"""
from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BENCH_README = (ROOT / "bench" / "README.md").read_text()


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end >= 0 else len(text)]


def _commands(section: str) -> list[str]:
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_cpu_torch_is_installed_first_from_pytorchs_cpu_index():
    commands = _commands(_section(README, "Install"))
    cpu_torch = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
    setup = 'pip install -e ".[cpu,test]" && python -m triton_xpu_attn'
    assert cpu_torch in commands and setup in commands and "pytest" in commands
    assert commands.index(cpu_torch) < commands.index(setup) < commands.index("pytest")


def test_setup_commands_need_nothing_that_pulls_a_cuda_build():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == ["torch"]  # satisfied by the CPU build installed first
    extras = project["optional-dependencies"]
    assert [re.split(r"[<>=!]", r)[0] for r in extras["cpu"]] == ["triton"]
    assert all(re.split(r"[<>=!\[]", r)[0] not in ("torch", "nvidia") for r in extras["test"])


def test_one_results_table_and_the_narrative_beside_the_results():
    performance = _section(README, "Performance")
    header_rows = [line for line in performance.splitlines() if re.match(r"\|\s*---", line)]
    assert len(header_rows) == 1, "README's Performance section holds exactly one table"
    assert "](bench/README.md)" in performance
    for moved in ("## What moved small batches", "## Whole-wave splits", "## Against the issue targets"):
        assert moved in BENCH_README and moved not in README


def test_relative_links_resolve():
    for path, text in ((ROOT / "README.md", README), (ROOT / "bench" / "README.md", BENCH_README)):
        for target in re.findall(r"\]\(([^)#]+)\)", text):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"
