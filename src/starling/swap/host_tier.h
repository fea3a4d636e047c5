// The host-RAM tier: each tensor's bytes in an aligned buffer, copied by one worker thread so a
// load overlaps the training thread's compute. On a CPU machine this saves no memory (the tier
// and compute memory are the same RAM); it is the layout of a GPU machine, where compute memory
// is the device's and this tier is host RAM.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
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
  std::string describe() const override { return "host RAM"; }
  int64_t reserved_bytes() const override { return reserved_; }

 private:
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  Ticket enqueue(Copy copy);
  void work();

  std::vector<char*> buffers_;
  int64_t reserved_ = 0;
  std::mutex mu_;
  std::condition_variable wake_, finished_;
  std::deque<Copy> queue_;
  Ticket issued_ = 0, completed_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace starling::swap
