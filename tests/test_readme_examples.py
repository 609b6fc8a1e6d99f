"""Every ```python block of README.md and docs/*.md runs as written: one fresh process runs them in
order, each in a namespace of its own, on the test device (the interpreter on a CPU machine), so an
example that stops at a NameError or an outdated argument fails here instead of in a newcomer's first
hour. Every README example prints its result (a newcomer sees that it worked): a README block that
prints nothing fails. The compat blocks, which install import hooks, run last in that process."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

RUNNER = r'''
import contextlib, io, json, sys, traceback
blocks = {blocks!r}
printed = []
for i, (name, code) in enumerate(blocks):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, name, "exec"), {{"__name__": "__readme__"}})
    except Exception:
        traceback.print_exc()
        print(f"{{name}} failed", file=sys.stderr)
        sys.exit(1)
    printed.append(out.getvalue())
print(json.dumps(printed))
'''


def python_blocks(path: pathlib.Path) -> list[tuple[str, str]]:
    text = path.read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    return [(f"{path.relative_to(ROOT)} python block {i + 1}", code) for i, code in enumerate(blocks)]


def test_readme_has_python_examples():
    blocks = [code for _, code in python_blocks(ROOT / "README.md")]
    assert len(blocks) >= 3, "README.md's python examples were not found (the block pattern changed?)"
    assert any("flash_attn_with_kvcache(" in b and "reference." in b for b in blocks), "decode checked against the reference"
    assert any("flash_attn_varlen_func(" in b and "q = torch" in b for b in blocks), "the prefill example defines its inputs"
    assert all("print(" in b for b in blocks), "every README example prints its result"


def test_python_blocks_run_as_written_and_readme_blocks_print():
    blocks = python_blocks(ROOT / "README.md")
    for path in sorted((ROOT / "docs").glob("*.md")):
        blocks += python_blocks(path)
    # the compat install changes sys.meta_path: last, so the other examples run on the plain package
    blocks.sort(key=lambda block: "compat.install" in block[1])
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", RUNNER.format(blocks=blocks)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    printed = dict(zip((name for name, _ in blocks), json.loads(proc.stdout.strip().splitlines()[-1])))
    silent = [name for name, text in printed.items() if name.startswith("README.md") and not text.strip()]
    assert not silent, f"README examples that print nothing: {silent}"
    decode = next(text for name, text in printed.items() if name.startswith("README.md") and "max error" in text)
    assert float(decode.split("max error")[1]) < 1e-2, decode
    compat = [text for name, text in printed.items() if name.startswith("README.md") and "installed" in text]
    assert compat, "the compat example prints what install() returns"
