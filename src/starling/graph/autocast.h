// Mixed precision for the executor: runs the ops of a forward pass under libtorch's autocast, so
// matrix products and attention compute in bf16/fp16 while parameters, the residual stream,
// softmax, norms and the loss stay in fp32 (autocast's own per-op lists decide). Parameters are
// never converted: they stay the fp32 master weights the optimizer updates.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace starling::graph {

// Enables autocast for `device` with `dtype` for the scope's lifetime, and restores the previous
// state after. kFloat means "no autocast" and makes the scope a no-op. When the outermost scope
// ends, autocast's cache of down-cast weights is cleared: the optimizer is about to change them.
// Backward passes must run outside any scope (autograd already computes each gradient in the
// dtype its forward used).
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device, c10::ScalarType dtype);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::ScalarType::Float;
};

// Whether libtorch can autocast `dtype` on `device` (fp16 on CPU cannot, before libtorch 2.x).
bool autocast_supported(c10::DeviceType device, c10::ScalarType dtype);

}  // namespace starling::graph
