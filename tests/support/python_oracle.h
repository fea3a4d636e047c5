// Helpers shared by the tests that compare Starling's model math with PyTorch's (Debian's
// python3-torch, run through STARLING_PYTHON): whether that Python has torch, quoting for the
// shell that runs it, and reading back what it wrote.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
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

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Tests that need the oracle skip without it; asked once per process.
inline bool python_has_torch() {
  static const bool ok = std::system(STARLING_PYTHON " -c 'import torch' >/dev/null 2>&1") == 0;
  return ok;
}

}  // namespace starling::testing
