#include "starling/swap/swap_slot.h"

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace starling::swap {
namespace {

void free_aligned(void* p) { std::free(p); }

at::DataPtr aligned_buffer(size_t bytes) {
  void* p = std::aligned_alloc(kSwapAlign, align_up(std::max<size_t>(bytes, 1)));
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
