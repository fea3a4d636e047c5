#!/usr/bin/env bash
# Fails if a Starling binary resolves a C++ standard library symbol from anywhere but the C++
# runtime (libstdc++, libgcc_s, libc, libm).
#
#   scripts/check-bindings.sh BINARY [ARGS...]      e.g. build/starling --version
#
# Why: pip's libtorch exports copies of libstdc++ functions (std::filesystem among them) built by
# another compiler. If it precedes libstdc++ in a binary's lookup order, Starling's calls bind to
# those copies and crash (std::filesystem::remove_all did, when pruning checkpoints). CMakeLists
# puts libstdc++ first in every binary's DT_NEEDED; this check proves it with the dynamic linker's
# own report: LD_BIND_NOW resolves every symbol at start-up and LD_DEBUG=bindings lists where each
# went.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 BINARY [ARGS...]" >&2
  exit 2
fi
bin=$1
shift
[ -x "$bin" ] || { echo "check-bindings: $bin is not an executable" >&2; exit 2; }
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT="$log/ld" "$bin" "$@" >/dev/null 2>&1 || {
  echo "check-bindings: '$bin $*' failed to run" >&2
  exit 1
}
name=$(basename "$bin")
# Lines look like:  binding file /path/starling [0] to /path/libstdc++.so.6 [0]: normal symbol
# `_ZNSt10filesystem...' [GLIBCXX_3.4.26]. Standard-library symbols: mangled names in std::
# (_ZNSt, _ZNKSt, _ZSt, _ZTISt, ...) or versioned GLIBCXX_/CXXABI_. A binding to the binary itself
# is a copy relocation (a vtable copied into the executable) and is fine.
bad=$(cat "$log"/ld.* | grep -E "binding file [^ ]*/$name \[0\] to " |
  grep -E "symbol \`_Z(N|NK|T[ISV])?St|\[(GLIBCXX|CXXABI)_" |
  grep -vE " to ([^ ]*/)?($name|libstdc\+\+\.so[^ ]*|libgcc_s\.so[^ ]*|libc\.so[^ ]*|libm\.so[^ ]*) \[" ||
  true)
total=$(cat "$log"/ld.* | grep -cE "binding file [^ ]*/$name \[0\] to " || true)
if [ -n "$bad" ]; then
  echo "check-bindings: $name binds standard-library symbols outside the C++ runtime:" >&2
  echo "$bad" | sed -E 's/^ *[0-9]+:\s*//' | head -20 >&2
  exit 1
fi
if [ "$total" -eq 0 ]; then
  echo "check-bindings: the dynamic linker reported no bindings for $name (LD_DEBUG ignored?)" >&2
  exit 1
fi
echo "check-bindings: $name: $total bindings, every standard-library symbol from the C++ runtime"
