#include "starling/model/ops/head.h"

#include <ATen/ATen.h>

namespace starling::model {

HeadOp::HeadOp(const ModelConfig& config, std::string weight_name, at::Tensor weight)
    : config_(config), weight_name_(std::move(weight_name)), weight_(std::move(weight)) {}

at::Tensor HeadOp::forward(const std::vector<at::Tensor>& inputs) {
  return at::linear(inputs.at(0), weight_);
}

double HeadOp::forward_flops_per_token(int64_t) const {
  return 2.0 * config_.d_model * config_.vocab_size;
}

std::vector<int64_t> HeadOp::output_shape(int64_t batch, int64_t seq_len) const {
  return {batch, seq_len, config_.vocab_size};
}

}  // namespace starling::model
