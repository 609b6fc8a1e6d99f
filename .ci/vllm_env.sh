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
# (~50 MB) and its metadata (the version vLLM reads) are extracted. VLLM_ENV_TAR=1 also writes DEST.tar.gz. A stamp in DEST records the
# pins; a rerun with the same stamp reuses the folder. Prints DEST's size.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${1:-python3}"
DEST="${2:-$ROOT/.venv-vllm/site}"
PYVER="${VLLM_ENV_PYVER:-}"
VLLM_PIN="vllm==0.33.0"
# the real packages of vLLM's config chain (pinned so the folder is reproducible)
PINS="regex==2026.11.19 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0"

stamp() { echo "$VLLM_PIN $PINS py=${PYVER:-$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')} v1"; }

if [ -f "$DEST/.vllm-env-stamp" ] && [ "$(cat "$DEST/.vllm-env-stamp")" = "$(stamp)" ] && [ -d "$DEST/vllm" ]; then
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
quiet() { grep -v "^WARNING: Location 'file:" || true; }

# shellcheck disable=SC2086
"$PYTHON" -m pip install -q --no-deps --no-compile --target "$DEST" "${cross[@]}" $PINS 2>&1 | quiet
[ "${PIPESTATUS[0]}" -eq 0 ]

WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
# the wheel is py3 abi3 (cp38-abi3): any CPython >= 3.8 reads the same Python files
"$PYTHON" -m pip download -q --no-deps -d "$WHEELS" --only-binary=:all: --platform manylinux_2_28_x86_64 \
  "$VLLM_PIN" 2>&1 | quiet
[ "${PIPESTATUS[0]}" -eq 0 ]
"$PYTHON" - "$DEST" "$WHEELS"/vllm-*.whl <<'EOF'
import sys, zipfile
dest, wheel = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")]
    # the version vLLM reads through importlib.metadata (no entry points: no plugin is loaded)
    meta = [n for n in z.namelist() if n.endswith((".dist-info/METADATA", ".dist-info/WHEEL", ".dist-info/top_level.txt"))]
    z.extractall(dest, names + meta)
print(f"{len(names)} Python files of {wheel.rsplit('/', 1)[-1]}")
EOF
rm -rf "$DEST/bin"
find "$DEST" -name '__pycache__' -type d -prune -exec rm -rf {} +

stamp > "$DEST/.vllm-env-stamp"
du -sh "$DEST"
if [ -n "${VLLM_ENV_TAR:-}" ]; then  # one compressed file to carry (Python sources shrink ~5x)
  tar -C "$(dirname "$DEST")" -czf "$DEST.tar.gz" "$(basename "$DEST")"
  du -sh "$DEST.tar.gz"
fi
