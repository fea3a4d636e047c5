// Token embedding, plus learned positions for gpt2 (llama's positions are rotary, applied inside
// attention). Input: tokens [B, T] int64. Output: [B, T, d_model].
#pragma once

#include "starling/graph/op.h"
#include "starling/model/config.h"

namespace starling::model {

class EmbeddingOp : public graph::Op {
 public:
  // pos_name is empty for llama.
  EmbeddingOp(const ModelConfig& config, std::string tok_name, std::string pos_name);
  std::string kind() const override { return "embedding"; }
  at::Tensor forward(const std::vector<at::Tensor>& inputs,
                     const std::vector<at::Tensor>& params) override;
  // Learned positions from `start` on.
  at::Tensor forward_cached(const std::vector<at::Tensor>& inputs,
                            const std::vector<at::Tensor>& params, int64_t start,
                            std::vector<at::Tensor>& state) override;
  std::vector<std::string> param_names() const override;
  // The token table: the forward reads the tokens' rows only.
  bool reads_rows(size_t param) const override { return param == 0; }
  at::Tensor rows_read(size_t param, const std::vector<at::Tensor>& inputs) const override;
  double forward_flops_per_token(int64_t seq_len) const override;
  std::vector<int64_t> output_shape(int64_t batch, int64_t seq_len) const override;

 private:
  ModelConfig config_;
  std::string tok_name_, pos_name_;
};

}  // namespace starling::model
