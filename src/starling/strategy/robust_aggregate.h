// Robust aggregation of the peers' round updates (strategy.aggregation = "trimmed_mean"): every
// peer's whole update reaches every peer (an all-gather), and each element of the average is the
// mean of that element's values with the `trim` smallest and largest dropped, over the peers
// whose update is finite. One peer sending a scaled, sign-flipped or absurdly large update moves
// no element further than the honest peers' own spread, and a non-finite update is rejected
// whole and its sender named. The price is bandwidth: each peer sends and receives (P - 1) whole
// updates, P/2 times a ring all-reduce's 2 (P - 1) / P.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace starling::strategy {

struct TrimmedMeanOutcome {
  std::vector<int> non_finite;  // rows rejected for a non-finite value (flagged as contributing)
  int used = 0;                 // rows averaged
  int64_t trimmed = 0;          // values dropped at each end of every element
};

// `rows` is a contiguous CPU float tensor [P, n + 1]: row i is peer i's update followed by its
// contribution flag (> 0.5: it counts). Writes into `out` (n floats, CPU) the element-wise
// trimmed mean of the counted rows whose values are all finite, dropping min(trim, (used - 1) / 2)
// at each end (so at least one value remains). Deterministic: every peer computes the same bits
// from the same rows. With no row left, `out` is zeroed and `used` is 0.
TrimmedMeanOutcome trimmed_mean(const at::Tensor& rows, int64_t trim, at::Tensor out);

}  // namespace starling::strategy
