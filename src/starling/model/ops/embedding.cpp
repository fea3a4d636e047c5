#include "starling/model/ops/embedding.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace starling::model {

EmbeddingOp::EmbeddingOp(const ModelConfig& config, std::string tok_name, std::string pos_name)
    : config_(config), tok_name_(std::move(tok_name)), pos_name_(std::move(pos_name)) {}

at::Tensor EmbeddingOp::forward(const std::vector<at::Tensor>& inputs,
                                const std::vector<at::Tensor>& params) {
  graph::ParamReader p(params);
  const at::Tensor tok = p.next(), pos = p.next_if(!pos_name_.empty());
  const at::Tensor& tokens = inputs.at(0);
  const int64_t t = tokens.size(1);
  if (t > config_.seq_len)
    throw std::invalid_argument("embedding: sequence of " + std::to_string(t) +
                                " tokens exceeds model.seq_len " + std::to_string(config_.seq_len));
  at::Tensor x = at::embedding(tok, tokens);
  if (pos.defined()) x = x + pos.narrow(0, 0, t);
  return x;
}

at::Tensor EmbeddingOp::forward_cached(const std::vector<at::Tensor>& inputs,
                                       const std::vector<at::Tensor>& params, int64_t start,
                                       std::vector<at::Tensor>&) {
  graph::ParamReader p(params);
  const at::Tensor tok = p.next(), pos = p.next_if(!pos_name_.empty());
  const at::Tensor& tokens = inputs.at(0);
  const int64_t t = tokens.size(1);
  if (start + t > config_.seq_len)
    throw std::invalid_argument("embedding: positions up to " + std::to_string(start + t) +
                                " exceed model.seq_len " + std::to_string(config_.seq_len));
  at::Tensor x = at::embedding(tok, tokens);
  if (pos.defined()) x = x + pos.narrow(0, start, t);
  return x;
}

std::vector<std::string> EmbeddingOp::param_names() const {
  if (pos_name_.empty()) return {tok_name_};
  return {tok_name_, pos_name_};
}

at::Tensor EmbeddingOp::rows_read(size_t param, const std::vector<at::Tensor>& inputs) const {
  if (param != 0 || inputs.empty()) return {};
  return inputs[0].reshape({-1});
}

double EmbeddingOp::forward_flops_per_token(int64_t) const {
  return pos_name_.empty() ? 0.0 : static_cast<double>(config_.d_model);
}

std::vector<int64_t> EmbeddingOp::output_shape(int64_t batch, int64_t seq_len) const {
  return {batch, seq_len, config_.d_model};
}

}  // namespace starling::model
