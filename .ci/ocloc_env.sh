#!/usr/bin/env bash
# Unpacks Intel's offline compiler (ocloc, with IGC) from Debian's packages into DEST, for the
# native-code audit of .ci/xpu_compile_check.py --native DEST (shared/notes/xpu_native.md).
# Nothing is installed: a private apt state under DEST names Debian's unstable suite on the
# archive this machine's own apt sources use, `apt-get download` fetches the .deb files (about
# 72 MB) and `dpkg-deb -x` unpacks them into DEST/root; ocloc then runs through that folder's own
# loader (unstable's libc is newer than the machine's). Bookworm's ocloc (IGC 1.0, 2022) knows no
# BMG and leaves the 2D block IO builtins unresolved, so it cannot serve.
#
#   .ci/ocloc_env.sh [DEST]     default .xpu_build/ocloc; prints the ocloc root folder last
#
# A stamp (DEST/root/VERSIONS: the package versions) makes a rerun reuse the folder.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.xpu_build/ocloc}"
PACKAGES="intel-ocloc libigc2 libigdfcl2 libigdgmm12 libc6 libstdc++6 libgcc-s1 zlib1g"

if [ -s "$DEST/root/VERSIONS" ] && ls "$DEST"/root/usr/bin/ocloc-* >/dev/null 2>&1; then
  echo "reusing $DEST/root ($(head -n 1 "$DEST/root/VERSIONS"))" >&2
  echo "$DEST/root"
  exit 0
fi

# the Debian archive this machine's apt already uses (deb822 or one-line sources)
uri="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1 || true)"
if [ -z "$uri" ]; then
  uri="$(awk '$1 == "deb" && $2 ~ /^(http|https|file):/ {print $2; exit}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n 1 || true)"
fi
[ -n "$uri" ] || { echo "ocloc_env: no Debian archive in this machine's apt sources" >&2; exit 1; }
# an archive named .../debian-security serves no unstable suite: take its sibling
uri="${uri%-security}"

rm -rf "$DEST"
mkdir -p "$DEST/apt/lists/partial" "$DEST/apt/cache/archives/partial" "$DEST/debs" "$DEST/root"
echo "deb $uri sid main" > "$DEST/apt/sources.list"
: > "$DEST/apt/status"
opts=(-o "Dir::Etc::SourceList=$DEST/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$DEST/apt/lists" -o "Dir::Cache=$DEST/apt/cache"
      -o "Dir::State::status=$DEST/apt/status" -o APT::Architecture=amd64
      -o APT::Sandbox::User=root -o Debug::NoLocking=1)
apt-get -q "${opts[@]}" update >&2
# shellcheck disable=SC2086
(cd "$DEST/debs" && apt-get -q "${opts[@]}" download $PACKAGES >&2)
for deb in "$DEST"/debs/*.deb; do
  dpkg-deb -x "$deb" "$DEST/root"
done
for deb in "$DEST"/debs/*.deb; do
  dpkg-deb -f "$deb" Package Version | sed 's/^[^:]*: //' | paste -sd' ' -
done | sort > "$DEST/root/VERSIONS.tmp"
# the compiler's own versions first (the table header quotes the first line)
{ grep -E '^(intel-ocloc|libigc2) ' "$DEST/root/VERSIONS.tmp" | paste -sd';' -; grep -vE '^(intel-ocloc|libigc2) ' "$DEST/root/VERSIONS.tmp"; } \
  > "$DEST/root/VERSIONS"
rm -rf "$DEST/root/VERSIONS.tmp" "$DEST/debs" "$DEST/apt"
ls "$DEST"/root/usr/bin/ocloc-* >/dev/null
echo "unpacked $(head -n 1 "$DEST/root/VERSIONS") into $DEST/root" >&2
echo "$DEST/root"
