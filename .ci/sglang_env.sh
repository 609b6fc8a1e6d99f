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
# shellcheck source=.ci/site_lib.sh
. "$ROOT/.ci/site_lib.sh"
site_setup SGLANG .venv-sglang/site "$@"
PINS="sglang==0.5.23 msgspec==0.22.0 requests==2.34.2 tqdm==4.70.1 dill==0.4.1 starlette==1.10.0"
# the pure-Python dependencies of those pins (resolved once; pinned so the folder is reproducible)
DEPS="anyio==4.16.0 certifi==2026.10.18 charset-normalizer==3.5.2 idna==3.20 urllib3==2.8.0 typing_extensions==4.16.0"

site_reuse_or_reset .sglang-env-stamp sglang "$PINS $DEPS" v4
# shellcheck disable=SC2086
site_install $PINS $DEPS

# prune: compiled server extensions and trees the attention path never imports
find "$DEST/sglang" -type f ! -name '*.py' -delete  # Rust/C extensions, CUDA sources, tuned-config JSON
rm -rf "$DEST/sglang/multimodal_gen" "$DEST/sglang/test" "$DEST/sglang/benchmark" "$DEST/sglang/srt/models" "$DEST/bin"

site_finish .sglang-env-stamp "$STAMP" "${SGLANG_ENV_TAR:-}"
