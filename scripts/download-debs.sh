#!/usr/bin/env bash
# Downloads (never installs) the Debian 12 packages that a CUDA build needs besides libtorch, for
# a machine where apt cannot install them: a CUDA container image with pip's torch, say.
# scripts/build-cuda.sh unpacks them from DEPS_DEBS into its build directory (never into /).
#
#   scripts/download-debs.sh [DIR]    # default build-debs/ (ignored by git); about 11 MB
#
# Run it on a Debian 12 machine with apt's package lists (`apt-get update` if it has none).
# Idempotent: packages already in DIR are not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build-debs}

# The -dev packages, and the runtime libraries they and their dependencies load.
PACKAGES=(
  libzmq3-dev libzmq5 cppzmq-dev libsodium23 libpgm-5.3-0 libnorm1 libbsd0 libmd0
  libtomlplusplus-dev libtomlplusplus3 libcli11-dev nlohmann-json3-dev
  libsentencepiece-dev libsentencepiece0
  libgtest-dev libgmock-dev libgloo-dev
  libssl-dev libssl3
  liburing-dev liburing2
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1 zlib1g-dev
  # pkg-config, for a machine that lacks it
  pkg-config pkgconf pkgconf-bin libpkgconf3
)

mkdir -p "$DIR"
missing=()
for p in "${PACKAGES[@]}"; do
  compgen -G "$DIR/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "download-debs: all ${#PACKAGES[@]} packages in $DIR"
  exit 0
fi
echo "download-debs: fetching ${missing[*]}"
# apt-get download writes to the current directory; its sandbox user may not write to DIR, which
# it says in a warning and then downloads as the caller.
(cd "$DIR" && apt-get download "${missing[@]}" 2>&1 | grep -v "unsandboxed" || true)
for p in "${missing[@]}"; do
  compgen -G "$DIR/${p}_*.deb" >/dev/null || {
    echo "download-debs: $p was not downloaded (no package lists? run apt-get update)" >&2
    exit 1
  }
done
echo "download-debs: ${#PACKAGES[@]} packages in $DIR ($(du -sh "$DIR" | cut -f1))"
