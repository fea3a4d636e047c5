#include "starling/strategy/flat.h"

#include <ATen/ATen.h>

namespace starling::strategy {

Flat::Flat(graph::ParamStore& params) : params_(params), numel_(params.numel()) {}

at::Tensor Flat::zeros() const { return at::zeros({numel_}, at::kFloat); }

void Flat::gather(at::Tensor& flat) const {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& p : params_.params()) {
    const int64_t n = p.value.numel();
    flat.narrow(0, offset, n).copy_(p.value.reshape({n}));
    offset += n;
  }
}

void Flat::gather_grads(at::Tensor& flat) const {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& p : params_.params()) {
    const int64_t n = p.value.numel();
    if (p.value.grad().defined())
      flat.narrow(0, offset, n).copy_(p.value.grad().reshape({n}));
    else
      flat.narrow(0, offset, n).zero_();
    offset += n;
  }
}

void Flat::scatter(const at::Tensor& flat) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : params_.params()) {
    const int64_t n = p.value.numel();
    p.value.copy_(flat.narrow(0, offset, n).view(p.value.sizes()));
    offset += n;
  }
}

void Flat::scatter_grads(const at::Tensor& flat) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : params_.params()) {
    const int64_t n = p.value.numel();
    if (!p.value.grad().defined()) p.value.mutable_grad() = at::zeros_like(p.value);
    p.value.mutable_grad().copy_(flat.narrow(0, offset, n).view(p.value.sizes()));
    offset += n;
  }
}

std::span<float> as_span(at::Tensor& flat) {
  return {flat.data_ptr<float>(), static_cast<size_t>(flat.numel())};
}

}  // namespace starling::strategy
