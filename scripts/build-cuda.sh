#!/usr/bin/env bash
# Builds Starling against a CUDA libtorch: pip's torch (found through `python3 -c 'import torch'`)
# or an unpacked libtorch archive (TORCH_DIR=/path/to/libtorch).
#
#   scripts/build-cuda.sh [BUILD_DIR]                 # default build-cuda
#   TORCH_DIR=/opt/libtorch scripts/build-cuda.sh
#   DEPS_DEBS=/path/to/debs scripts/build-cuda.sh     # a machine without apt (see below)
#
# The other dependencies come from Debian's packages (scripts/install-deps.sh). On a machine
# where apt cannot install them (a container image with CUDA and pip torch, say), download the
# .deb files on a Debian 12 machine with scripts/download-debs.sh and point DEPS_DEBS at them:
# they are unpacked into BUILD_DIR/deps (never into /), their pkg-config files are rewritten to
# that prefix, and CMake looks there. Binaries built that way need, at run time,
#   export LD_LIBRARY_PATH=$PWD/BUILD_DIR/deps/usr/lib/x86_64-linux-gnu
# (absolute: ctest runs each test in a directory of its own). Tests: ctest --test-dir BUILD_DIR
# (the GPU tests run when a GPU is visible); scripts/gpu-check.sh builds and runs everything a
# CPU-only machine cannot check.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-cuda}
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$PWD/$BUILD_DIR" ;; esac
JOBS=${JOBS:-$(nproc)}
PYTHON=${PYTHON:-python3}
if [ -z "${TORCH_DIR:-}" ]; then
  TORCH_DIR=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)') || {
    echo "build-cuda: no TORCH_DIR and '$PYTHON' cannot import torch" >&2
    exit 1
  }
fi
echo "build-cuda: libtorch from $TORCH_DIR"

prefix_path="$TORCH_DIR"
if [ -n "${DEPS_DEBS:-}" ]; then
  compgen -G "$DEPS_DEBS/*.deb" >/dev/null || {
    echo "build-cuda: DEPS_DEBS=$DEPS_DEBS holds no .deb files (scripts/download-debs.sh)" >&2
    exit 1
  }
  deps="$BUILD_DIR/deps"
  if [ ! -f "$deps/.unpacked" ]; then
    mkdir -p "$deps"
    for deb in "$DEPS_DEBS"/*.deb; do dpkg -x "$deb" "$deps"; done
    # Debian's .pc files say prefix=/usr; make them name the unpacked tree instead. Their private
    # requirements (static linking only) name packages that are not there: drop them.
    find "$deps" -name '*.pc' -exec sed -i -e "s|^prefix=/usr|prefix=$deps/usr|" \
      -e '/^Requires.private:/d' {} +
    touch "$deps/.unpacked"
  fi
  export PATH="$deps/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_PATH="$deps/usr/lib/x86_64-linux-gnu/pkgconfig:$deps/usr/share/pkgconfig"
  export PKG_CONFIG_LIBDIR="$PKG_CONFIG_PATH"
  prefix_path="$prefix_path;$deps/usr"
  echo "build-cuda: dependencies unpacked in $deps"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix_path" -DSTARLING_PYTHON="$(command -v "$PYTHON")" \
  ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j"$JOBS"
