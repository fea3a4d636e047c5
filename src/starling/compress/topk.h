// Top-k sparsification of the tensors that cross a pipeline link (AdaTopK, FusionLLM): only the
// k entries of largest magnitude travel, with their positions, and the receiver fills the rest
// with zeros. On activation gradients, error feedback keeps what was not sent and adds it to the
// next gradient of the same edge, so that over many micro-batches nothing is lost for good.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>

namespace starling::compress {

// The kept entries of a tensor: flat indices in ascending order (int32) and their values (the
// tensor's dtype), both 1-D on the CPU.
struct TopK {
  at::Tensor indices;
  at::Tensor values;
};

// The `k` entries of largest magnitude of `t` (any device; 0 <= k <= numel; ties broken by
// at::topk). std::invalid_argument for a k out of range or more than 2^31 - 1 entries.
TopK top_k(const at::Tensor& t, int64_t k);

// `kept` placed into zeros of `shape`, as `dtype`, on the CPU.
at::Tensor densify(const TopK& kept, at::IntArrayRef shape, c10::ScalarType dtype);

// Error feedback over a set of edges, each named by a key: compress(key, g, k) sends the top k
// of g plus the residual that edge kept from earlier calls, and keeps what it did not send.
// Residuals are fp32 and live on the CPU.
class ErrorFeedback {
 public:
  TopK compress(uint64_t key, const at::Tensor& t, int64_t k);
  // The residual kept for `key` (undefined if none yet).
  at::Tensor residual(uint64_t key) const;

 private:
  std::map<uint64_t, at::Tensor> residual_;
};

// How many entries of `numel` a `ratio` keeps: at least 1 (for a non-empty tensor), at most numel.
int64_t kept_entries(int64_t numel, double ratio);

}  // namespace starling::compress
