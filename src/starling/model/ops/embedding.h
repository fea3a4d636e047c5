// Token embedding, plus learned positions for gpt2 (llama's positions are rotary, applied inside
// attention). Input: tokens [B, T] int64. Output: [B, T, d_model].
#pragma once

#include "starling/graph/op.h"
#include "starling/model/config.h"

namespace starling::model {

class EmbeddingOp : public graph::Op {
 public:
  // pos_weight is undefined for llama.
  EmbeddingOp(const ModelConfig& config, std::string tok_name, at::Tensor tok_weight,
              std::string pos_name, at::Tensor pos_weight);
  std::string kind() const override { return "embedding"; }
  at::Tensor forward(const std::vector<at::Tensor>& inputs) override;
  std::vector<std::string> param_names() const override;
  double forward_flops_per_token(int64_t seq_len) const override;
  std::vector<int64_t> output_shape(int64_t batch, int64_t seq_len) const override;

 private:
  ModelConfig config_;
  std::string tok_name_, pos_name_;
  at::Tensor tok_, pos_;
};

}  // namespace starling::model
