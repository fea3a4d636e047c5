// The named parameters of a model, in a fixed order. Ops hold handles to these tensors; the
// optimizer, checkpoints and collectives address them by name. A peer that runs part of a model (a
// pipeline stage) holds only that part's parameters; the store also knows the names of the ones
// held elsewhere, so a checkpoint or a weights file of the whole model still loads into the part.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
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

  // Records a parameter of the model that another peer holds: no tensor here, and no entry in
  // params(). Throws std::logic_error if the name is already known.
  void add_elsewhere(const std::string& name);

  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  // Whether the model has a parameter of that name that this store does not hold.
  bool held_elsewhere(const std::string& name) const { return elsewhere_.count(name) > 0; }
  // The names of the model's parameters held elsewhere, in the order they were recorded.
  const std::vector<std::string>& elsewhere() const { return elsewhere_order_; }
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
  std::unordered_set<std::string> elsewhere_;
  std::vector<std::string> elsewhere_order_;
};

}  // namespace starling::graph
