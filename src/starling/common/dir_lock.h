// An exclusive lock on a run directory, so that two runs never write one directory at once: their
// metrics.jsonl lines would interleave (the second truncates the first's) and their checkpoints
// overwrite each other. flock(2) on DIR/.lock: the kernel releases it when the process ends,
// however it ends, so a killed run leaves nothing to clean up.
#pragma once

#include <chrono>
#include <filesystem>

namespace starling {

class DirLock {
 public:
  // Takes the lock on `dir` (which must exist), waiting up to `wait` for a holder that is ending
  // (a process just killed releases it within moments). ConfigError naming `dir` and the holding
  // process where another process keeps it.
  explicit DirLock(const std::filesystem::path& dir,
                   std::chrono::milliseconds wait = std::chrono::seconds(5));
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace starling
