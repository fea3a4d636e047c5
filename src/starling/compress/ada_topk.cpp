#include "starling/compress/ada_topk.h"

#include <algorithm>

namespace starling::compress {

double adaptive_keep_ratio(const LinkBudget& b, double floor) {
  if (!(b.seconds > 0) || !(b.mbit_per_s > 0) || !(b.elements > 0) || !(b.dense_bytes > 0) ||
      !(b.sparse_bytes > 0))
    return 1.0;
  const double budget_bytes = b.seconds * b.mbit_per_s * 1e6 / 8 - std::max(b.fixed_bytes, 0.0);
  if (b.elements * b.dense_bytes <= budget_bytes) return 1.0;
  const double fit = std::max(budget_bytes, 0.0) / (b.elements * b.sparse_bytes);
  return std::clamp(std::max(fit, floor), 0.0, 1.0);
}

}  // namespace starling::compress
