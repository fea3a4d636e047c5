// A model's parameters (or gradients) as one flat float32 vector: what the collectives send.
// Copying in and out costs one pass over the parameters per exchange, negligible next to a round
// of local steps, and leaves the model's own tensors untouched.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>

#include "starling/graph/param_store.h"

namespace starling::strategy {

class Flat {
 public:
  explicit Flat(graph::ParamStore& params);
  int64_t numel() const { return numel_; }
  // A new zeroed CPU float32 vector of numel() elements.
  at::Tensor zeros() const;
  // flat <- parameters (or their gradients; a missing gradient reads as zero).
  void gather(at::Tensor& flat) const;
  void gather_grads(at::Tensor& flat) const;
  // parameters (or gradients) <- flat.
  void scatter(const at::Tensor& flat);
  void scatter_grads(const at::Tensor& flat);

 private:
  graph::ParamStore& params_;
  int64_t numel_ = 0;
};

// The span a collective reads and writes; the tensor must be a contiguous CPU float32 vector.
std::span<float> as_span(at::Tensor& flat);

}  // namespace starling::strategy
