// Token shards in llm.c's .bin layout: a header of 256 little-endian int32 (magic 20240520,
// version 1, token count, rest zero) followed by `count` uint16 tokens. Existing llm.c shards
// (e.g. GPT-2-tokenized corpora) load unchanged.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

namespace starling::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;  // uint16 tokens
inline constexpr std::size_t kShardHeaderInts = 256;
inline constexpr std::size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

// Reads and validates a shard's header against the file size. Throws DataError naming the file
// and what is wrong (missing, shorter than a header, bad magic, unknown version, token count that
// disagrees with the file size).
uint64_t read_shard_token_count(const std::filesystem::path& path);

// Writes a shard atomically (temp file in the same directory, fsync, rename). Every token must be
// below 65536; the caller checks the vocabulary.
void write_shard(const std::filesystem::path& path, std::span<const uint16_t> tokens);

// A validated shard mapped read-only into memory. Move-only.
class MappedShard {
 public:
  explicit MappedShard(const std::filesystem::path& path);
  ~MappedShard();
  MappedShard(MappedShard&& other) noexcept;
  MappedShard& operator=(MappedShard&& other) noexcept;
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  std::span<const uint16_t> tokens() const { return {tokens_, count_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void release() noexcept;
  std::filesystem::path path_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace starling::data
