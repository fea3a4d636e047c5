// One transformer layer's MLP block with its pre-norm and residual: x + mlp(norm(x)).
// gpt2: fc [d_ff, d_model] + bias, GELU (tanh approximation, as GPT-2), proj [d_model, d_ff] +
// bias. llama: SwiGLU; fc [2*d_ff, d_model] holds the gate (first half) and up (second half)
// projections stacked, proj [d_model, d_ff]; no biases. Input/output: [B, T, d_model].
#pragma once

#include "starling/graph/op.h"
#include "starling/model/config.h"
#include "starling/model/ops/norm.h"

namespace starling::model {

// The names of the block's parameters in the ParamStore.
struct MlpParams {
  NormParams norm;
  std::string fc_name, fc_bias_name, proj_name, proj_bias_name;  // bias names empty for llama
};

class MlpOp : public graph::Op {
 public:
  MlpOp(const ModelConfig& config, MlpParams params);
  std::string kind() const override { return "mlp"; }
  at::Tensor forward(const std::vector<at::Tensor>& inputs,
                     const std::vector<at::Tensor>& params) override;
  std::vector<std::string> param_names() const override;
  double forward_flops_per_token(int64_t seq_len) const override;
  std::vector<int64_t> output_shape(int64_t batch, int64_t seq_len) const override;

 private:
  ModelConfig config_;
  MlpParams p_;
};

}  // namespace starling::model
