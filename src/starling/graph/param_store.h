// The named parameters of a model, in a fixed order. Ops hold handles to these tensors; the
// optimizer, checkpoints and collectives address them by name.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace starling::graph {

struct Param {
  std::string name;
  at::Tensor value;   // a leaf that requires grad; its .grad() accumulates across readers
  bool decay = true;  // weight decay applies (false for norms and biases)
};

class ParamStore {
 public:
  // Registers a new leaf parameter (requires_grad is set here). Throws std::logic_error on a
  // duplicate name: names are built by code, not read from users.
  at::Tensor add(const std::string& name, at::Tensor value, bool decay);

  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  // std::out_of_range naming the parameter if absent.
  const Param& get(const std::string& name) const;
  Param& get(const std::string& name);

  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }

  int64_t numel() const;
  int64_t bytes() const;
  // Drops every gradient (torch's set_to_none): the next backward hands each parameter a fresh
  // one instead of adding into a zeroed buffer, which saves a fill and an add per parameter per
  // step and keeps gradient memory free during the forward pass.
  void zero_grad();

 private:
  std::vector<Param> params_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace starling::graph
