#include "starling/graph/autocast.h"

#include <ATen/autocast_mode.h>

#include <stdexcept>

#include "starling/common/torch_version.h"

namespace starling::graph {
namespace {

// libtorch 2.4 replaced the per-device functions (set_enabled for CUDA, set_cpu_enabled, ...)
// with ones that take the device type; 1.13 has only the former.
bool is_enabled(c10::DeviceType d) {
#if STARLING_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(d);
#else
  return d == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

void set_enabled(c10::DeviceType d, bool on) {
#if STARLING_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(d, on);
#else
  if (d == c10::DeviceType::CPU)
    at::autocast::set_cpu_enabled(on);
  else
    at::autocast::set_enabled(on);
#endif
}

c10::ScalarType get_dtype(c10::DeviceType d) {
#if STARLING_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(d);
#else
  return d == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                   : at::autocast::get_autocast_gpu_dtype();
#endif
}

void set_dtype(c10::DeviceType d, c10::ScalarType t) {
#if STARLING_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(d, t);
#else
  if (d == c10::DeviceType::CPU)
    at::autocast::set_autocast_cpu_dtype(t);
  else
    at::autocast::set_autocast_gpu_dtype(t);
#endif
}

}  // namespace

bool autocast_supported(c10::DeviceType device, c10::ScalarType dtype) {
  if (dtype == c10::ScalarType::Float) return true;
  if (device == c10::DeviceType::CUDA)
    return dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Half;
  if (device == c10::DeviceType::CPU) {
#if STARLING_TORCH_AT_LEAST(2, 1)
    return dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Half;
#else
    return dtype == c10::ScalarType::BFloat16;
#endif
  }
  return false;
}

AutocastScope::AutocastScope(c10::DeviceType device, c10::ScalarType dtype) : device_(device) {
  if (dtype == c10::ScalarType::Float) return;
  if (!autocast_supported(device, dtype))
    throw std::invalid_argument(std::string("autocast to ") + c10::toString(dtype) +
                                " is not supported on " + c10::DeviceTypeName(device) +
                                " by this libtorch");
  prev_enabled_ = is_enabled(device);
  prev_dtype_ = get_dtype(device);
  set_enabled(device, true);
  set_dtype(device, dtype);
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // The cache holds low-precision copies of the weights, valid only until they change.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_enabled(device_, prev_enabled_);
  set_dtype(device_, prev_dtype_);
}

}  // namespace starling::graph
