// Helpers shared by the tests that compare Starling's model math with PyTorch's (Debian's
// python3-torch, run through STARLING_PYTHON): whether that Python has torch, and quoting for the
// shell that runs it. What it wrote is read back with testing::read_file (../cli/run_files.h).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace starling::testing {

// A loss computed by both sides agrees to this (absolute).
constexpr double kLossTol = 1e-5;

// Single-quoted for /bin/sh: temp paths are ours, but a quote in TMPDIR must not break the call.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// Tests that need the oracle skip without it; asked once per process.
inline bool python_has_torch() {
  static const bool ok = std::system(STARLING_PYTHON " -c 'import torch' >/dev/null 2>&1") == 0;
  return ok;
}

}  // namespace starling::testing
