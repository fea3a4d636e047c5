#include "starling/model/ops/embedding.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace starling::model {

EmbeddingOp::EmbeddingOp(const ModelConfig& config, std::string tok_name, at::Tensor tok_weight,
                         std::string pos_name, at::Tensor pos_weight)
    : config_(config),
      tok_name_(std::move(tok_name)),
      pos_name_(std::move(pos_name)),
      tok_(std::move(tok_weight)),
      pos_(std::move(pos_weight)) {}

at::Tensor EmbeddingOp::forward(const std::vector<at::Tensor>& inputs) {
  const at::Tensor& tokens = inputs.at(0);
  const int64_t t = tokens.size(1);
  if (t > config_.seq_len)
    throw std::invalid_argument("embedding: sequence of " + std::to_string(t) +
                                " tokens exceeds model.seq_len " + std::to_string(config_.seq_len));
  at::Tensor x = at::embedding(tok_, tokens);
  if (pos_.defined()) x = x + pos_.narrow(0, 0, t);
  return x;
}

std::vector<std::string> EmbeddingOp::param_names() const {
  if (pos_name_.empty()) return {tok_name_};
  return {tok_name_, pos_name_};
}

double EmbeddingOp::forward_flops_per_token(int64_t) const {
  return pos_.defined() ? static_cast<double>(config_.d_model) : 0.0;
}

std::vector<int64_t> EmbeddingOp::output_shape(int64_t batch, int64_t seq_len) const {
  return {batch, seq_len, config_.d_model};
}

}  // namespace starling::model
