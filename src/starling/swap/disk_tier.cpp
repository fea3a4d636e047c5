#include "starling/swap/disk_tier.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/magic.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>

#include "starling/common/error.h"
#include "starling/swap/swap_config.h"

namespace starling::swap {
namespace {

// Each transfer is cut into chunks of this size so the device sees several requests at once.
constexpr size_t kChunk = size_t{8} << 20;
constexpr unsigned kRingEntries = 64;

std::string errno_text(int err) { return std::strerror(err); }

std::string bytes_text(int64_t bytes) { return format_bytes(static_cast<double>(bytes)); }

}  // namespace

int64_t disk_free_bytes(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::path at = std::filesystem::absolute(dir, ec);
  if (ec) return -1;
  while (!std::filesystem::exists(at, ec) && at.has_relative_path()) at = at.parent_path();
  struct statvfs st {};
  if (::statvfs(at.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

void check_disk_room(const std::filesystem::path& dir, int64_t bytes, const std::string& what) {
  // A filesystem of no blocks at all (/proc, /sys) is no disk, not a full one: the directory's,
  // or where it is still to be made, that of its nearest existing parent.
  std::error_code ec;
  std::filesystem::path at = std::filesystem::absolute(dir, ec);
  while (!ec && !std::filesystem::exists(at, ec) && at.has_relative_path()) at = at.parent_path();
  struct statvfs st {};
  if (!ec && ::statvfs(at.c_str(), &st) == 0 && st.f_blocks == 0)
    throw Error("swap.dir " + dir.string() +
                " is not on a disk (a filesystem without blocks, such as /proc or /sys): point "
                "swap.dir at a directory on a disk");
  const int64_t free = disk_free_bytes(dir);
  if (free < 0 || free >= bytes) return;
  throw Error("swap.dir " + dir.string() + ": " + bytes_text(free) + " free, but the disk tier " +
              "reserves room there for " + what + " (" + bytes_text(bytes) +
              "); free some space or point swap.dir at a larger disk");
}

DiskTier::DiskTier(const std::filesystem::path& dir)
    : dir_(dir), ring_(std::make_unique<io_uring>()) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  static int serial = 0;
  path_ = dir / (".starling-swap-" + std::to_string(::getpid()) + "-" + std::to_string(serial++) +
                 ".bin");
  // An unnamed file (O_TMPFILE) never appears in the directory: a crash or a signal at any moment
  // leaves nothing behind, and the directory stays empty for a caller that removes it (the
  // planner's probe on Ctrl-C, made_dirs.h). A filesystem without O_TMPFILE gets a named file,
  // unlinked as soon as it is open; a signal between the two leaves it.
  fd_ = ::open(dir.c_str(), O_RDWR | O_TMPFILE | O_DIRECT | O_CLOEXEC, 0600);
  const bool unnamed = fd_ >= 0;
  if (!unnamed && (errno == EOPNOTSUPP || errno == EISDIR))
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    const int err = errno;
    if (err == EINVAL)
      throw Error("swap.dir " + dir.string() +
                  ": its filesystem does not support O_DIRECT (tmpfs?); point swap.dir at a "
                  "directory on a disk");
    throw Error("swap.dir " + dir.string() + ": cannot create the swap file: " + errno_text(err));
  }
  if (!unnamed) ::unlink(path_.c_str());  // the file lives until the descriptor closes
  // Kernels from 6.6 give tmpfs O_DIRECT: the tier works there, but its bytes stay in RAM.
  struct statfs fs {};
  in_memory_ = ::fstatfs(fd_, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC);
  static std::atomic<bool> warned{false};  // the planner's probe and the run each open a tier
  if (in_memory_ && !warned.exchange(true))
    std::cerr << "swap.dir " << dir.string()
              << " is on tmpfs: the disk tier's bytes stay in RAM there, which saves no memory; "
                 "point swap.dir at a directory on a disk\n";
  if (const int r = io_uring_queue_init(kRingEntries, ring_.get(), 0); r < 0) {
    ::close(fd_);
    throw Error("swap.tier = \"disk\" needs io_uring, which the kernel refused (" + errno_text(-r) +
                "); use swap.tier = \"host\" or allow io_uring");
  }
  // Some filesystems accept the flag and fail the first transfer: find out now, not mid-step.
  void* probe = std::aligned_alloc(kSwapAlign, kSwapAlign);
  std::memset(probe, 0, kSwapAlign);
  try {
    const uint64_t key = reserve(kSwapAlign);
    wait(write(key, 0, probe, kSwapAlign));
    wait(read(key, 0, probe, kSwapAlign));
  } catch (...) {
    std::free(probe);
    io_uring_queue_exit(ring_.get());
    ::close(fd_);
    throw;
  }
  std::free(probe);
}

DiskTier::~DiskTier() {
  // Requests still in flight write into buffers their owners are about to free: drain them.
  try {
    while (!pending_.empty()) reap(true);
  } catch (...) {
  }
  io_uring_queue_exit(ring_.get());
  ::close(fd_);
}

std::string DiskTier::describe() const {
  return "disk " + path_.parent_path().string() +
         (in_memory_ ? " (tmpfs: in RAM; O_DIRECT, io_uring)" : " (O_DIRECT, io_uring)");
}

uint64_t DiskTier::reserve(size_t bytes) {
  const uint64_t key = end_;
  const size_t len = align_up(bytes);
  // The blocks are allocated now (they still read as zeros), so the disk cannot fill up under a
  // running step. A filesystem without fallocate gets a hole instead, allocated as it is written.
  if (len > 0 && ::fallocate(fd_, 0, static_cast<off_t>(end_), static_cast<off_t>(len)) != 0) {
    const int err = errno;
    if (err == ENOSPC || err == EDQUOT || err == EFBIG)
      throw Error("swap.dir " + dir_.string() + ": no room for the swap file (" +
                  bytes_text(static_cast<int64_t>(end_ + len)) + " reserved with this tensor, " +
                  bytes_text(disk_free_bytes(dir_)) + " still free: " + errno_text(err) +
                  "); free some space or point swap.dir at a larger disk");
    if (err != EOPNOTSUPP && err != ENOSYS)
      throw Error("swap tier " + describe() +
                  ": cannot allocate the swap file's room: " + errno_text(err));
    if (::ftruncate(fd_, static_cast<off_t>(end_ + len)) != 0)
      throw Error("swap tier " + describe() + ": cannot grow the swap file to " +
                  std::to_string(end_ + len) + " bytes: " + errno_text(errno));
  }
  extents_[key] = len;
  end_ += len;
  return key;
}

Ticket DiskTier::write(uint64_t key, size_t offset, const void* src, size_t bytes) {
  return submit(true, key, offset, const_cast<char*>(static_cast<const char*>(src)),
                align_up(bytes));
}

Ticket DiskTier::read(uint64_t key, size_t offset, void* dst, size_t bytes) {
  return submit(false, key, offset, static_cast<char*>(dst), align_up(bytes));
}

Ticket DiskTier::submit(bool write, uint64_t key, size_t at, char* buf, size_t bytes) {
  const auto it = extents_.find(key);
  if (it == extents_.end() || at % kSwapAlign != 0 || at + bytes > it->second)
    throw std::logic_error("DiskTier: transfer outside a reserved extent");
  const uint64_t offset = key + at;
  const Ticket t = ++issued_;
  if (bytes == 0) return t;  // nothing to wait for
  // Counted before queuing: with the ring full, queue() reaps completions, which may already be
  // this request's first chunks.
  pending_[t] = static_cast<int>((bytes + kChunk - 1) / kChunk);
  for (size_t done = 0; done < bytes; done += kChunk)
    queue({t, write, buf + done, std::min(kChunk, bytes - done), offset + done});
  io_uring_submit(ring_.get());
  return t;
}

void DiskTier::queue(const Chunk& chunk) {
  // At most kRingEntries in flight; a full ring is handed to the kernel and drained by one
  // completion first. (A sqe taken from the ring is submitted with whatever it holds, so one is
  // taken only when it will be filled at once.)
  while (in_ring_ >= kRingEntries) {
    io_uring_submit(ring_.get());
    reap(true);
  }
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  if (sqe == nullptr) {
    io_uring_submit(ring_.get());
    sqe = io_uring_get_sqe(ring_.get());
  }
  if (sqe == nullptr) throw std::logic_error("DiskTier: no submission entry free");
  const uint64_t id = next_chunk_++;
  chunks_[id] = chunk;
  if (chunk.write)
    io_uring_prep_write(sqe, fd_, chunk.buf, static_cast<unsigned>(chunk.bytes), chunk.offset);
  else
    io_uring_prep_read(sqe, fd_, chunk.buf, static_cast<unsigned>(chunk.bytes), chunk.offset);
  io_uring_sqe_set_data64(sqe, id);
  ++in_ring_;
}

bool DiskTier::reap(bool block) {
  io_uring_cqe* cqe = nullptr;
  // A signal handled while waiting (SIGINT, which stops a run gracefully at the next step; the
  // profiler's timer) interrupts the wait, not the transfers: wait again.
  int r = 0;
  do {
    r = block ? io_uring_wait_cqe(ring_.get(), &cqe) : io_uring_peek_cqe(ring_.get(), &cqe);
  } while (r == -EINTR);
  if (r == -EAGAIN || (!block && cqe == nullptr)) return false;
  if (r < 0) throw Error("swap tier " + describe() + ": io_uring wait failed: " + errno_text(-r));
  const uint64_t id = io_uring_cqe_get_data64(cqe);
  const int res = cqe->res;
  io_uring_cqe_seen(ring_.get(), cqe);
  --in_ring_;
  auto node = chunks_.extract(id);
  if (node.empty()) throw std::logic_error("DiskTier: a completion for no request");
  Chunk c = node.mapped();
  // Interrupted before it moved a byte, or cancelled by the kernel (a request handed to io_uring's
  // worker threads can complete with ECANCELED when a signal reaches this thread, which never
  // cancels its own): queued again, the same bytes at the same offset.
  if (res == -EINTR || res == -EAGAIN || res == -ECANCELED) {
    queue(c);
    io_uring_submit(ring_.get());
    return true;
  }
  if (res < 0)
    throw Error("swap tier " + describe() + ": " + (c.write ? "write" : "read") + " of " +
                std::to_string(c.bytes) + " bytes at offset " + std::to_string(c.offset) +
                " failed: " + errno_text(-res));
  if (res == 0)
    throw Error("swap tier " + describe() + ": " + (c.write ? "write" : "read") +
                " made no progress at offset " + std::to_string(c.offset));
  if (static_cast<size_t>(res) < c.bytes) {
    // A short transfer: queue the rest as a new chunk of the same request.
    queue({c.ticket, c.write, c.buf + res, c.bytes - res, c.offset + res});
    io_uring_submit(ring_.get());
    return true;
  }
  if (--pending_[c.ticket] == 0) pending_.erase(c.ticket);
  return true;
}

void DiskTier::wait(Ticket ticket) {
  while (pending_.count(ticket)) reap(true);
}

bool DiskTier::done(Ticket ticket) {
  while (reap(false)) {
  }
  return !pending_.count(ticket);
}

}  // namespace starling::swap
