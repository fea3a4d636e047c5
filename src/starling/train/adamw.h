// AdamW with decoupled weight decay, step for step the same arithmetic as torch.optim.AdamW
// (non-foreach), with its state held by parameter name so checkpoints and (later) sharded outer
// optimizers can address it. Weight decay skips parameters marked decay=false (norms, biases).
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
};

class AdamW {
 public:
  AdamW(graph::ParamStore& params, AdamWOptions options);

  // One update with learning rate `lr` from the parameters' current .grad() (a parameter
  // without a gradient is left alone).
  void step(double lr);
  int64_t steps() const { return steps_; }
  // Sets the update count used for bias correction (a peer adopting a swarm's state).
  void set_steps(int64_t steps) { steps_ = steps; }

  // Checkpoint state: "exp_avg.<param>" and "exp_avg_sq.<param>" for every parameter.
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  // Restores state written by state(); CheckpointError naming the tensor on a missing name or
  // shape mismatch.
  void load_state(const SafetensorsFile& file, int64_t steps);

 private:
  graph::ParamStore& params_;
  AdamWOptions options_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
};

// Scales all gradients so their global L2 norm is at most max_norm (if max_norm > 0), as
// torch.nn.utils.clip_grad_norm_. Returns the norm before clipping.
double clip_grad_norm(graph::ParamStore& params, double max_norm);

}  // namespace starling::train
