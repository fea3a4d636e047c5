// The disk tier: one file under swap.dir, opened with O_DIRECT so swapped bytes really leave RAM
// (the page cache never holds them) and unlinked at once so nothing is left behind after a crash.
// Transfers go through io_uring (liburing), split into chunks so several are in flight on the
// device while the training thread computes. Completions are reaped by whoever waits. The file's
// blocks are allocated as room is reserved (fallocate), so a full disk stops a run at its start,
// with a message naming swap.dir, rather than at a write hours into training.
#pragma once

#include <filesystem>
#include <map>
#include <memory>

#include "starling/swap/tier.h"

struct io_uring;

namespace starling::swap {

// Bytes free to an unprivileged writer on the filesystem holding `dir` (or, if it does not exist
// yet, its nearest existing parent), or -1 when that cannot be told.
int64_t disk_free_bytes(const std::filesystem::path& dir);

// Error naming `dir` when its filesystem has less than `bytes` free: the disk tier will reserve
// `bytes` there (`what` says for what, in the message).
void check_disk_room(const std::filesystem::path& dir, int64_t bytes, const std::string& what);

class DiskTier final : public Tier {
 public:
  // Error naming `dir` when the file cannot be made, the filesystem lacks O_DIRECT, or the kernel
  // refuses io_uring.
  explicit DiskTier(const std::filesystem::path& dir);
  ~DiskTier() override;

  // Error naming the directory, the room reserved so far and the free space when the disk is full.
  uint64_t reserve(size_t bytes) override;
  Ticket write(uint64_t key, size_t offset, const void* src, size_t bytes) override;
  Ticket read(uint64_t key, size_t offset, void* dst, size_t bytes) override;
  void wait(Ticket ticket) override;
  bool done(Ticket ticket) override;
  std::string describe() const override;
  int64_t reserved_bytes() const override { return end_; }
  int64_t free_bytes() const override { return disk_free_bytes(dir_); }

 private:
  struct Chunk {
    Ticket ticket;
    bool write;
    char* buf;
    size_t bytes;
    uint64_t offset;
  };
  Ticket submit(bool write, uint64_t key, size_t offset, char* buf, size_t bytes);
  void queue(const Chunk& chunk);
  // Handles one completion; blocks for it when `block`. Returns false if none was ready.
  bool reap(bool block);

  std::filesystem::path dir_, path_;
  bool in_memory_ = false;  // swap.dir is on tmpfs or ramfs
  int fd_ = -1;
  std::unique_ptr<io_uring> ring_;
  std::map<uint64_t, size_t> extents_;  // key (file offset) -> reserved bytes
  uint64_t end_ = 0;
  Ticket issued_ = 0;
  std::map<Ticket, int> pending_;  // ticket -> chunks still in flight
  std::map<uint64_t, Chunk> chunks_;
  uint64_t next_chunk_ = 0;
  unsigned in_ring_ = 0;
};

}  // namespace starling::swap
