#include "starling/model/ops/norm.h"

#include <ATen/ATen.h>

#include "starling/common/torch_version.h"

namespace starling::model {

at::Tensor apply_norm(Arch arch, const NormWeights& w, const at::Tensor& x, double eps) {
  if (arch == Arch::kGpt2) return at::layer_norm(x, {x.size(-1)}, w.weight, w.bias, eps);
#if STARLING_TORCH_AT_LEAST(2, 4)
  // RMSNorm, x / sqrt(mean(x^2) + eps) * weight: libtorch's own, one fused kernel each way on
  // GPUs instead of six passes.
  return at::rms_norm(x, {x.size(-1)}, w.weight, eps);
#else
  // RMSNorm: x / sqrt(mean(x^2) + eps) * weight.
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true).add_(eps)) * w.weight;
#endif
}

FinalNormOp::FinalNormOp(const ModelConfig& config, NormWeights weights)
    : config_(config), w_(std::move(weights)) {}

at::Tensor FinalNormOp::forward(const std::vector<at::Tensor>& inputs) {
  return apply_norm(config_.arch, w_, inputs.at(0), config_.norm_eps);
}

std::vector<std::string> FinalNormOp::param_names() const {
  if (w_.bias_name.empty()) return {w_.weight_name};
  return {w_.weight_name, w_.bias_name};
}

double FinalNormOp::forward_flops_per_token(int64_t) const { return 5.0 * config_.d_model; }

std::vector<int64_t> FinalNormOp::output_shape(int64_t batch, int64_t seq_len) const {
  return {batch, seq_len, config_.d_model};
}

}  // namespace starling::model
