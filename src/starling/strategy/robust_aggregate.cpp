#include "starling/strategy/robust_aggregate.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

namespace starling::strategy {
namespace {

// Elements sorted at a time: bounds the sort's working set (values and indices of P rows).
constexpr int64_t kColumnsPerPass = int64_t{1} << 20;

}  // namespace

TrimmedMeanOutcome trimmed_mean(const at::Tensor& rows, int64_t trim, at::Tensor out) {
  if (rows.dim() != 2 || rows.size(1) < 1 || !rows.is_contiguous() ||
      rows.scalar_type() != at::kFloat || !rows.device().is_cpu())
    throw std::logic_error("trimmed_mean: rows must be a contiguous CPU float [P, n + 1]");
  const int64_t peers = rows.size(0), n = rows.size(1) - 1;
  if (out.numel() != n) throw std::logic_error("trimmed_mean: out must hold n elements");
  TrimmedMeanOutcome outcome;
  std::vector<int64_t> kept;
  const float* base = rows.data_ptr<float>();
  for (int64_t i = 0; i < peers; ++i) {
    if (!(base[i * (n + 1) + n] > 0.5f)) continue;  // not contributing this round
    if (!at::isfinite(rows[i].narrow(0, 0, n)).all().item<bool>()) {
      outcome.non_finite.push_back(static_cast<int>(i));
      continue;
    }
    kept.push_back(i);
  }
  outcome.used = static_cast<int>(kept.size());
  if (kept.empty()) {
    out.zero_();
    return outcome;
  }
  const int64_t k = outcome.used;
  const int64_t t = std::clamp<int64_t>(trim, 0, (k - 1) / 2);
  outcome.trimmed = t;
  const at::Tensor index = at::tensor(kept, at::kLong);
  for (int64_t b = 0; b < n; b += kColumnsPerPass) {
    const int64_t c = std::min(kColumnsPerPass, n - b);
    at::Tensor values = rows.narrow(1, b, c).index_select(0, index);  // [k, c]
    if (t > 0) values = std::get<0>(values.sort(0));
    // Rows added one after the other, in order: the same bits on every peer.
    at::Tensor acc = out.narrow(0, b, c);
    acc.copy_(values[t]);
    for (int64_t r = t + 1; r < k - t; ++r) acc.add_(values[r]);
    acc.div_(static_cast<double>(k - 2 * t));
  }
  return outcome;
}

}  // namespace starling::strategy
