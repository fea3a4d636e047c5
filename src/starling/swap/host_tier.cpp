#include "starling/swap/host_tier.h"

#include <pthread.h>
#include <sched.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace starling::swap {

HostTier::HostTier()
    : worker_([this] {
        // Idle priority: the copies take only cores the computation leaves free (see the header).
        // Where the system refuses it, the worker runs at normal priority.
        sched_param none{};
        pthread_setschedparam(pthread_self(), SCHED_IDLE, &none);
        work();
      }) {}

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
    copy.ticket = t = ++issued_;
    queue_.push_back(copy);
  }
  wake_.notify_one();
  return t;
}

bool HostTier::complete(Ticket ticket) const {
  return ticket <= completed_ || out_of_order_.count(ticket) > 0;
}

bool HostTier::copy_one(std::unique_lock<std::mutex>& lock) {
  if (queue_.empty()) return false;
  const Copy c = queue_.front();
  queue_.pop_front();
  lock.unlock();
  std::memcpy(c.dst, c.src, c.bytes);
  lock.lock();
  out_of_order_.insert(c.ticket);
  while (!out_of_order_.empty() && *out_of_order_.begin() == completed_ + 1) {
    out_of_order_.erase(out_of_order_.begin());
    ++completed_;
  }
  finished_.notify_all();
  return true;
}

// The caller would block: it copies what is queued itself (in order, up to its own request),
// then waits only for a copy the worker is in the middle of.
void HostTier::wait(Ticket ticket) {
  std::unique_lock lock(mu_);
  while (!complete(ticket) && !queue_.empty() && queue_.front().ticket <= ticket) copy_one(lock);
  finished_.wait(lock, [&] { return complete(ticket); });
}

bool HostTier::done(Ticket ticket) {
  std::lock_guard lock(mu_);
  return complete(ticket);
}

void HostTier::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    copy_one(lock);
  }
}

}  // namespace starling::swap
