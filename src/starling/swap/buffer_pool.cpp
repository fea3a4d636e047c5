#include "starling/swap/buffer_pool.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include "starling/common/cpu_runtime.h"
#include "starling/swap/tier.h"

namespace starling::swap {
namespace {

void free_aligned(void* p) { std::free(p); }

// Through malloc, freed buffers of a few MB would stay in the heap (glibc raises its mmap
// threshold after the first large free), and RSS would not fall when the pool lets them go.
struct Mapping {
  void* data;
  size_t bytes;
};

void unmap(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  ::munmap(m->data, m->bytes);
  delete m;
}

constexpr size_t kMapAtLeast = 64 * 1024;           // smaller buffers are not worth a mapping each
constexpr size_t kCachedAtLeast = size_t{1} << 20;  // what the caching CPU allocator keeps

at::DataPtr fresh_buffer(size_t size) {
  // Where the caching CPU allocator serves large tensors, a buffer the pool lets go stays mapped
  // in its cache, and the next fresh buffer of that size comes back without a page fault. A
  // mapping of its own would be given back at once and faulted in again, page by page, by the
  // next load: inside io_uring's submission for the disk tier, on the training thread.
  if (size >= kCachedAtLeast && caching_cpu_allocator_installed())
    return c10::GetCPUAllocator()->allocate(size);
  if (size >= kMapAtLeast) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return at::DataPtr(p, new Mapping{p, size}, &unmap, c10::Device(c10::kCPU));
  }
  void* p = std::aligned_alloc(kSwapAlign, size);
  if (p == nullptr) throw std::bad_alloc();
  return at::DataPtr(p, p, &free_aligned, c10::Device(c10::kCPU));
}

// A GPU's buffer comes from libtorch's caching allocator, taken out of an empty tensor.
at::DataPtr fresh_device_buffer(size_t size, c10::Device device) {
  at::Tensor t =
      at::empty({static_cast<int64_t>(size)}, at::TensorOptions().dtype(at::kByte).device(device));
  return t.storage().unsafeGetStorageImpl()->set_data_ptr(at::DataPtr(nullptr, device));
}

}  // namespace

at::DataPtr BufferPool::take(size_t bytes) {
  const size_t size = align_up(std::max<size_t>(bytes, 1));
  const auto it = free_.find(size);
  if (it == free_.end())
    return device_.is_cpu() ? fresh_buffer(size) : fresh_device_buffer(size, device_);
  at::DataPtr buffer = std::move(it->second.back());
  it->second.pop_back();
  if (it->second.empty()) free_.erase(it);
  kept_ -= static_cast<int64_t>(size);
  return buffer;
}

void BufferPool::give(at::DataPtr buffer, size_t bytes) {
  if (buffer.get() == nullptr) return;
  const size_t size = align_up(std::max<size_t>(bytes, 1));
  free_[size].push_back(std::move(buffer));
  kept_ += static_cast<int64_t>(size);
}

void BufferPool::trim(int64_t bytes) {
  while (kept_ > std::max<int64_t>(bytes, 0) && !free_.empty()) {
    auto it = std::prev(free_.end());
    kept_ -= static_cast<int64_t>(it->first);
    it->second.pop_back();  // frees the buffer
    if (it->second.empty()) free_.erase(it);
  }
}

}  // namespace starling::swap
