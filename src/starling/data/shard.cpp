#include "starling/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <utility>

#include "starling/common/error.h"
#include "starling/data/atomic_file.h"

namespace starling::data {

// Tokens are mapped and written as raw little-endian uint16; a big-endian host would need swaps.
static_assert(std::endian::native == std::endian::little,
              "token shards assume a little-endian host");

namespace fs = std::filesystem;

namespace {

std::string quoted(const fs::path& path) {
  std::string text(1, '\'');
  text.append(path.native()).push_back('\'');
  return text;
}

std::string errno_text() { return std::strerror(errno); }

int32_t le_int32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 |
                              static_cast<uint32_t>(p[3]) << 24);
}

// Checks a header against the file size and returns the token count.
uint64_t check_header(const fs::path& path, const unsigned char* header, uint64_t file_bytes) {
  const int32_t magic = le_int32(header);
  if (magic != kShardMagic) {
    throw DataError("token shard " + quoted(path) + " has magic " + std::to_string(magic) +
                    ", expected " + std::to_string(kShardMagic) + " (not an llm.c token shard)");
  }
  const int32_t version = le_int32(header + 4);
  if (version != kShardVersion) {
    throw DataError("token shard " + quoted(path) + " has version " + std::to_string(version) +
                    ", expected " + std::to_string(kShardVersion) + " (uint16 tokens)");
  }
  const int32_t count = le_int32(header + 8);
  if (count < 0) {
    throw DataError("token shard " + quoted(path) + " has a negative token count (" +
                    std::to_string(count) + ")");
  }
  const uint64_t expected = kShardHeaderBytes + static_cast<uint64_t>(count) * sizeof(uint16_t);
  if (expected != file_bytes) {
    throw DataError("token shard " + quoted(path) + ": header says " + std::to_string(count) +
                    " tokens (" + std::to_string(expected) +
                    " bytes with the header) but the file is " + std::to_string(file_bytes) +
                    " bytes (truncated or corrupt)");
  }
  return static_cast<uint64_t>(count);
}

// Opens a shard and checks that it is at least a header long; returns the fd and its size.
int open_shard(const fs::path& path, uint64_t* file_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw DataError("token shard " + quoted(path) + " does not exist");
    throw DataError("cannot open token shard " + quoted(path) + ": " + errno_text());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError("token shard " + quoted(path) + " is not a regular file");
  }
  *file_bytes = static_cast<uint64_t>(st.st_size);
  if (*file_bytes < kShardHeaderBytes) {
    ::close(fd);
    throw DataError("token shard " + quoted(path) + " is " + std::to_string(*file_bytes) +
                    " bytes, shorter than the " + std::to_string(kShardHeaderBytes) +
                    "-byte header (truncated or not a shard)");
  }
  return fd;
}

bool read_fully(int fd, void* buffer, std::size_t bytes) {
  auto* out = static_cast<char*>(buffer);
  while (bytes > 0) {
    const ssize_t n = ::read(fd, out, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

bool write_fully(int fd, const std::byte* data, std::size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::write(fd, data, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

void write_file_atomically(const fs::path& path,
                           std::initializer_list<std::span<const std::byte>> chunks) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  // The pid keeps two processes preparing into the same directory from sharing a temp file.
  std::string temp_name = path.filename().string();
  temp_name.insert(0, 1, '.').append(".tmp.").append(std::to_string(::getpid()));
  const fs::path temp = dir / temp_name;
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw DataError("cannot create " + quoted(temp) + " (to write " + quoted(path) +
                    "): " + errno_text());
  }
  auto fail = [&](const std::string& what) {
    const std::string reason = errno_text();
    ::close(fd);
    ::unlink(temp.c_str());
    throw DataError("cannot write " + quoted(path) + ": " + what + " failed: " + reason);
  };
  for (const auto& chunk : chunks) {
    if (!write_fully(fd, chunk.data(), chunk.size())) fail("write");
  }
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    const std::string reason = errno_text();
    ::unlink(temp.c_str());
    throw DataError("cannot write " + quoted(path) + ": close failed: " + reason);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = errno_text();
    ::unlink(temp.c_str());
    throw DataError("cannot rename " + quoted(temp) + " to " + quoted(path) + ": " + reason);
  }
  // Persist the rename itself; without this a crash can lose the new directory entry.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

uint64_t read_shard_token_count(const fs::path& path) {
  uint64_t file_bytes = 0;
  const int fd = open_shard(path, &file_bytes);
  std::array<unsigned char, kShardHeaderBytes> header{};
  const bool ok = read_fully(fd, header.data(), header.size());
  ::close(fd);
  if (!ok) throw DataError("cannot read the header of token shard " + quoted(path));
  return check_header(path, header.data(), file_bytes);
}

void write_shard(const fs::path& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<std::size_t>(INT32_MAX)) {
    throw DataError("cannot write token shard " + quoted(path) + ": " +
                    std::to_string(tokens.size()) +
                    " tokens exceed the header's int32 count; cut smaller shards");
  }
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  write_file_atomically(path, {std::as_bytes(std::span(header)), std::as_bytes(tokens)});
}

MappedShard::MappedShard(const fs::path& path) : path_(path) {
  uint64_t file_bytes = 0;
  const int fd = open_shard(path, &file_bytes);
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string reason = map == MAP_FAILED ? errno_text() : "";
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) throw DataError("cannot mmap token shard " + quoted(path) + ": " + reason);
  map_ = map;
  map_bytes_ = file_bytes;
  try {
    // Validating the mapped bytes (not a separate read) checks exactly what the loader will use.
    count_ = check_header(path, static_cast<const unsigned char*>(map_), file_bytes);
  } catch (...) {
    release();
    throw;
  }
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map_) + kShardHeaderBytes);
}

MappedShard::~MappedShard() { release(); }

MappedShard::MappedShard(MappedShard&& other) noexcept { *this = std::move(other); }

MappedShard& MappedShard::operator=(MappedShard&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

void MappedShard::release() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  count_ = 0;
}

}  // namespace starling::data
