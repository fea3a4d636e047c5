#include "starling/compress/topk.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace starling::compress {

TopK top_k(const at::Tensor& t, int64_t k) {
  const int64_t n = t.numel();
  if (n > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("top_k: " + std::to_string(n) +
                                " entries do not fit 32-bit indices");
  if (k < 0 || k > n)
    throw std::invalid_argument("top_k: k = " + std::to_string(k) + " for " + std::to_string(n) +
                                " entries");
  const at::Tensor flat = t.detach().reshape({-1});
  at::Tensor idx;
  if (k == n) {
    idx = at::arange(n, at::TensorOptions().dtype(at::kLong).device(flat.device()));
  } else {
    // Magnitudes in fp32 whatever the dtype: topk on bf16 is not available everywhere.
    idx = std::get<1>(flat.to(at::kFloat).abs().topk(k, 0, /*largest=*/true, /*sorted=*/false));
    idx = std::get<0>(idx.sort());
  }
  TopK out;
  out.values = flat.index_select(0, idx).to(at::kCPU).contiguous();
  out.indices = idx.to(at::kCPU).to(at::kInt).contiguous();
  return out;
}

at::Tensor densify(const TopK& kept, at::IntArrayRef shape, c10::ScalarType dtype) {
  at::Tensor out = at::zeros(shape, at::TensorOptions().dtype(dtype));
  if (kept.indices.numel() > 0)
    out.view({-1}).index_copy_(0, kept.indices.to(at::kLong), kept.values.to(dtype));
  return out;
}

TopK ErrorFeedback::compress(uint64_t key, const at::Tensor& t, int64_t k) {
  at::Tensor e = t.detach().to(at::kCPU, at::kFloat).reshape({-1}).clone();
  auto it = residual_.find(key);
  if (it != residual_.end() && it->second.numel() == e.numel()) e.add_(it->second);
  TopK kept = top_k(e, k);
  // What was sent leaves the residual; the rest waits for the next gradient of this edge.
  e.index_fill_(0, kept.indices.to(at::kLong), 0.0);
  residual_[key] = e;
  kept.values = kept.values.to(t.scalar_type());
  return kept;
}

at::Tensor ErrorFeedback::residual(uint64_t key) const {
  const auto it = residual_.find(key);
  return it == residual_.end() ? at::Tensor() : it->second;
}

int64_t kept_entries(int64_t numel, double ratio) {
  if (numel <= 0) return 0;
  const double k = std::ceil(std::clamp(ratio, 0.0, 1.0) * static_cast<double>(numel));
  return std::clamp<int64_t>(static_cast<int64_t>(k), 1, numel);
}

}  // namespace starling::compress
