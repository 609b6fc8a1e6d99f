"""Repository text speaks of the product, not of how it was developed: no tracker references and no
rounds of work in any tracked text file (docs, comments, docstrings, code, benchmark records).

The rule, case-insensitive, over every line of every file ``git ls-files`` lists (binary and
compressed files skipped):

* ``issue 12``, ``issues #3``, ``(issue 21, item 1)``: a tracker number a reader of a clone cannot
  look up. A URL is allowed (``https://github.com/<owner>/<repo>/issues/1234`` names an upstream
  project's public issue), so URLs are removed from a line before it is checked;
* ``session``/``sessions``: a working period, not a product fact;
* ``previous/earlier/last/this/that round``: a relative date; say the date or the commit instead.

Dates (2026-11-22) and commits (ea194bc) are how the text dates a measurement or names old code.
Run by ``pytest`` and so by ``.ci/run``. Fails naming every ``file:line``. This file, which spells the
patterns out, is the one exception.
"""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

PATTERNS = [
    re.compile(r"\bissues? ?#?\d+", re.I),
    re.compile(r"\bsessions?\b", re.I),
    re.compile(r"\b(previous|earlier|last|this|that) rounds?\b", re.I),
]
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)
SELF = pathlib.Path(__file__).resolve().relative_to(ROOT).as_posix()
BINARY_SUFFIXES = {".png", ".gz", ".jpg", ".whl", ".so", ".pdf"}


def hits(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of every line that breaks the rule."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        bare = URL.sub("", line)
        if any(p.search(bare) for p in PATTERNS):
            found.append((number, line.strip()))
    return found


def test_the_rule_catches_tracker_words_and_spares_urls():
    assert hits("see issue 21 for the targets") and hits("(issue #3)") and hits("Issues 29")
    assert hits("measured this session") and hits("Session 12 (H100)") and hits("the previous round")
    assert not hits("upstream https://github.com/sgl-project/sglang/issues/1234 reports it")
    assert not hits("TMA bounds-checks in hardware; issued before the softmax; both ways round")
    assert not hits("the session_id of a request")  # identifiers: \b keeps session_id out
    assert not hits("tissue 3") and not hits("reissue 4")


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_tracked_text_names_no_tracker_or_rounds_of_work():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    bad = []
    for name in files.decode().split("\0"):
        path = ROOT / name
        if not name or name == SELF or path.suffix in BINARY_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        bad += [f"{name}:{number}: {line[:160]}" for number, line in hits(text)]
    assert not bad, f"{len(bad)} lines speak of the tracker or of rounds of work:\n" + "\n".join(bad)
