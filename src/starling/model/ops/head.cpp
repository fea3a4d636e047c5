#include "starling/model/ops/head.h"

#include <ATen/ATen.h>

namespace starling::model {

HeadOp::HeadOp(const ModelConfig& config, std::string weight_name)
    : config_(config), weight_name_(std::move(weight_name)) {}

at::Tensor HeadOp::forward(const std::vector<at::Tensor>& inputs,
                           const std::vector<at::Tensor>& params) {
  const at::Tensor& x = inputs.at(0);
  const at::Tensor& weight = params.at(0);
  const int64_t vocab = weight.size(0);
  // cuBLAS runs a product whose output width is not a multiple of 64 (GPT-2's 50257) on slow,
  // unaligned kernels: on an H100 the head took 40% of a 124M model's step. On a GPU the weight
  // gets zero rows up to the next multiple of 64 and the logits are cut back to the vocabulary
  // (a view; its row stride is the padded width), which gives the same values and gradients.
  constexpr int64_t kAlign = 64;
  const int64_t padded = (vocab + kAlign - 1) / kAlign * kAlign;
  if (!x.is_cuda() || padded == vocab) return at::linear(x, weight);
  return at::linear(x, at::constant_pad_nd(weight, {0, 0, 0, padded - vocab})).narrow(-1, 0, vocab);
}

double HeadOp::forward_flops_per_token(int64_t) const {
  return 2.0 * config_.d_model * config_.vocab_size;
}

std::vector<int64_t> HeadOp::output_shape(int64_t batch, int64_t seq_len) const {
  return {batch, seq_len, config_.vocab_size};
}

}  // namespace starling::model
