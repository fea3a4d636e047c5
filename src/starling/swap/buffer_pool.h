// Aligned buffers for swapped tensors, kept for reuse. A swapped tensor's bytes come and go
// several times a step; a fresh buffer each time costs a page fault and a zeroed page for every
// 4 KB it holds, which on a virtual machine made a third of a swapped step. The same tensors load
// again step after step, so a freed buffer is kept by its size and handed to the next tensor of
// that size. The owner bounds what is kept (trim) so that the buffers in use plus the kept ones
// stay under its budget. A pool serves one device: RAM, or a GPU's memory (through libtorch's
// caching allocator there).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace starling::swap {

class BufferPool {
 public:
  explicit BufferPool(c10::Device device = c10::Device(c10::kCPU)) : device_(device) {}

  // A buffer spanning align_up(bytes) bytes (at least one page's alignment, contents undefined):
  // a kept one of that size when there is one, otherwise a fresh one. On the CPU, buffers of
  // 1 MiB or more come from the caching CPU allocator where it is installed
  // (common/cpu_runtime.h), so one the pool frees waits in that cache, still mapped, for the next
  // fresh buffer of its size; without it, buffers of 64 KB or more are their own mappings, given
  // back to the system when freed.
  at::DataPtr take(size_t bytes);
  // Keeps a buffer that take(bytes) returned, for a later take of the same size. A null buffer
  // is ignored.
  void give(at::DataPtr buffer, size_t bytes);
  // Frees kept buffers, largest first, until at most `bytes` are kept.
  void trim(int64_t bytes);
  // The bytes of the kept buffers.
  int64_t kept() const { return kept_; }
  c10::Device device() const { return device_; }

 private:
  c10::Device device_;
  std::map<size_t, std::vector<at::DataPtr>> free_;  // by aligned size
  int64_t kept_ = 0;
};

}  // namespace starling::swap
