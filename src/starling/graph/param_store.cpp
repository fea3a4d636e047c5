#include "starling/graph/param_store.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace starling::graph {

at::Tensor ParamStore::add(const std::string& name, at::Tensor value, bool decay) {
  if (index_.count(name) || elsewhere_.count(name))
    throw std::logic_error("parameter registered twice: " + name);
  value = value.detach().requires_grad_(true);
  index_.emplace(name, params_.size());
  params_.push_back(Param{name, value, decay});
  return value;
}

void ParamStore::add_elsewhere(const std::string& name) {
  if (index_.count(name) || elsewhere_.count(name))
    throw std::logic_error("parameter registered twice: " + name);
  elsewhere_.insert(name);
  elsewhere_order_.push_back(name);
}

const Param& ParamStore::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    throw std::out_of_range(elsewhere_.count(name)
                                ? "parameter " + name + " is held by another peer"
                                : "no parameter named " + name);
  return params_[it->second];
}

Param& ParamStore::get(const std::string& name) {
  return const_cast<Param&>(static_cast<const ParamStore&>(*this).get(name));
}

int64_t ParamStore::numel() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.value.numel();
  return n;
}

int64_t ParamStore::bytes() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.value.numel() * static_cast<int64_t>(p.value.element_size());
  return n;
}

void ParamStore::zero_grad() {
  for (auto& p : params_) {
    if (p.value.grad().defined()) p.value.mutable_grad().reset();
  }
}

}  // namespace starling::graph
