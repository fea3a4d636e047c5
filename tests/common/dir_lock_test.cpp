// The run directory's lock: a second holder is refused naming the first, and one that waited
// while the holder removed the lock file (a failed start tidying the directory it made) is told
// so instead of holding a lock on a file no longer there.
#include "starling/common/dir_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "starling/common/error.h"

namespace starling {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct LockDir {
  fs::path path = fs::temp_directory_path() / ("starling-dir-lock-" + std::to_string(::getpid()));
  LockDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~LockDir() { fs::remove_all(path); }
};

std::string error_of(const fs::path& dir, std::chrono::milliseconds wait) {
  try {
    DirLock lock(dir, wait);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(DirLock, ASecondHolderIsRefusedNamingTheFirst) {
  LockDir dir;
  {
    DirLock first(dir.path);
    // flock is per open file: a second open in this process conflicts like another process.
    const std::string e = error_of(dir.path, 100ms);
    EXPECT_NE(e.find("is in use by another run (process " + std::to_string(::getpid()) + ")"),
              std::string::npos)
        << e;
  }
  EXPECT_EQ(error_of(dir.path, 100ms), "") << "the lock outlived its holder";
}

TEST(DirLock, AWaiterWhoseFileWasRemovedIsToldSo) {
  LockDir dir;
  auto first = std::make_unique<DirLock>(dir.path);
  auto waiter = std::async(std::launch::async, [&] { return error_of(dir.path, 5s); });
  std::this_thread::sleep_for(200ms);  // the waiter has opened the file and polls the lock
  fs::remove(dir.path / ".lock");
  first.reset();
  const std::string e = waiter.get();
  EXPECT_NE(e.find("was removed while this run waited for it"), std::string::npos) << e;
  EXPECT_EQ(error_of(dir.path, 100ms), "") << "a fresh lock file could not be taken";
}

}  // namespace
}  // namespace starling
