# Shared by .ci/sglang_env.sh and .ci/vllm_env.sh (sourced, not run; ROOT set): an engine's site
# folder built with `pip install --target`, apart from any venv, and a stamp recording what it holds.
# site_setup sets PYTHON (the interpreter whose pip downloads), DEST (the folder) and PYVER (empty,
# or the CPython version to cross-build for: manylinux x86_64 wheels only).

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# site_setup PREFIX DEFAULT_DEST [PYTHON [DEST]]: the script's arguments; PYVER from $PREFIX_ENV_PYVER
site_setup() {
  local prefix="$1" default="$2"
  shift 2
  PYTHON="${1:-python3}"
  DEST="${2:-$ROOT/$default}"
  local variable="${prefix}_ENV_PYVER"
  PYVER="${!variable:-}"
}

# site_python_version: the version the folder is for (PYVER, else PYTHON's major.minor)
site_python_version() {
  echo "${PYVER:-$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}"
}

# site_reuse_or_reset STAMP_FILE PACKAGE PINS REVISION: STAMP = the pins, the Python version and the
# script's revision; exit the calling script (0) when DEST holds PACKAGE and STAMP_FILE reads STAMP,
# otherwise leave DEST empty
site_reuse_or_reset() {
  STAMP="$3 py=$(site_python_version) $4"
  if [ -f "$DEST/$1" ] && [ "$(cat "$DEST/$1")" = "$STAMP" ] && [ -d "$DEST/$2" ]; then
    echo "reusing $DEST"
    exit 0
  fi
  rm -rf "$DEST"
  mkdir -p "$DEST"
}

# site_pip ARGS...: pip's quiet output without the warnings about this machine's configured local
# index folders that do not exist; fails (set -e in the caller) when pip fails
site_pip() {
  "$PYTHON" -m pip "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
  return "${PIPESTATUS[0]}"
}

# site_install PINS...: the pins, without their dependencies, into DEST (cross-built when PYVER)
site_install() {
  local cross=()
  if [ -n "$PYVER" ]; then
    cross=(--python-version "$PYVER" --implementation cp --only-binary=:all:
           --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  fi
  site_pip install -q --no-deps --no-compile --target "$DEST" "${cross[@]}" "$@"
}

# site_finish STAMP_FILE STAMP TAR: drop byte-code caches, write the stamp, print the size; when TAR
# is non-empty also write DEST.tar.gz (one compressed file to carry: Python sources shrink ~5x)
site_finish() {
  find "$DEST" -name '__pycache__' -type d -prune -exec rm -rf {} +
  echo "$2" > "$DEST/$1"
  du -sh "$DEST"
  if [ -n "$3" ]; then
    tar -C "$(dirname "$DEST")" -czf "$DEST.tar.gz" "$(basename "$DEST")"
    du -sh "$DEST.tar.gz"
  fi
}
