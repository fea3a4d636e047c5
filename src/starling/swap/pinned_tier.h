// The tier below a GPU's memory: each tensor's bytes in page-locked (pinned) host RAM, copied by
// DMA on two side streams of the device (one loading, one storing), so loads and stores overlap
// each other and the compute stream's kernels. Every copy is queued behind the work the compute
// stream holds at that moment: a store reads what that work produced, and a load may overwrite
// a buffer that work still reads (a freed weight's buffer reused for another group). Tickets
// complete in the order of their stream, so done() and wait() look only at the oldest copies.
// Needs a libtorch built with the device's support; constructing it elsewhere throws.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "starling/swap/tier.h"

namespace starling::swap {

class PinnedTier final : public Tier {
 public:
  explicit PinnedTier(c10::Device device);
  ~PinnedTier() override;

  // Buffers given to write/read are in the device's memory; offsets and sizes need no alignment.
  uint64_t reserve(size_t bytes) override;
  Ticket write(uint64_t key, size_t offset, const void* src, size_t bytes) override;
  Ticket read(uint64_t key, size_t offset, void* dst, size_t bytes) override;
  void wait(Ticket ticket) override;
  bool done(Ticket ticket) override;
  // The compute stream waits for the copy's event; the host does not (tier.h).
  void order_after(Ticket ticket) override;
  bool orders_on_device() const override { return true; }
  // Both side streams wait for the copy's event.
  void order_copies_after(Ticket ticket) override;
  std::string describe() const override;
  bool duplex() const override { return true; }  // one side stream loads, another stores
  int64_t reserved_bytes() const override { return reserved_; }

 private:
  struct Lane {  // a side stream and its copies in flight, oldest first
    c10::Stream stream;
    std::deque<std::pair<Ticket, c10::Event>> in_flight;
  };
  Ticket copy(Lane& lane, const at::Tensor& dst, const at::Tensor& src);
  Lane* lane_of(Ticket ticket);
  const c10::Event* pending_event(Ticket ticket);  // null once the copy has landed
  void retire(Lane& lane, Ticket upto, bool block);
  at::Tensor on_device(const void* data, size_t bytes) const;

  c10::Device device_;
  std::vector<at::Tensor> rooms_;  // pinned uint8 tensors, by key
  int64_t reserved_ = 0;
  Lane loads_, stores_;
  Ticket issued_ = 0;
};

// ConfigError unless a tier of `kind` can lie below `compute`'s memory.
void check_tier_below(const std::string& kind, c10::Device compute);
// The tier of `kind` below `compute`'s memory: on a CPU, make_tier(kind, dir); on a GPU, "host"
// is the pinned tier, and "disk" a ConfigError (a third level below pinned RAM is not built).
std::unique_ptr<Tier> make_tier(const std::string& kind, const std::filesystem::path& dir,
                                c10::Device compute);

}  // namespace starling::swap
