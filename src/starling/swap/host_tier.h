// The host-RAM tier: each tensor's bytes in an aligned buffer, copied by a worker thread so a
// load overlaps the training thread's compute. On a CPU machine this saves no memory (the tier
// and compute memory are the same RAM); it is the layout of a GPU machine, where compute memory
// is the device's and this tier is host RAM.
//
// On a CPU the copies compete with the computation for the same cores, and a thread that takes a
// core from one of the computation's workers stalls the whole parallel region until it gets the
// core back. So the worker runs at idle priority (SCHED_IDLE: only on a core nobody else wants),
// and a caller about to block on a copy makes the copies still queued itself instead.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "starling/swap/tier.h"

namespace starling::swap {

class HostTier final : public Tier {
 public:
  HostTier();
  ~HostTier() override;

  uint64_t reserve(size_t bytes) override;
  Ticket write(uint64_t key, size_t offset, const void* src, size_t bytes) override;
  Ticket read(uint64_t key, size_t offset, void* dst, size_t bytes) override;
  void wait(Ticket ticket) override;
  bool done(Ticket ticket) override;
  // The same RAM as a CPU's compute memory: the optimizer updates its rooms in place.
  char* in_place(uint64_t key) override { return buffers_.at(key); }
  std::string describe() const override { return "host RAM"; }
  bool copies_on_cpu() const override { return true; }
  int64_t reserved_bytes() const override { return reserved_; }

 private:
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
    Ticket ticket;
  };
  Ticket enqueue(Copy copy);
  void work();
  // Runs the front copy with mu_ released; false when nothing is queued.
  bool copy_one(std::unique_lock<std::mutex>& lock);
  bool complete(Ticket ticket) const;

  std::vector<char*> buffers_;
  int64_t reserved_ = 0;
  std::mutex mu_;
  std::condition_variable wake_, finished_;
  std::deque<Copy> queue_;
  // Two threads may copy at once (the worker and a waiter), so copies can finish out of order:
  // every ticket up to completed_ is done, and so are those in out_of_order_.
  Ticket issued_ = 0, completed_ = 0;
  std::set<Ticket> out_of_order_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace starling::swap
