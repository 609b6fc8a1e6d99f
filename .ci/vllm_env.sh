#!/usr/bin/env bash
# Builds the site folder that tests/test_vllm_backend.py imports vLLM 0.33.0 from: the Python files of
# the `vllm==0.33.0` wheel (no compiled extension: its XPU kernels are our compat vllm_xpu_kernels)
# plus the five real packages its config import chain needs (regex, pydantic, pydantic_core,
# annotated-types, typing-inspection); everything else the server imports is stubbed by the tests
# (tests/vllm_harness.py STUBS). Kept apart from .venv-ci: a plain folder, never a venv.
#
#   .ci/vllm_env.sh [PYTHON] [DEST]
#       PYTHON: interpreter whose pip downloads (default python3); DEST default .venv-vllm/site
#   VLLM_ENV_PYVER=3.12 .ci/vllm_env.sh python3 .venv-vllm/site-py312
#       cross-build for another CPython (manylinux x86_64 wheels: regex and pydantic_core are
#       compiled): the folder to carry to a machine without internet (the GPU machine: Python 3.12)
#
# The vLLM wheel (~340 MB) is downloaded into a temporary folder and only its `vllm/**.py` files
# (~50 MB) and its metadata (the version vLLM reads) are extracted. VLLM_ENV_TAR=1 also writes
# DEST.tar.gz. A stamp in DEST records the pins; a rerun with the same stamp reuses the folder.
# Prints DEST's size. Shared steps: .ci/site_lib.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=.ci/site_lib.sh
. "$ROOT/.ci/site_lib.sh"
site_setup VLLM .venv-vllm/site "$@"
VLLM_PIN="vllm==0.33.0"
# the real packages of vLLM's config chain (pinned so the folder is reproducible)
PINS="regex==2026.11.19 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0"

site_reuse_or_reset .vllm-env-stamp vllm "$VLLM_PIN $PINS" v1
# shellcheck disable=SC2086
site_install $PINS

WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
# the wheel is py3 abi3 (cp38-abi3): any CPython >= 3.8 reads the same Python files
site_pip download -q --no-deps -d "$WHEELS" --only-binary=:all: --platform manylinux_2_28_x86_64 "$VLLM_PIN"
"$PYTHON" - "$DEST" "$WHEELS"/vllm-*.whl <<'PY'
import sys, zipfile
dest, wheel = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")]
    # the version vLLM reads through importlib.metadata (no entry points: no plugin is loaded)
    meta = [n for n in z.namelist() if n.endswith((".dist-info/METADATA", ".dist-info/WHEEL", ".dist-info/top_level.txt"))]
    z.extractall(dest, names + meta)
print(f"{len(names)} Python files of {wheel.rsplit('/', 1)[-1]}")
PY
rm -rf "$DEST/bin"

site_finish .vllm-env-stamp "$STAMP" "${VLLM_ENV_TAR:-}"
