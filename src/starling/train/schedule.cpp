#include "starling/train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace starling::train {

double learning_rate(const OptimConfig& o, int64_t step, int64_t total_steps) {
  if (step < o.warmup_steps)
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  if (o.schedule == "constant") return o.lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - 1 - o.warmup_steps);
  const double progress = std::clamp(
      static_cast<double>(step - o.warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  return o.min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (o.lr - o.min_lr);
}

}  // namespace starling::train
