// One tensor of the training state (a weight, its gradient, or an AdamW moment) whose bytes can
// leave compute memory. Its TensorImpl never changes, so everything that holds the tensor (the
// ParamStore, the optimizer, autograd's saved variables of a forward pass) keeps working: evicting
// empties the tensor's *storage* (its memory is freed, its size becomes 0) after the bytes are
// safely in the tier, and loading gives the storage a fresh buffer and reads the bytes back into
// it. Writing through the storage does not bump the tensor's version counter, so a forward pass's
// saved weights are valid again once they are reloaded before backward.
//
// States: kResident (the buffer is the truth; the tier copy is current unless `dirty`), kWriting
// (resident, a write to the tier in flight; freed when it completes), kOut (the tier is the truth,
// the storage is empty), kLoading (a fresh buffer, a read in flight).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <cstdint>

#include "starling/swap/tier.h"

namespace starling::swap {

struct SwapSlot {
  enum class State { kResident, kWriting, kOut, kLoading };

  at::Tensor tensor;  // shares its TensorImpl with the owner
  size_t bytes = 0;   // the tensor's bytes (contiguous, offset 0)
  uint64_t key = 0;   // its room in the tier
  State state = State::kResident;
  bool dirty = true;    // resident bytes newer than the tier's (nothing stored yet)
  Ticket io = 0;        // the transfer in flight (kWriting, kLoading)
  bool pinned = false;  // never evicted (a pinned group's weights and gradients)
  uint64_t guard = 0;   // equal to the swapper's epoch while the current window needs it
  bool busy = false;    // an operand the deferred optimizer update is rewriting in place

  bool resident() const { return state == State::kResident || state == State::kWriting; }
  // Bytes of compute memory the slot holds now (its aligned buffer), 0 when out.
  int64_t held() const { return state == State::kOut ? 0 : static_cast<int64_t>(align_up(bytes)); }
};

// Moves `t`'s bytes into `buffer` (kSwapAlign-aligned, spanning align_up of t's bytes; see
// BufferPool::take), which becomes its storage (the tier's transfers need the alignment).
// std::logic_error unless `t` is a contiguous tensor that starts its storage and spans all of it.
// On a GPU the copy is queued on the current stream.
void adopt_storage(const at::Tensor& t, at::DataPtr buffer);
// Whether `t`'s storage can go to the tier as it is, without adopt_storage's copy: a contiguous
// tensor spanning all of its storage, whose buffer on a CPU is a page-aligned block of the caching
// CPU allocator (common/cpu_runtime.h) at least align_up(bytes) long, and on a GPU (any address
// will do) exactly align_up(bytes) long. Autograd's gradients and the model's large weights are.
bool can_keep_storage(const at::Tensor& t);
// Gives the empty storage of `t` `buffer`, as its `bytes` bytes (contents undefined).
void allocate_storage(const at::Tensor& t, at::DataPtr buffer, size_t bytes);
// Takes the storage's buffer away and returns it; the storage's size becomes 0.
at::DataPtr free_storage(const at::Tensor& t);
// Copies `bytes` bytes within `device`'s memory: memcpy on a CPU, the current stream on a GPU.
void copy_bytes(c10::Device device, void* dst, const void* src, size_t bytes);
// The start of the storage's buffer.
void* storage_data(const at::Tensor& t);

}  // namespace starling::swap
