// Normalisation used before attention, before the MLP and at the end of the stack:
// LayerNorm with bias (gpt2) or RMSNorm (llama), both computed in the input dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include "starling/graph/op.h"
#include "starling/model/config.h"

namespace starling::model {

// The names of a norm's parameters in the ParamStore.
struct NormParams {
  std::string weight_name, bias_name;      // bias_name empty for RMSNorm
  std::vector<std::string> names() const;  // param_names() order: weight, then bias if any
};

// `bias` is undefined for RMSNorm.
at::Tensor apply_norm(Arch arch, const at::Tensor& weight, const at::Tensor& bias,
                      const at::Tensor& x, double eps);

// The final norm of the stack as a node of its own.
class FinalNormOp : public graph::Op {
 public:
  FinalNormOp(const ModelConfig& config, NormParams params);
  std::string kind() const override { return "norm"; }
  at::Tensor forward(const std::vector<at::Tensor>& inputs,
                     const std::vector<at::Tensor>& params) override;
  std::vector<std::string> param_names() const override;
  double forward_flops_per_token(int64_t seq_len) const override;
  std::vector<int64_t> output_shape(int64_t batch, int64_t seq_len) const override;

 private:
  ModelConfig config_;
  NormParams p_;
};

}  // namespace starling::model
