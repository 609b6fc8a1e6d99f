#!/usr/bin/env bash
# Builds the site folder that tests/test_sglang_backend.py imports sglang 0.5.23 from:
# `sglang==0.5.23 --no-deps` plus the few real packages its import chain needs (msgspec, requests,
# tqdm, dill, starlette and their dependencies); everything heavy is stubbed by the tests
# (tests/sglang_harness.py STUBS). Kept apart from .venv-ci: `pip install --target`, never a venv.
#
#   .ci/sglang_env.sh [PYTHON] [DEST]
#       PYTHON: interpreter whose pip downloads (default python3); DEST default .venv-sglang/site
#   SGLANG_ENV_PYVER=3.12 .ci/sglang_env.sh python3 .venv-sglang/site-py312
#       cross-build for another CPython (manylinux x86_64 wheels only): the folder to carry to a
#       machine without internet (the GPU machine: Python 3.12)
#
# Pruned to what the import chain can touch: every non-Python file of sglang (compiled Rust/C
# extensions of the server, CUDA sources, tuned-config JSON), its multimodal_gen, test, benchmark,
# and srt/models trees, byte-code caches. SGLANG_ENV_TAR=1 also writes DEST.tar.gz. A stamp in DEST
# records the pins; a rerun with the same stamp reuses the folder. Prints DEST's size.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${1:-python3}"
DEST="${2:-$ROOT/.venv-sglang/site}"
PYVER="${SGLANG_ENV_PYVER:-}"
PINS="sglang==0.5.23 msgspec==0.22.0 requests==2.34.2 tqdm==4.70.1 dill==0.4.1 starlette==1.10.0"
# the pure-Python dependencies of those pins (resolved once; pinned so the folder is reproducible)
DEPS="anyio==4.16.0 certifi==2026.10.18 charset-normalizer==3.5.2 idna==3.20 urllib3==2.8.0 typing_extensions==4.16.0"

stamp() { echo "$PINS $DEPS py=${PYVER:-$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')} v4"; }

if [ -f "$DEST/.sglang-env-stamp" ] && [ "$(cat "$DEST/.sglang-env-stamp")" = "$(stamp)" ] && [ -d "$DEST/sglang" ]; then
  echo "reusing $DEST"
  exit 0
fi

rm -rf "$DEST"
mkdir -p "$DEST"
cross=()
if [ -n "$PYVER" ]; then
  cross=(--python-version "$PYVER" --implementation cp --only-binary=:all:
         --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
         --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
# shellcheck disable=SC2086
"$PYTHON" -m pip install -q --no-deps --no-compile --target "$DEST" "${cross[@]}" $PINS $DEPS 2>&1 \
  | { grep -v "^WARNING: Location 'file:" || true; }
[ "${PIPESTATUS[0]}" -eq 0 ]

# prune: compiled server extensions and trees the attention path never imports
find "$DEST/sglang" -type f ! -name '*.py' -delete  # Rust/C extensions, CUDA sources, tuned-config JSON
rm -rf "$DEST/sglang/multimodal_gen" "$DEST/sglang/test" "$DEST/sglang/benchmark" "$DEST/sglang/srt/models" "$DEST/bin"
find "$DEST" -name '__pycache__' -type d -prune -exec rm -rf {} +

stamp > "$DEST/.sglang-env-stamp"
du -sh "$DEST"
if [ -n "${SGLANG_ENV_TAR:-}" ]; then  # one compressed file to carry (Python sources shrink ~6x)
  tar -C "$(dirname "$DEST")" -czf "$DEST.tar.gz" "$(basename "$DEST")"
  du -sh "$DEST.tar.gz"
fi
