#include "starling/common/device.h"

#include <ATen/Context.h>
#include <torch/version.h>

#ifdef STARLING_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <stdexcept>

namespace starling {
#ifdef STARLING_WITH_CUDA
namespace {
// The caching allocator's per-device state exists only once CUDA is initialised; its statistics
// calls reject a device before that. Any allocation on the device initialises it.
int cuda_index(const c10::Device& device) {
  (void)at::empty({0}, at::TensorOptions().device(device));
  return device.has_index() ? device.index() : c10::cuda::current_device();
}
}  // namespace
#endif

bool built_with_cuda() {
#ifdef STARLING_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::string runtime_summary() {
  std::string s = std::string("libtorch ") + TORCH_VERSION;
  if (!built_with_cuda()) return s + ", CPU only";
  const int gpus = at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0;
  return s + ", CUDA, " + std::to_string(gpus) + (gpus == 1 ? " GPU" : " GPUs");
}

void synchronize(const c10::Device& device) {
#ifdef STARLING_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device);
    c10::cuda::device_synchronize();
  }
#else
  (void)device;
#endif
}

void synchronize_current_stream(const c10::Device& device) {
#ifdef STARLING_WITH_CUDA
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(cuda_index(device)).synchronize();
#else
  (void)device;
#endif
}

int64_t peak_memory_bytes(const c10::Device& device) {
#ifdef STARLING_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_index(device));
    return stats.allocated_bytes[0].peak;  // [0]: the aggregate over small and large pools
  }
#else
  (void)device;
#endif
  return 0;
}

void reset_peak_memory(const c10::Device& device) {
#ifdef STARLING_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_index(device));
#else
  (void)device;
#endif
}

int64_t limit_memory(const c10::Device& device, int64_t bytes) {
#ifdef STARLING_WITH_CUDA
  if (device.is_cuda()) {
    const int index = cuda_index(device);
    c10::cuda::CUDAGuard guard(device);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess)
      throw std::invalid_argument("cannot read the memory of " + device.str());
    if (bytes <= 0 || bytes > static_cast<int64_t>(total))
      throw std::invalid_argument("a cap of " + std::to_string(bytes) + " bytes on " +
                                  device.str() + ", which has " + std::to_string(total));
    c10::cuda::CUDACachingAllocator::setMemoryFraction(
        static_cast<double>(bytes) / static_cast<double>(total),
        static_cast<c10::DeviceIndex>(index));
    return static_cast<int64_t>(total);
  }
#endif
  (void)bytes;
  throw std::invalid_argument("only a CUDA device's memory can be capped, not " + device.str());
}

}  // namespace starling
