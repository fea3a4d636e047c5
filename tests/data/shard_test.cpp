#include "starling/data/shard.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "starling/common/error.h"
#include "test_util.h"

namespace starling::data {
namespace {

using testing::TempDir;

// Writes a raw file: a header with the given fields followed by `token_bytes` zero bytes.
void write_raw_shard(const std::filesystem::path& path, int32_t magic, int32_t version,
                     int32_t count, std::size_t token_bytes) {
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string bytes(reinterpret_cast<const char*>(header.data()), kShardHeaderBytes);
  bytes.append(token_bytes, '\0');
  testing::write_text(path, bytes);
}

// Expects both the count reader and the mapper to reject `path` with a DataError that names the
// file and contains every string in `fragments`.
void expect_rejected(const std::filesystem::path& path, const std::vector<std::string>& fragments) {
  for (int use_map = 0; use_map < 2; ++use_map) {
    try {
      if (use_map) {
        MappedShard shard(path);
      } else {
        read_shard_token_count(path);
      }
      ADD_FAILURE() << "no error for " << path;
    } catch (const DataError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(path.string()), std::string::npos) << message;
      for (const auto& fragment : fragments) {
        EXPECT_NE(message.find(fragment), std::string::npos) << message << " lacks " << fragment;
      }
    }
  }
}

TEST(Shard, RoundTrip) {
  TempDir dir;
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 5000; ++i) tokens.push_back(static_cast<uint16_t>(i * 37));
  tokens.push_back(65535);
  const auto path = dir / "train_000.bin";
  write_shard(path, tokens);

  EXPECT_EQ(read_shard_token_count(path), tokens.size());
  EXPECT_EQ(std::filesystem::file_size(path), kShardHeaderBytes + 2 * tokens.size());
  MappedShard shard(path);
  EXPECT_EQ(shard.path(), path);
  ASSERT_EQ(shard.tokens().size(), tokens.size());
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), shard.tokens().begin()));

  // Only the shard is left behind: the temporary file was renamed into place.
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.path()))
    ++files;
  EXPECT_EQ(files, 1);
}

TEST(Shard, HeaderIsLlmcLayout) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {1, 2, 0x0304};
  write_shard(dir / "s.bin", tokens);
  const std::string bytes = testing::read_bytes(dir / "s.bin");
  ASSERT_EQ(bytes.size(), kShardHeaderBytes + 6);
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(bytes[i]); };
  // 20240520 = 0x0134D888, little-endian.
  EXPECT_EQ(byte(0), 0x88);
  EXPECT_EQ(byte(1), 0xD8);
  EXPECT_EQ(byte(2), 0x34);
  EXPECT_EQ(byte(3), 0x01);
  EXPECT_EQ(byte(4), 1);  // version
  EXPECT_EQ(byte(8), 3);  // count
  for (std::size_t i = 12; i < kShardHeaderBytes; ++i) ASSERT_EQ(byte(i), 0) << i;
  EXPECT_EQ(byte(kShardHeaderBytes + 4), 0x04);
  EXPECT_EQ(byte(kShardHeaderBytes + 5), 0x03);
}

TEST(Shard, EmptyShardAndOverwrite) {
  TempDir dir;
  const auto path = dir / "s.bin";
  write_shard(path, std::vector<uint16_t>{7, 8, 9});
  write_shard(path, {});
  EXPECT_EQ(read_shard_token_count(path), 0u);
  MappedShard shard(path);
  EXPECT_TRUE(shard.tokens().empty());
}

TEST(Shard, MoveTransfersTheMapping) {
  TempDir dir;
  write_shard(dir / "a.bin", std::vector<uint16_t>{1, 2, 3});
  write_shard(dir / "b.bin", std::vector<uint16_t>{4, 5});
  MappedShard a(dir / "a.bin");
  MappedShard moved(std::move(a));
  EXPECT_EQ(moved.tokens().size(), 3u);
  EXPECT_EQ(moved.tokens()[2], 3);
  MappedShard b(dir / "b.bin");
  b = std::move(moved);
  EXPECT_EQ(b.tokens().size(), 3u);
  EXPECT_EQ(b.path(), dir / "a.bin");
  std::vector<MappedShard> many;
  for (int i = 0; i < 20; ++i) many.emplace_back(dir / "b.bin");  // reallocation moves them
  for (const auto& shard : many) EXPECT_EQ(shard.tokens()[1], 5);
}

TEST(Shard, MissingFile) {
  TempDir dir;
  expect_rejected(dir / "nope.bin", {"does not exist"});
}

TEST(Shard, ShorterThanHeader) {
  TempDir dir;
  testing::write_text(dir / "short.bin", std::string(100, 'x'));
  expect_rejected(dir / "short.bin", {"100 bytes", "1024"});
}

TEST(Shard, BadMagic) {
  TempDir dir;
  write_raw_shard(dir / "magic.bin", 12345, 1, 0, 0);
  expect_rejected(dir / "magic.bin", {"12345", "20240520"});
}

TEST(Shard, UnknownVersion) {
  TempDir dir;
  write_raw_shard(dir / "version.bin", kShardMagic, 2, 0, 0);
  expect_rejected(dir / "version.bin", {"version 2", "expected 1"});
}

TEST(Shard, CountDisagreesWithSize) {
  TempDir dir;
  // Header promises 100 tokens (200 bytes) but only 150 bytes follow: a truncated shard.
  write_raw_shard(dir / "cut.bin", kShardMagic, 1, 100, 150);
  expect_rejected(dir / "cut.bin", {"100 tokens", "1224", "1174"});
  // Trailing garbage is rejected too.
  write_raw_shard(dir / "long.bin", kShardMagic, 1, 1, 4);
  expect_rejected(dir / "long.bin", {"1 tokens", "1026", "1028"});
}

TEST(Shard, NegativeCount) {
  TempDir dir;
  write_raw_shard(dir / "neg.bin", kShardMagic, 1, -5, 0);
  expect_rejected(dir / "neg.bin", {"-5"});
}

TEST(Shard, DirectoryIsNotAShard) {
  TempDir dir;
  std::filesystem::create_directories(dir / "sub.bin");
  expect_rejected(dir / "sub.bin", {"not a regular file"});
}

TEST(Shard, WriteIntoMissingDirectoryFails) {
  TempDir dir;
  EXPECT_THROW(write_shard(dir / "no" / "such" / "x.bin", std::vector<uint16_t>{1}), DataError);
}

}  // namespace
}  // namespace starling::data
