#include "starling/swap/swap_slot.h"

#include <ATen/ATen.h>
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
  if (!t.is_contiguous() || t.storage_offset() != 0 || t.storage().nbytes() != bytes)
    throw std::logic_error(
        "swap: a swapped tensor must be a contiguous tensor that owns all of its storage");
  // On a GPU, on the compute stream, like the work that made the tensor.
  if (bytes > 0) copy_bytes(t.device(), buffer.get(), storage_data(t), bytes);
  impl_of(t)->set_data_ptr(std::move(buffer));
}

bool can_keep_storage(const at::Tensor& t) {
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (!t.is_contiguous() || t.storage_offset() != 0 || t.storage().nbytes() != bytes) return false;
  const void* data = impl_of(t)->data_ptr().get();
  // A GPU's tier copies any address; the pool files a kept buffer under align_up(bytes), so it
  // must span that much.
  if (!t.device().is_cpu()) return bytes == align_up(bytes);
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
  at::DataPtr old = s->set_data_ptr(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
  return old;
}

void copy_bytes(c10::Device device, void* dst, const void* src, size_t bytes) {
  if (device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const auto u8 = at::TensorOptions().dtype(at::kByte).device(device);
  const auto n = static_cast<int64_t>(bytes);
  at::from_blob(dst, {n}, u8).copy_(at::from_blob(const_cast<void*>(src), {n}, u8));
}

void* storage_data(const at::Tensor& t) { return impl_of(t)->data_ptr().get(); }

}  // namespace starling::swap
