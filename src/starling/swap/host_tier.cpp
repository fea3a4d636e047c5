#include "starling/swap/host_tier.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace starling::swap {

HostTier::HostTier() : worker_([this] { work(); }) {}

HostTier::~HostTier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  worker_.join();
  for (void* b : buffers_) std::free(b);
}

uint64_t HostTier::reserve(size_t bytes) {
  void* p = std::aligned_alloc(kSwapAlign, align_up(bytes));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, align_up(bytes));  // rooms read as zeros until written (tier.h)
  buffers_.push_back(static_cast<char*>(p));
  reserved_ += static_cast<int64_t>(align_up(bytes));
  return buffers_.size() - 1;
}

Ticket HostTier::write(uint64_t key, size_t offset, const void* src, size_t bytes) {
  return enqueue({buffers_.at(key) + offset, src, bytes});
}

Ticket HostTier::read(uint64_t key, size_t offset, void* dst, size_t bytes) {
  return enqueue({dst, buffers_.at(key) + offset, bytes});
}

Ticket HostTier::enqueue(Copy copy) {
  Ticket t;
  {
    std::lock_guard lock(mu_);
    queue_.push_back(copy);
    t = ++issued_;
  }
  wake_.notify_one();
  return t;
}

void HostTier::wait(Ticket ticket) {
  std::unique_lock lock(mu_);
  finished_.wait(lock, [&] { return completed_ >= ticket; });
}

bool HostTier::done(Ticket ticket) {
  std::lock_guard lock(mu_);
  return completed_ >= ticket;
}

// Copies run in the order they were queued, so completion is a counter.
void HostTier::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    const Copy c = queue_.front();
    queue_.pop_front();
    lock.unlock();
    std::memcpy(c.dst, c.src, c.bytes);
    lock.lock();
    ++completed_;
    finished_.notify_all();
  }
}

}  // namespace starling::swap
