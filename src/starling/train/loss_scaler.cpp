#include "starling/train/loss_scaler.h"

#include <ATen/ATen.h>

#include <vector>

namespace starling::train {

namespace {

std::vector<at::Tensor> gradients(graph::ParamStore& params) {
  std::vector<at::Tensor> grads;
  for (auto& p : params.params())
    if (p.value.grad().defined()) grads.push_back(p.value.grad());
  return grads;
}

// The sum of the norms is finite exactly when every gradient element is.
bool all_finite(const std::vector<at::Tensor>& grads) {
  return grads.empty() || at::stack(at::_foreach_norm(grads, 2)).sum().isfinite().item<bool>();
}

}  // namespace

void LossScaler::multiply_gradients(graph::ParamStore& params, double factor) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads = gradients(params);
  if (!grads.empty()) at::_foreach_mul_(grads, factor);
}

bool LossScaler::unscale(graph::ParamStore& params) {
  multiply_gradients(params, unscale_factor());
  return finite(params);
}

bool LossScaler::finite(graph::ParamStore& params) {
  at::NoGradGuard no_grad;
  return all_finite(gradients(params));
}

bool LossScaler::update(bool finite) {
  if (!finite) {
    scale_ *= 0.5;
    good_steps_ = 0;
    ++skipped_;
    return true;
  }
  if (++good_steps_ >= growth_interval_) {
    scale_ *= 2.0;
    good_steps_ = 0;
  }
  return false;
}

}  // namespace starling::train
