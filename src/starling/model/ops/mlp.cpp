#include "starling/model/ops/mlp.h"

#include <ATen/ATen.h>

namespace starling::model {

MlpOp::MlpOp(const ModelConfig& config, MlpParams params)
    : config_(config), p_(std::move(params)) {}

at::Tensor MlpOp::forward(const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& params) {
  graph::ParamReader p(params);  // in param_names() order
  const at::Tensor norm_weight = p.next(), norm_bias = p.next_if(!p_.norm.bias_name.empty());
  const at::Tensor fc = p.next(), fc_bias = p.next_if(!p_.fc_bias_name.empty());
  const at::Tensor proj = p.next(), proj_bias = p.next_if(!p_.proj_bias_name.empty());
  const at::Tensor& x = inputs.at(0);
  at::Tensor normed = apply_norm(config_.arch, norm_weight, norm_bias, x, config_.norm_eps);
  at::Tensor hidden = at::linear(normed, fc, fc_bias);
  if (config_.arch == Arch::kGpt2) {
    hidden = at::gelu(hidden, "tanh");
  } else {
    auto gate_up = hidden.chunk(2, -1);
    hidden = at::silu(gate_up[0]) * gate_up[1];
  }
  return x + at::linear(hidden, proj, proj_bias);
}

std::vector<std::string> MlpOp::param_names() const {
  std::vector<std::string> names = p_.norm.names();
  for (const auto* n : {&p_.fc_name, &p_.fc_bias_name, &p_.proj_name, &p_.proj_bias_name})
    if (!n->empty()) names.push_back(*n);
  return names;
}

double MlpOp::forward_flops_per_token(int64_t) const {
  const double d = config_.d_model, f = config_.ff_dim();
  const double matrices = config_.arch == Arch::kGpt2 ? 2.0 : 3.0;
  return 2.0 * matrices * d * f;
}

std::vector<int64_t> MlpOp::output_shape(int64_t batch, int64_t seq_len) const {
  return {batch, seq_len, config_.d_model};
}

}  // namespace starling::model
