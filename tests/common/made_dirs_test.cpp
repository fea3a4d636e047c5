// The directories a command made on its way to its output: found before they are made (through
// "." and "..", with a trailing separator), and removed afterwards only while empty and only up
// to the outermost one made.
#include "starling/common/made_dirs.h"

#include <gtest/gtest.h>

#include <fstream>

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
  // A directory that was there (nothing made), and a "made" that is not an ancestor: untouched.
  remove_made_empty_dirs(root / "kept", fs::path());
  EXPECT_TRUE(fs::is_directory(root / "kept"));
  fs::create_directories(root / "e1" / "e2");
  remove_made_empty_dirs(root / "e1" / "e2", root / "kept");
  EXPECT_TRUE(fs::is_directory(root / "e1" / "e2"));
  EXPECT_TRUE(fs::is_directory(root / "kept"));
}

}  // namespace
}  // namespace starling
