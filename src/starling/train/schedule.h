// Learning-rate schedule: linear warmup from 0, then cosine decay to min_lr at the last step (or
// constant). A pure function of the step, so resumed runs follow the same curve.
#pragma once

#include <cstdint>

#include "starling/train/config.h"

namespace starling::train {

// Learning rate for optimizer step `step` (0-based) of `total_steps`.
double learning_rate(const OptimConfig& optim, int64_t step, int64_t total_steps);

}  // namespace starling::train
