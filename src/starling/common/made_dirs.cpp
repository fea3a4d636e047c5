#include "starling/common/made_dirs.h"

namespace starling {

namespace fs = std::filesystem;

fs::path outermost_missing(const fs::path& dir) {
  fs::path made;
  // A trailing separator ("out/") names the same directory as "out".
  fs::path p = dir.lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  for (; !p.empty() && !fs::exists(p); p = p.parent_path()) {
    made = p;
    if (p == p.parent_path()) break;
  }
  return made;
}

void remove_made_empty_dirs(const fs::path& dir, const fs::path& made) noexcept {
  if (made.empty()) return;
  std::error_code ec;
  fs::path p = dir.lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  for (; !p.empty(); p = p.parent_path()) {
    // fs::remove removes only an empty directory (or a file, which `dir` and its parents are not).
    if (!fs::is_directory(p, ec) || !fs::remove(p, ec) || p == made) break;
    if (p == p.parent_path()) break;
  }
}

}  // namespace starling
