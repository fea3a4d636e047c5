// Device-side facts and waits that libtorch exposes only through its CUDA headers. Starling's
// sources include this instead, so they build unchanged against a CPU-only libtorch: there these
// are no-ops (CPU work is synchronous) and memory figures are 0.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace starling {

// Whether this build was compiled against a CUDA libtorch (STARLING_WITH_CUDA).
bool built_with_cuda();

// "libtorch 2.11.0, CUDA, 1 GPU" / "libtorch 1.13.1, CPU only": the build and what it sees.
std::string runtime_summary();

// Waits until all work queued on `device` has finished (a no-op on CPUs).
void synchronize(const c10::Device& device);
// Waits until the work queued on `device`'s current stream (the computation's) has finished,
// while other streams (a swap tier's copies) go on. A no-op on CPUs.
void synchronize_current_stream(const c10::Device& device);

// Peak bytes held by libtorch's CUDA caching allocator on `device` since the last reset (0 on
// CPUs), and the reset.
int64_t peak_memory_bytes(const c10::Device& device);
void reset_peak_memory(const c10::Device& device);

// Caps what libtorch's CUDA caching allocator may hold on `device` at `bytes` (as PyTorch's
// set_per_process_memory_fraction): an allocation beyond it fails as if the card were that small.
// Returns the card's total memory. std::invalid_argument for a CPU, for a build without CUDA, or
// for a cap above the card's memory.
int64_t limit_memory(const c10::Device& device, int64_t bytes);

}  // namespace starling
