#include "starling/common/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "starling/common/error.h"

namespace starling {

DirLock::DirLock(const std::filesystem::path& dir, std::chrono::milliseconds wait) {
  const std::filesystem::path file = dir / ".lock";
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw ConfigError("cannot open " + file.string() +
                      " to claim the run directory: " + std::strerror(errno));
  const auto until = std::chrono::steady_clock::now() + wait;
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == ENOLCK || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL) {
      // A filesystem without locks (NFS mounted nolock, some FUSE ones): run unguarded.
      std::cerr << "note: cannot lock " << file.string() << " (" << std::strerror(errno)
                << "): nothing keeps a second run out of " << dir.string() << "\n";
      return;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const std::string why = std::strerror(errno);
      ::close(fd_);
      throw ConfigError("cannot lock " + file.string() + ": " + why);
    }
    if (std::chrono::steady_clock::now() >= until) {
      char pid[32] = {};
      const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
      ::close(fd_);
      throw ConfigError(
          dir.string() + " is in use by another run" +
          (n > 0 ? " (process " + std::string(pid, static_cast<size_t>(n)) + ")" : std::string()) +
          ": two runs in one directory would overwrite each other's metrics and "
          "checkpoints; wait for it to end, or set train.out_dir (--out) to another "
          "directory");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // The holder before this one may have removed the file (a run whose start failed tidies a
  // directory it made: train/session.h): a lock on a file no longer there keeps nothing out.
  struct stat held {
  }, named{};
  if (::fstat(fd_, &held) == 0 && (::stat(file.c_str(), &named) != 0 ||
                                   held.st_ino != named.st_ino || held.st_dev != named.st_dev)) {
    ::close(fd_);
    throw ConfigError(dir.string() +
                      " was removed while this run waited for it (another run that started "
                      "there failed); start this one again");
  }
  // The holder's pid, for the message another run gets.
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) == 0) (void)::pwrite(fd_, pid.data(), pid.size(), 0);
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

}  // namespace starling
