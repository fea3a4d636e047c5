// The directories a command makes on its way to the one it needs (an output directory and its
// missing parents), so that a command that fails before writing anything of use leaves none of
// them behind. Torch-free.
#pragma once

#include <filesystem>

namespace starling {

// The outermost of `dir` and its ancestors that does not exist yet: what
// std::filesystem::create_directories(dir) would make first, lexically normalised ("a/./b/"
// gives "a/b"). Empty when `dir` exists.
std::filesystem::path outermost_missing(const std::filesystem::path& dir);

// Undoes the making of `dir` up to `made` (outermost_missing's answer before it was made): removes
// `dir`, then each parent up to and including `made`, only while each is empty, and stops at the
// first that is not (something else was written there: it stays, and so do its parents). Nothing
// when `made` is empty or is neither `dir` nor one of its ancestors. Never throws.
void remove_made_empty_dirs(const std::filesystem::path& dir,
                            const std::filesystem::path& made) noexcept;

}  // namespace starling
