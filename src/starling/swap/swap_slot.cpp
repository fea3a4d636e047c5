#include "starling/swap/swap_slot.h"

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace starling::swap {
namespace {

void free_aligned(void* p) { std::free(p); }

// A buffer of its own pages: mmap'd, so that freeing it (munmap) gives the memory back to the
// system at once. Through malloc, freed buffers of a few MB would stay in the heap (glibc raises
// its mmap threshold after the first large free), and RSS would not fall when a slot is evicted.
struct Mapping {
  void* data;
  size_t bytes;
};

void unmap(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  ::munmap(m->data, m->bytes);
  delete m;
}

constexpr size_t kMapAtLeast = 64 * 1024;  // smaller buffers are not worth a mapping each

at::DataPtr aligned_buffer(size_t bytes) {
  const size_t size = align_up(std::max<size_t>(bytes, 1));
  if (size >= kMapAtLeast) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return at::DataPtr(p, new Mapping{p, size}, &unmap, c10::Device(c10::kCPU));
  }
  void* p = std::aligned_alloc(kSwapAlign, size);
  if (p == nullptr) throw std::bad_alloc();
  return at::DataPtr(p, p, &free_aligned, c10::Device(c10::kCPU));
}

c10::StorageImpl* impl_of(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }

}  // namespace

void adopt_storage(const at::Tensor& t) {
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (!t.device().is_cpu() || !t.is_contiguous() || t.storage_offset() != 0 ||
      t.storage().nbytes() != bytes)
    throw std::logic_error(
        "swap: a swapped tensor must be a contiguous CPU tensor that owns all "
        "of its storage");
  at::DataPtr fresh = aligned_buffer(bytes);
  if (bytes > 0) std::memcpy(fresh.get(), t.storage().data(), bytes);
  impl_of(t)->set_data_ptr(std::move(fresh));
}

void allocate_storage(const at::Tensor& t, size_t bytes) {
  c10::StorageImpl* s = impl_of(t);
  s->set_data_ptr(aligned_buffer(bytes));
  s->set_nbytes(bytes);
}

void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = impl_of(t);
  s->set_data_ptr(at::DataPtr(nullptr, c10::Device(c10::kCPU)));
  s->set_nbytes(0);
}

void* storage_data(const at::Tensor& t) { return impl_of(t)->data_ptr().get(); }

}  // namespace starling::swap
