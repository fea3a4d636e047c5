// The LM head: logits = x W^T with W [vocab_size, d_model]. With tied embeddings W is the token
// embedding parameter, read by two nodes. Input [B, T, d_model], output [B, T, vocab_size].
#pragma once

#include "starling/graph/op.h"
#include "starling/model/config.h"

namespace starling::model {

class HeadOp : public graph::Op {
 public:
  HeadOp(const ModelConfig& config, std::string weight_name);
  std::string kind() const override { return "head"; }
  at::Tensor forward(const std::vector<at::Tensor>& inputs,
                     const std::vector<at::Tensor>& params) override;
  std::vector<std::string> param_names() const override { return {weight_name_}; }
  double forward_flops_per_token(int64_t seq_len) const override;
  std::vector<int64_t> output_shape(int64_t batch, int64_t seq_len) const override;

 private:
  ModelConfig config_;
  std::string weight_name_;
};

}  // namespace starling::model
