// The directories a command makes on its way to the one it needs (an output directory and its
// missing parents), so that a command that fails before writing anything of use leaves none of
// them behind. Torch-free.
#pragma once

#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

namespace starling {

// The outermost of `dir` and its ancestors that does not exist yet: what
// std::filesystem::create_directories(dir) would make first, lexically normalised ("a/./b/"
// gives "a/b"). Empty when `dir` exists.
std::filesystem::path outermost_missing(const std::filesystem::path& dir);

// Undoes the making of `dir` up to `made` (outermost_missing's answer before it was made): removes
// `dir`, then each parent up to and including `made`, only while each is empty, and stops at the
// first that is not (something else was written there: it stays, and so do its parents). One
// that does not exist (the making stopped partway) is passed over. Nothing when `made` is empty
// or is neither `dir` nor one of its ancestors. Never throws.
void remove_made_empty_dirs(const std::filesystem::path& dir,
                            const std::filesystem::path& made) noexcept;

// remove_made_empty_dirs(dir, made) when it goes out of scope, and also when SIGINT or SIGTERM
// ends the process while it lives: its handler removes the same directories (each only while
// empty), writes `note` and a newline to stderr, and lets the signal end the process as its
// default action does. A signal the process ignored stays ignored; the guard's end gives both
// back to what they were. For a command that takes long before it writes anything of use and has
// no handler of its own (plan swap's profile); SIGHUP and SIGKILL still leave the directories.
// One guard at a time in a process.
class MadeDirsGuard {
 public:
  MadeDirsGuard(const std::filesystem::path& dir, const std::filesystem::path& made,
                std::string note);
  ~MadeDirsGuard();
  MadeDirsGuard(const MadeDirsGuard&) = delete;
  MadeDirsGuard& operator=(const MadeDirsGuard&) = delete;

 private:
  std::filesystem::path dir_, made_;
  std::vector<std::string> paths_;  // dir up to made, innermost first: what the handler removes
  std::string note_;
  struct sigaction old_int_ = {};
  struct sigaction old_term_ = {};
};

}  // namespace starling
