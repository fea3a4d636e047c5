// Mean cross-entropy of logits [B, T, V] against targets [B, T] (int64). Output: a scalar.
#pragma once

#include "starling/graph/op.h"
#include "starling/model/config.h"

namespace starling::model {

class LossOp : public graph::Op {
 public:
  explicit LossOp(const ModelConfig& config) : config_(config) {}
  std::string kind() const override { return "loss"; }
  at::Tensor forward(const std::vector<at::Tensor>& inputs,
                     const std::vector<at::Tensor>& params) override;
  std::vector<std::string> param_names() const override { return {}; }
  double forward_flops_per_token(int64_t) const override { return 4.0 * config_.vocab_size; }
  std::vector<int64_t> output_shape(int64_t, int64_t) const override { return {}; }

 private:
  ModelConfig config_;
};

}  // namespace starling::model
