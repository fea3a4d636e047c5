#include "starling/strategy/flat.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <vector>

namespace starling::strategy {
namespace {

c10::Device params_device(graph::ParamStore& params) {
  return params.params().empty() ? c10::Device(c10::kCPU) : params.params().front().value.device();
}

// One concatenation into `flat` (a single kernel on a GPU), through a temporary on the pieces'
// device when `flat` lives elsewhere.
void concatenate(const std::vector<at::Tensor>& pieces, at::Tensor& flat, c10::Device device) {
  if (pieces.empty()) return;
  if (flat.device() == device) {
    at::cat_out(flat, pieces, 0);
  } else {
    flat.copy_(at::cat(pieces, 0));
  }
}

}  // namespace

Flat::Flat(graph::ParamStore& params, std::optional<std::vector<int>> only)
    : params_(params), device_(params_device(params)) {
  if (only) {
    indices_ = std::move(*only);
  } else {
    indices_.resize(params.params().size());
    for (size_t i = 0; i < indices_.size(); ++i) indices_[i] = static_cast<int>(i);
  }
  numel_ = numel(indices_);
}

at::Tensor Flat::zeros() const {
  return at::zeros({numel_}, at::TensorOptions().dtype(at::kFloat).device(device_));
}

void Flat::gather(at::Tensor& flat) const {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> pieces;
  pieces.reserve(indices_.size());
  for (int i : indices_) pieces.push_back(params_.params()[i].value.detach().reshape({-1}));
  concatenate(pieces, flat, device_);
}

int64_t Flat::numel(std::span<const int> params) const {
  int64_t n = 0;
  for (int i : params) n += params_.params()[i].value.numel();
  return n;
}

void Flat::gather_grads(std::span<const int> params, at::Tensor& flat) const {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> pieces;
  pieces.reserve(params.size());
  for (int i : params) {
    const auto& p = params_.params()[i];
    pieces.push_back(p.value.grad().reshape({-1}));
  }
  concatenate(pieces, flat, device_);
}

void Flat::scatter(const at::Tensor& flat) {
  at::NoGradGuard no_grad;
  const at::Tensor src = flat.to(device_);  // one transfer, then device-local copies
  int64_t offset = 0;
  for (int i : indices_) {
    auto& p = params_.params()[i];
    const int64_t n = p.value.numel();
    p.value.copy_(src.narrow(0, offset, n).view(p.value.sizes()));
    offset += n;
  }
}

void Flat::scatter_grads(std::span<const int> params, const at::Tensor& flat) {
  at::NoGradGuard no_grad;
  const at::Tensor src = flat.to(device_);
  int64_t offset = 0;
  for (int i : params) {
    auto& p = params_.params()[i];
    const int64_t n = p.value.numel();
    p.value.mutable_grad().copy_(src.narrow(0, offset, n).view(p.value.sizes()));
    offset += n;
  }
}

std::span<float> as_span(at::Tensor& flat) {
  if (flat.scalar_type() != at::kFloat || !flat.is_contiguous())
    throw std::logic_error("as_span: the network sends contiguous float32 vectors only");
  return {flat.data_ptr<float>(), static_cast<size_t>(flat.numel())};
}

}  // namespace starling::strategy
