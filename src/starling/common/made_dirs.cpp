#include "starling/common/made_dirs.h"

#include <algorithm>

namespace starling {

namespace fs = std::filesystem;

namespace {

// `dir` normalised, without a trailing separator: the form outermost_missing answers in.
fs::path normal(const fs::path& dir) {
  fs::path p = dir.lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p;
}

}  // namespace

fs::path outermost_missing(const fs::path& dir) {
  fs::path made;
  for (fs::path p = normal(dir); !p.empty() && !fs::exists(p); p = p.parent_path()) {
    made = p;
    if (p == p.parent_path()) break;
  }
  return made;
}

void remove_made_empty_dirs(const fs::path& dir, const fs::path& made) noexcept {
  if (made.empty()) return;
  std::error_code ec;
  fs::path p = normal(dir);
  // Only `made` and what is under it: a caller's mismatched pair must not climb past it.
  const fs::path top = normal(made);
  if (std::mismatch(top.begin(), top.end(), p.begin(), p.end()).first != top.end()) return;
  for (; !p.empty(); p = p.parent_path()) {
    // fs::remove removes only an empty directory (or a file, which `dir` and its parents are not).
    if (!fs::is_directory(p, ec) || !fs::remove(p, ec) || p == top) break;
    if (p == p.parent_path()) break;
  }
}

}  // namespace starling
