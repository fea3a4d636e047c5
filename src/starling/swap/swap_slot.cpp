#include "starling/swap/swap_slot.h"

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "starling/common/cpu_runtime.h"

namespace starling::swap {
namespace {

c10::StorageImpl* impl_of(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }

}  // namespace

void adopt_storage(const at::Tensor& t, at::DataPtr buffer) {
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (!t.device().is_cpu() || !t.is_contiguous() || t.storage_offset() != 0 ||
      t.storage().nbytes() != bytes)
    throw std::logic_error(
        "swap: a swapped tensor must be a contiguous CPU tensor that owns all "
        "of its storage");
  if (bytes > 0) std::memcpy(buffer.get(), t.storage().data(), bytes);
  impl_of(t)->set_data_ptr(std::move(buffer));
}

bool can_keep_storage(const at::Tensor& t) {
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (!t.device().is_cpu() || !t.is_contiguous() || t.storage_offset() != 0 ||
      t.storage().nbytes() != bytes)
    return false;
  const void* data = impl_of(t)->data_ptr().get();
  return reinterpret_cast<uintptr_t>(data) % kSwapAlign == 0 &&
         cached_cpu_block_bytes(data) >= align_up(bytes);
}

void allocate_storage(const at::Tensor& t, at::DataPtr buffer, size_t bytes) {
  c10::StorageImpl* s = impl_of(t);
  s->set_data_ptr(std::move(buffer));
  s->set_nbytes(bytes);
}

at::DataPtr free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = impl_of(t);
  at::DataPtr old = s->set_data_ptr(at::DataPtr(nullptr, c10::Device(c10::kCPU)));
  s->set_nbytes(0);
  return old;
}

void* storage_data(const at::Tensor& t) { return impl_of(t)->data_ptr().get(); }

}  // namespace starling::swap
