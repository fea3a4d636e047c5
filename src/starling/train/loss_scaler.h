// Dynamic loss scaling for fp16 training (torch.cuda.amp.GradScaler's rule). fp16 has a narrow
// exponent range: small gradients underflow to zero unless the loss is multiplied by a large scale
// before backward. The gradients are divided by it again before clipping and the optimizer; a
// step whose gradients overflowed (inf/NaN) is skipped and the scale halved, and after
// `growth_interval` clean steps in a row the scale doubles. bf16 and fp32 need none of this.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "starling/graph/param_store.h"

namespace starling::train {

class LossScaler {
 public:
  explicit LossScaler(double initial_scale = 65536.0, int64_t growth_interval = 2000)
      : scale_(initial_scale), growth_interval_(growth_interval) {}

  // The factor to seed backward with (times 1/grad_accum).
  double scale() const { return scale_; }

  // What the gradients are multiplied by before anything reads them: 1 / scale(), exact (the
  // scale is a power of two). A step runner does it (StepRunner::unscale_next_step), a swapped
  // one a gradient at a time.
  double unscale_factor() const { return 1.0 / scale_; }

  // Multiplies every gradient in `params` by `factor`.
  static void multiply_gradients(graph::ParamStore& params, double factor);

  // Unscales every gradient in `params` (by unscale_factor()) and reports whether all of them
  // are finite: a whole step's at once.
  bool unscale(graph::ParamStore& params);

  // Whether every gradient is finite (this peer's own after the passes, or after a swarm's
  // exchange, which may bring in another peer's overflow). Reading that answer waits for the
  // device: fp16 pays one synchronisation per step for it.
  static bool finite(graph::ParamStore& params);

  // After the gradients' finiteness is known: grows or backs off the scale. Returns true when it
  // backed off: the step must be skipped (in a swarm, unless the peers' aggregate left this peer's
  // gradients out).
  bool update(bool finite);

  int64_t skipped() const { return skipped_; }

 private:
  double scale_;
  int64_t growth_interval_;
  int64_t good_steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace starling::train
