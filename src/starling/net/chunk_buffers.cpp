#include "starling/net/chunk_buffers.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

namespace starling::net {
namespace {

// Size classes are powers of two from 4 KiB to 16 MiB; larger messages are not pooled.
constexpr int kMinShift = 12, kMaxShift = 24;
// Free buffers kept, at most (the rest go back to the allocator). A collective streams eagerly,
// so up to about its whole tensor is in flight as chunks at its peak; keeping that much does not
// raise the peak, it only spares the next collective the faults. As heap_reuse.h's trim bound.
constexpr size_t kMaxFreeBytes = 1ull << 30;

class Pool {
 public:
  void* take(int shift) {
    {
      std::lock_guard lock(mutex_);
      auto& list = free_[shift - kMinShift];
      if (!list.empty()) {
        void* p = list.back();
        list.pop_back();
        free_bytes_ -= size_t{1} << shift;
        return p;
      }
    }
    void* p = std::malloc(size_t{1} << shift);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void give(void* p, int shift) {
    {
      std::lock_guard lock(mutex_);
      if (free_bytes_ + (size_t{1} << shift) <= kMaxFreeBytes) {
        free_[shift - kMinShift].push_back(p);
        free_bytes_ += size_t{1} << shift;
        return;
      }
    }
    std::free(p);
  }

 private:
  std::mutex mutex_;
  std::vector<void*> free_[kMaxShift - kMinShift + 1];
  size_t free_bytes_ = 0;
};

// Never destroyed: messages may be freed by ZeroMQ's threads during process exit.
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

void give_back(void* data, void* hint) {
  pool().give(data, static_cast<int>(reinterpret_cast<intptr_t>(hint)));
}

}  // namespace

zmq::message_t chunk_message(size_t bytes) {
  const int shift =
      std::max(kMinShift, static_cast<int>(std::bit_width(bytes > 0 ? bytes - 1 : 0)));
  if (shift > kMaxShift) return zmq::message_t(bytes);
  void* p = pool().take(shift);
  return zmq::message_t(p, bytes, give_back, reinterpret_cast<void*>(static_cast<intptr_t>(shift)));
}

}  // namespace starling::net
