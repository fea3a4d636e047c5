// A tier holds the bytes of swapped tensors while their storage in compute memory is empty:
// host RAM, or a file on disk. Transfers are asynchronous: read/write queue a request and return a
// ticket, wait() blocks until that request is done, so a
// load can run while the caller computes. One thread (the training thread) uses a tier; it is not
// thread-safe. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace starling::swap {

// Buffers handed to a tier start at, and span, multiples of this (O_DIRECT's unit).
inline constexpr size_t kSwapAlign = 4096;
inline size_t align_up(size_t bytes) { return (bytes + kSwapAlign - 1) / kSwapAlign * kSwapAlign; }

using Ticket = uint64_t;

class Tier {
 public:
  virtual ~Tier() = default;

  // Reserves room for one tensor of `bytes` bytes; returns its key. The room reads as zeros until
  // it is written, so a tensor known to be zero (fresh AdamW moments) can start out in the tier
  // without ever being written or even held in compute memory.
  virtual uint64_t reserve(size_t bytes) = 0;
  // Queues a copy of `bytes` bytes from `src` into the tensor's room at `offset` / from there into
  // `dst`. Buffers and offsets are kSwapAlign-aligned, buffers span align_up(bytes), and they must
  // stay valid until the ticket is waited for.
  virtual Ticket write(uint64_t key, size_t offset, const void* src, size_t bytes) = 0;
  virtual Ticket read(uint64_t key, size_t offset, void* dst, size_t bytes) = 0;
  // Blocks until the request is complete. Throws starling::Error naming the tier on an I/O error.
  virtual void wait(Ticket ticket) = 0;
  // Whether the request is complete (never blocks).
  virtual bool done(Ticket ticket) = 0;
  // Makes the computation issued after this call see the request complete. A tier whose copies
  // run on the compute device's own queues (orders_on_device()) orders them there and returns at
  // once, so the host keeps issuing work while the copy lands; the others wait, as wait() does.
  virtual void order_after(Ticket ticket) { wait(ticket); }
  virtual bool orders_on_device() const { return false; }
  // Makes the copies queued after this call start once the request is complete (a load of bytes
  // a write is still storing, a buffer a write still reads): on the device where the tier can,
  // otherwise by waiting.
  virtual void order_copies_after(Ticket ticket) { wait(ticket); }

  // The tensor's room itself where the compute device can read and write it without a copy (host
  // RAM below a CPU), or nullptr. The optimizer then updates a tier-held operand where it lies
  // (ZeRO-Offload's idea: the step runs where the state lives). Only while no request on the room
  // is in flight.
  virtual char* in_place(uint64_t) { return nullptr; }

  virtual std::string describe() const = 0;  // "disk /path (O_DIRECT, io_uring)"
  // Whether reads and writes proceed at once, each at its own bandwidth (DMA engines each way),
  // rather than sharing one channel; the planner's time model follows it.
  virtual bool duplex() const { return false; }
  // Whether the CPU's own cores make the copies (memcpy by a thread) rather than a DMA engine:
  // below a computation on the same cores, every copy takes time from it (the planner adds the
  // copies to the compute instead of overlapping them).
  virtual bool copies_on_cpu() const { return false; }
  virtual int64_t reserved_bytes() const = 0;
  // Bytes the tier could still reserve, or -1 when it cannot tell (memory).
  virtual int64_t free_bytes() const { return -1; }
};

// kind "host" or "disk" (swap.tier); `dir` is the disk tier's directory. Error naming the
// directory when the disk tier cannot be made (no O_DIRECT there, io_uring refused).
std::unique_ptr<Tier> make_tier(const std::string& kind, const std::filesystem::path& dir);

}  // namespace starling::swap
