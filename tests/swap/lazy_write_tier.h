// A tier for tests of the swapper's ordering: host RAM whose writes complete only when waited for.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "starling/swap/tier.h"

namespace starling::swap::testing {

// Host RAM whose writes stay queued until waited for (done() says no before that), unlike any
// real tier's, which complete on their own: the ordering a caller relies on without waiting shows.
// `in_place`: the rooms are reachable where they lie, as host RAM's are below a CPU.
class LazyWriteTier final : public Tier {
 public:
  explicit LazyWriteTier(bool in_place = false)
      : inner_(make_tier("host", "")), in_place_(in_place) {}
  uint64_t reserve(size_t bytes) override { return inner_->reserve(bytes); }
  Ticket write(uint64_t key, size_t offset, const void* src, size_t bytes) override {
    writes_[++issued_] = {key, offset, src, bytes};
    return issued_;
  }
  Ticket read(uint64_t key, size_t offset, void* dst, size_t bytes) override {
    inner_->wait(inner_->read(key, offset, dst, bytes));  // at once, from what is written now
    return ++issued_;
  }
  void wait(Ticket ticket) override {
    const auto it = writes_.find(ticket);
    if (it == writes_.end()) return;
    const Write& w = it->second;
    inner_->wait(inner_->write(w.key, w.offset, w.src, w.bytes));
    writes_.erase(it);
  }
  bool done(Ticket ticket) override { return writes_.count(ticket) == 0; }
  char* in_place(uint64_t key) override { return in_place_ ? inner_->in_place(key) : nullptr; }
  std::string describe() const override { return "host RAM, writes completed when waited for"; }
  int64_t reserved_bytes() const override { return inner_->reserved_bytes(); }
  size_t queued() const { return writes_.size(); }

 private:
  struct Write {
    uint64_t key;
    size_t offset;
    const void* src;
    size_t bytes;
  };
  std::unique_ptr<Tier> inner_;
  bool in_place_;
  std::map<Ticket, Write> writes_;
  Ticket issued_ = 0;
};

}  // namespace starling::swap::testing
