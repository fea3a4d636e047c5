// AdamW with decoupled weight decay, step for step the same arithmetic as torch.optim.AdamW, with
// its state held by parameter name so checkpoints and sharded outer optimizers can address it.
// Weight decay skips parameters marked decay=false (norms, biases). State is fp32, like the
// parameters (the master weights under mixed precision).
//
// Kernels: on CUDA with libtorch >= 2.1 one fused multi-tensor kernel per decay group
// (torch.optim.AdamW(fused=True)), which launches a handful of kernels for the whole model instead
// of five per parameter; elsewhere the per-parameter ops of torch's single-tensor AdamW, bit for
// bit (on CPUs libtorch's foreach ops are the same per-tensor loop, so nothing is lost there).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "starling/common/safetensors.h"
#include "starling/graph/param_store.h"

namespace starling::train {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  bool fused = true;  // the fused multi-tensor kernel where available (false: per-parameter ops)
  // The moments start as unwritten placeholders in RAM, whatever the parameters' device, so no
  // memory is committed for them (a swapping runner takes them over as zeros through
  // claim_zero_state() and keeps them in a slower tier: a model whose moments fit neither in RAM
  // nor on its GPU can then be built). Whatever is not claimed becomes zeros beside the
  // parameters at the first step().
  bool defer_zero_state = false;
};

class AdamW {
 public:
  AdamW(graph::ParamStore& params, AdamWOptions options);

  // One update with learning rate `lr` from the parameters' current .grad() (a parameter
  // without a gradient is left alone). Queues device work only: nothing waits for the device.
  void step(double lr);
  // Whether step() uses the fused multi-tensor kernel.
  bool fused() const { return fused_; }
  int64_t steps() const { return steps_; }
  // Sets the update count used for bias correction (a peer adopting a swarm's state).
  void set_steps(int64_t steps) { steps_ = steps; }

  // The moments of parameter `index` (ParamStore order), for a swapping runner that keeps them in
  // a slower tier and steps each parameter itself (update_elements below, after begin_step()).
  at::Tensor& exp_avg(size_t index) { return exp_avg_[index]; }
  at::Tensor& exp_avg_sq(size_t index) { return exp_avg_sq_[index]; }
  const AdamWOptions& options() const { return options_; }
  // Counts one update without touching any parameter: the caller applies update_part.
  void begin_step() { ++steps_; }
  // The update of one part of a parameter's elements (views or copies of its weight, gradient
  // and moments, on one device) at update count `steps`, with the kernel step() uses: the fused
  // one where step() is fused, update_elements otherwise. Every kernel is elementwise, so the
  // parts of a parameter end with the bits step() gives it whole.
  void update_part(at::Tensor& w, const at::Tensor& g, at::Tensor& m, at::Tensor& v, double lr,
                   bool decay, int64_t steps) const;
  // With defer_zero_state: true once, if the moments are still the unwritten allocation that
  // stands for zeros (no load_state() or step() since construction); the caller then treats
  // them as zeros and owns their contents from here. False otherwise, and on every later call.
  bool claim_zero_state();

  // Checkpoint state: "exp_avg.<param>" and "exp_avg_sq.<param>" for every parameter.
  // std::logic_error while deferred zeros are unclaimed (the tensors hold no values yet).
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  // Restores state written by state(); CheckpointError naming the tensor on a missing name or
  // shape mismatch. Deferred moments not yet claimed become the file's fp32 tensors themselves
  // (a checkpoint read by mapping stays in the page cache, not in the process's memory).
  void load_state(const SafetensorsFile& file, int64_t steps);

 private:
  void step_fused(double lr);
  void step_single(double lr);

  graph::ParamStore& params_;
  AdamWOptions options_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
  bool fused_ = false;
  bool zeros_pending_ = false;  // deferred zero moments not yet claimed or written
};

// One AdamW update of the elements of `w` from `g` with moments `m`, `v` (same shapes) at update
// count `steps`: the per-parameter arithmetic of step() without the fused kernel. Every operation
// is elementwise, so applying it to slices of a tensor gives the same bits as applying it to the
// whole tensor (a swapping runner streams large parameters through it in chunks).
void update_elements(at::Tensor& w, const at::Tensor& g, at::Tensor& m, at::Tensor& v, double lr,
                     bool decay, const AdamWOptions& options, int64_t steps);

// Scales all gradients so their global L2 norm is at most max_norm (if max_norm > 0), as
// torch.nn.utils.clip_grad_norm_ does: the scale is computed on the device, so nothing waits for
// it. Returns the norm before clipping as a 0-dim fp32 tensor (0 without gradients); .item() it
// only when it is reported.
at::Tensor clip_grad_norm(graph::ParamStore& params, double max_norm);

}  // namespace starling::train
