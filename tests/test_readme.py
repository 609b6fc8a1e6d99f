"""The README is a user's guide a fresh CPU-only machine can follow, short enough to read, and the
documentation it sends readers to exists in a clone.

* the first screen states what runs where, and that nothing has run on an Intel GPU;
* the CPU build of torch is installed first, from PyTorch's CPU wheel index, in a virtual environment,
  before the set-up commands (otherwise pip resolves `torch` to a CUDA build of about 3 GB);
* the set-up commands are the ones CI and the tests run (`pip install -e ".[cpu,test]"`, the
  self-check, `pytest`), and the package asks for nothing beyond torch and, on the CPU, Triton;
* the README's API table lists every public op, one row each;
* every relative link of README.md, docs/*.md and bench/README.md resolves, and every repository file
  they name in backticks (`bench/...`, `tests/...`, `triton_xpu_attn/...`, `.ci/...`,
  `autotune_configs/...`, `docs/...`) exists.
"""
from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: folders whose files the documentation names in backticks
REPO_PREFIXES = ("bench/", "tests/", "triton_xpu_attn/", ".ci/", "autotune_configs/", "docs/")


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end >= 0 else len(text)]


def _commands(section: str) -> list[str]:
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_is_short():
    lines = README.splitlines()
    assert len(lines) <= 260, f"README.md has {len(lines)} lines: move details to docs/"
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 200 and not line.startswith("|")]
    assert not long, f"README.md lines over 200 characters (outside tables): {long}"
    table_rows = [i + 1 for i, line in enumerate(lines) if len(line) > 400]
    assert not table_rows, f"README.md table rows over 400 characters: {table_rows}"


def test_status_comes_first_and_says_xpu_never_ran():
    status = _section(README, "Status")
    assert README.index("\n## Status\n") < README.index("\n## Install\n"), "the status table is the first section"
    intel = next(line for line in status.splitlines() if line.startswith("| Intel XPU"))
    assert "never run on an Intel GPU" in intel and "OpenCL CPU device" in intel and "not timed" in intel
    rows = [line for line in status.splitlines() if line.startswith("| ") and not line.startswith("| backend")]
    for backend in ("Intel XPU", "NVIDIA H100", "NVIDIA H200", "CPU"):
        assert any(row.startswith(f"| {backend}") for row in rows), f"no status row for {backend}"
    assert all(re.search(r"20\d\d-\d\d-\d\d", row) for row in rows if not row.startswith("| CPU")), "dated rows"


def test_cpu_torch_is_installed_first_from_pytorchs_cpu_index_in_a_venv():
    commands = _commands(_section(README, "Install"))
    venv = "python -m venv .venv && . .venv/bin/activate"
    cpu_torch = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
    setup = 'pip install -e ".[cpu,test]" && python -m triton_xpu_attn'
    assert venv in commands and cpu_torch in commands and setup in commands and "pytest" in commands
    assert commands.index(venv) < commands.index(cpu_torch) < commands.index(setup) < commands.index("pytest")


def test_python_versions_match_the_project():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    minimum = re.fullmatch(r">=\s*3\.(\d+)", project["requires-python"]).group(1)
    assert f"Python 3.{minimum} or newer" in _section(README, "Install")


def test_setup_commands_need_nothing_that_pulls_a_cuda_build():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == ["torch"]  # satisfied by the CPU build installed first
    extras = project["optional-dependencies"]
    assert [re.split(r"[<>=!]", r)[0] for r in extras["cpu"]] == ["triton"]
    assert all(re.split(r"[<>=!\[]", r)[0] not in ("torch", "nvidia") for r in extras["test"])


def test_api_table_lists_every_public_op_once():
    import triton_xpu_attn

    api = _section(README, "API")
    tables = re.findall(r"((?:^\|.*\n)+)", api, re.M)
    assert len(tables) == 1, "README's API section holds exactly one table"
    named = re.findall(r"^\| `(\w+)`", tables[0], re.M)
    aliases = set(re.findall(r"\(= `(\w+)`\)", tables[0]))
    assert len(named) == len(set(named)), "one row per op"
    missing = set(triton_xpu_attn.__all__) - set(named) - aliases
    assert not missing, f"README's API table lacks {sorted(missing)}"


def test_performance_summary_sends_readers_to_the_docs():
    performance = _section(README, "Performance")
    assert "](docs/performance.md)" in performance and "](bench/README.md)" in performance
    assert "Intel GPU" in performance  # nothing timed there, said where the numbers are


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_relative_links_resolve(path):
    text = path.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        target = target.split("#")[0]
        if not target or "://" in target or target.startswith("mailto:"):
            continue
        if not (path.parent / target).exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: broken links {broken}"


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_repository_paths_in_backticks_exist(path):
    """A backticked repository path (a whole code span that starts with one of REPO_PREFIXES) names a
    file or folder a clone has; `<...>`, `*`, `{a,b}` and `[...]` are patterns, checked by their fixed
    prefix. Paths of generated output (quick results, .xpu_build) are not repository paths."""
    text = path.read_text()
    missing = []
    for span in re.findall(r"`([^`\n]+)`", text):
        span = span.strip()
        if not span.startswith(REPO_PREFIXES) or " " in span:
            continue
        span = span.split("::")[0].rstrip(".,;:")
        fixed = re.split(r"[<*{\[]", span)[0]
        if fixed != span:  # a pattern: its fixed folder must exist
            fixed = fixed.rsplit("/", 1)[0]
        if not (ROOT / fixed).exists():
            missing.append(span)
    assert not missing, f"{path.relative_to(ROOT)} names files a clone does not have: {missing}"
