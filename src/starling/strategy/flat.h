// A model's parameters (or gradients) as one flat float32 vector: what the strategies average.
// The vector lives where the model lives (flattening on a GPU is one device-side concatenation,
// with no host pass); Staging (staging.h) moves it to host memory for the network. Copying in and
// out costs one pass over the parameters per exchange, negligible next to a round of local steps,
// and leaves the model's own tensors untouched.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "starling/graph/param_store.h"

namespace starling::strategy {

class Flat {
 public:
  // All of `params`, or only those listed (ParamStore indices, ascending: a pipeline stage's own
  // parameters). gather() and scatter() then cover just those, in that order.
  explicit Flat(graph::ParamStore& params, std::optional<std::vector<int>> only = std::nullopt);
  int64_t numel() const { return numel_; }
  // The parameters the vector covers, in its order.
  const std::vector<int>& indices() const { return indices_; }
  // The parameters' device: where zeros() allocates and where the strategies' math runs.
  c10::Device device() const { return device_; }
  // A new zeroed float32 vector of numel() elements on device().
  at::Tensor zeros() const;
  // flat <- parameters. `flat` may live on another device (a host buffer for a state transfer):
  // it is then filled with one copy.
  void gather(at::Tensor& flat) const;
  // parameters <- flat, from any device.
  void scatter(const at::Tensor& flat);
  // The same for the gradients of some parameters (ParamStore indices, in that order; a
  // StepRunner's piece, whose gradients the runner has made present): `flat` holds their elements
  // one after the other, numel(params) of them.
  int64_t numel(std::span<const int> params) const;
  void gather_grads(std::span<const int> params, at::Tensor& flat) const;
  void scatter_grads(std::span<const int> params, const at::Tensor& flat);

 private:
  graph::ParamStore& params_;
  std::vector<int> indices_;
  int64_t numel_ = 0;
  c10::Device device_;
};

// The span a collective reads and writes; the tensor must be a contiguous float32 vector in the
// memory the backend works in (Collectives::buffers(): host memory, or the model's GPU).
std::span<float> as_span(at::Tensor& flat);

}  // namespace starling::strategy
