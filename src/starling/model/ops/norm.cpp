#include "starling/model/ops/norm.h"

#include <ATen/ATen.h>

#include "starling/common/torch_version.h"

namespace starling::model {

std::vector<std::string> NormParams::names() const {
  if (bias_name.empty()) return {weight_name};
  return {weight_name, bias_name};
}

at::Tensor apply_norm(Arch arch, const at::Tensor& weight, const at::Tensor& bias,
                      const at::Tensor& x, double eps) {
  if (arch == Arch::kGpt2) return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
#if STARLING_TORCH_AT_LEAST(2, 4)
  // RMSNorm, x / sqrt(mean(x^2) + eps) * weight: libtorch's own, one fused kernel each way on
  // GPUs instead of six passes.
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
#else
  // RMSNorm: x / sqrt(mean(x^2) + eps) * weight.
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true).add_(eps)) * weight;
#endif
}

FinalNormOp::FinalNormOp(const ModelConfig& config, NormParams params)
    : config_(config), p_(std::move(params)) {}

at::Tensor FinalNormOp::forward(const std::vector<at::Tensor>& inputs,
                                const std::vector<at::Tensor>& params) {
  graph::ParamReader p(params);
  const at::Tensor& weight = p.next();
  return apply_norm(config_.arch, weight, p.next_if(!p_.bias_name.empty()), inputs.at(0),
                    config_.norm_eps);
}

std::vector<std::string> FinalNormOp::param_names() const { return p_.names(); }

double FinalNormOp::forward_flops_per_token(int64_t) const { return 5.0 * config_.d_model; }

std::vector<int64_t> FinalNormOp::output_shape(int64_t batch, int64_t seq_len) const {
  return {batch, seq_len, config_.d_model};
}

}  // namespace starling::model
