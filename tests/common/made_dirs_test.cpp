// The directories a command made on its way to its output: found before they are made (through
// "." and "..", with a trailing separator), and removed afterwards only while empty and only up
// to the outermost one made; under a guard, also when a signal ends the process.
#include "starling/common/made_dirs.h"

#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <stdexcept>

#include "../data/test_util.h"

namespace starling {
namespace {

namespace fs = std::filesystem;

TEST(MadeDirs, TheOutermostMissingDirectoryIsFoundNormalised) {
  data::testing::TempDir tmp;
  const fs::path root = tmp.path();
  EXPECT_EQ(outermost_missing(root), fs::path());
  EXPECT_EQ(outermost_missing(root / "a" / "b" / "c"), root / "a");
  EXPECT_EQ(outermost_missing(root / "a" / "b" / ""), root / "a");
  EXPECT_EQ(outermost_missing(root / "x" / ".." / "a" / "." / "b"), root / "a");
  fs::create_directories(root / "a");
  EXPECT_EQ(outermost_missing(root / "a" / "b" / "c"), root / "a" / "b");
}

TEST(MadeDirs, OnlyEmptyDirectoriesItMadeAreRemoved) {
  data::testing::TempDir tmp;
  const fs::path root = tmp.path();
  fs::create_directories(root / "kept");
  // Made a/b/c under root: all three go, root stays.
  fs::path made = outermost_missing(root / "a" / "b" / "c" / "");
  fs::create_directories(root / "a" / "b" / "c");
  remove_made_empty_dirs(root / "a" / "b" / "c" / "", made);
  EXPECT_FALSE(fs::exists(root / "a"));
  EXPECT_TRUE(fs::is_directory(root));
  // Something written beside it in a parent keeps that parent and the ones above.
  made = outermost_missing(root / "a" / "b" / "c");
  fs::create_directories(root / "a" / "b" / "c");
  std::ofstream(root / "a" / "other") << "x";
  remove_made_empty_dirs(root / "a" / "b" / "c", made);
  EXPECT_FALSE(fs::exists(root / "a" / "b"));
  EXPECT_TRUE(fs::exists(root / "a" / "other"));
  // A directory with something in it stays, and so does everything above it.
  fs::create_directories(root / "a" / "b");
  std::ofstream(root / "a" / "b" / "file") << "x";
  remove_made_empty_dirs(root / "a" / "b", root / "a");
  EXPECT_TRUE(fs::exists(root / "a" / "b" / "file"));
  // Made only the outermost (the making stopped partway): the missing ones are passed over.
  made = outermost_missing(root / "p" / "q");
  fs::create_directory(root / "p");
  remove_made_empty_dirs(root / "p" / "q", made);
  EXPECT_FALSE(fs::exists(root / "p"));
  // A directory that was there (nothing made), and a "made" that is not an ancestor: untouched.
  remove_made_empty_dirs(root / "kept", fs::path());
  EXPECT_TRUE(fs::is_directory(root / "kept"));
  fs::create_directories(root / "e1" / "e2");
  remove_made_empty_dirs(root / "e1" / "e2", root / "kept");
  EXPECT_TRUE(fs::is_directory(root / "e1" / "e2"));
  EXPECT_TRUE(fs::is_directory(root / "kept"));
}

extern "C" void ignore_test_signal(int) {}

TEST(MadeDirs, AGuardRemovesThemAtItsEndAndWhenASignalEndsTheProcess) {
  data::testing::TempDir tmp;
  const fs::path root = tmp.path(), dir = root / "a" / "b";
  // SIGTERM while the guard lives: the made directories go, the note is printed, and the signal
  // still ends the process (in a child: gtest's death test). The child leaves a mark beside
  // them, so that their absence afterwards means they were removed, not never made here.
  EXPECT_EXIT(
      {
        const MadeDirsGuard guard(dir, outermost_missing(dir), "stopped; nothing made");
        fs::create_directories(dir);
        std::ofstream(root / "made") << "x";
        std::raise(SIGTERM);
      },
      ::testing::KilledBySignal(SIGTERM), "stopped; nothing made");
  ASSERT_TRUE(fs::exists(root / "made")) << "the child did not run in " << root;
  EXPECT_FALSE(fs::exists(root / "a"));
  EXPECT_TRUE(fs::is_directory(root));
  // A signal in the middle of the making (only the outermost made yet) removes that one too.
  EXPECT_EXIT(
      {
        const MadeDirsGuard guard(dir, outermost_missing(dir), "stopped early");
        fs::create_directory(root / "a");
        std::raise(SIGINT);
      },
      ::testing::KilledBySignal(SIGINT), "stopped early");
  EXPECT_FALSE(fs::exists(root / "a"));
  // Its end removes them, and gives the signals back to what they were: a handler, or ignored
  // (which it leaves ignored meanwhile).
  struct sigaction before {};
  before.sa_handler = ignore_test_signal;
  sigemptyset(&before.sa_mask);
  ::sigaction(SIGTERM, &before, nullptr);
  ::signal(SIGINT, SIG_IGN);
  {
    const MadeDirsGuard guard(dir, outermost_missing(dir), "unused");
    fs::create_directories(dir);
    struct sigaction during {};
    ::sigaction(SIGINT, nullptr, &during);
    EXPECT_EQ(during.sa_handler, SIG_IGN);
    // One guard at a time: the handler has one set of directories to remove.
    EXPECT_THROW(MadeDirsGuard(root / "c", outermost_missing(root / "c"), "second"),
                 std::logic_error);
  }
  EXPECT_FALSE(fs::exists(root / "a"));
  struct sigaction term {
  }, interrupt{};
  ::sigaction(SIGTERM, nullptr, &term);
  ::sigaction(SIGINT, nullptr, &interrupt);
  EXPECT_EQ(term.sa_handler, ignore_test_signal);
  EXPECT_EQ(interrupt.sa_handler, SIG_IGN);
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGINT, SIG_DFL);
}

}  // namespace
}  // namespace starling
