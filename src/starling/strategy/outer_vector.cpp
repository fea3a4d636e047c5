#include "starling/strategy/outer_vector.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "starling/strategy/state_tensors.h"
#include "starling/train/step_runner.h"

namespace starling::strategy {

OuterVector::OuterVector(const Flat& flat, graph::ParamStore& params, train::StepRunner* runner,
                         bool keep, Start start)
    : kept_(keep) {
  at::NoGradGuard no_grad;
  if (keep && runner == nullptr)
    throw std::logic_error("OuterVector: a kept vector needs the replica's step runner");
  if (!keep) {
    flat_ = flat.zeros();
    if (start == Start::parameters) flat.gather(flat_);
  }
  int64_t at = 0;
  for (const int i : flat.indices()) {
    const auto& p = params.params()[static_cast<size_t>(i)];
    names_.push_back(p.name);
    if (!keep) {
      parts_.push_back(flat_.narrow(0, at, p.value.numel()).view(p.value.sizes()));
      at += p.value.numel();
      continue;
    }
    // A swapped replica's budget holds none of it: the runner gives the tensor a room in its
    // tier, takes the values there (zeros take no bytes until written) and empties its storage.
    at::Tensor part = at::empty(p.value.sizes(), p.value.options().dtype(at::kFloat));
    const at::Tensor values =
        start == Start::parameters ? runner->read_state(p.value) : at::Tensor();
    if (!runner->keep_state(part, values))
      throw std::logic_error("OuterVector: the swapped replica's runner keeps no state");
    parts_.push_back(std::move(part));
  }
}

void OuterVector::append_to(std::vector<at::Tensor>& tensors) const {
  if (kept_)
    tensors.insert(tensors.end(), parts_.begin(), parts_.end());
  else
    tensors.push_back(flat_);
}

void OuterVector::checkpoint(std::vector<std::pair<std::string, at::Tensor>>& tensors,
                             const std::string& name) const {
  if (!kept_) {
    tensors.emplace_back(name, flat_);
    return;
  }
  for (size_t k = 0; k < parts_.size(); ++k)
    tensors.emplace_back(name + "." + names_[k], parts_[k]);
}

void OuterVector::restore(const SafetensorsFile& file, const std::string& name,
                          train::StepRunner* runner) {
  at::NoGradGuard no_grad;
  const bool whole = file.contains(name);
  if (whole && !kept_) {
    load_state_tensor(file, name, flat_);
    return;
  }
  // A tensor at a time: into the runner's keeping, or the flat vector's view of it.
  int64_t numel = 0;
  for (const at::Tensor& part : parts_) numel += part.numel();
  const at::Tensor* all = whole ? &state_tensor(file, name, numel) : nullptr;
  int64_t at = 0;
  for (size_t k = 0; k < parts_.size(); ++k) {
    const at::Tensor& part = parts_[k];
    const at::Tensor& values = all != nullptr
                                   ? all->narrow(0, at, part.numel())
                                   : state_tensor(file, name + "." + names_[k], part.numel());
    if (kept_)
      runner->write_state(part, values);
    else
      train::copy_state(part, values);
    at += part.numel();
  }
}

}  // namespace starling::strategy
