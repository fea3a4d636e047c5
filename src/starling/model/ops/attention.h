// One transformer layer's attention block with its pre-norm and residual:
//   x + proj(causal_attention(qkv(norm(x))))
// gpt2: LayerNorm, biases, learned positions already added. llama: RMSNorm, no biases, rotary
// positions on q and k (rotate-half convention), grouped-query attention.
// Weights: qkv [(n_head + 2*kv_heads)*head_dim, d_model] with q, k, v stacked in that order;
// proj [d_model, d_model]. Input/output: [B, T, d_model].
// The attention itself is at::scaled_dot_product_attention (fused kernels) with libtorch 2.x and
// the materialised masked softmax with 1.13; both compute the same function.
#pragma once

#include "starling/graph/op.h"
#include "starling/model/config.h"
#include "starling/model/ops/norm.h"

namespace starling::model {

// The names of the block's parameters in the ParamStore.
struct AttentionParams {
  NormParams norm;
  std::string qkv_name, qkv_bias_name, proj_name, proj_bias_name;  // bias names empty for llama
};

class AttentionOp : public graph::Op {
 public:
  AttentionOp(const ModelConfig& config, AttentionParams params);
  std::string kind() const override { return "attention"; }
  at::Tensor forward(const std::vector<at::Tensor>& inputs,
                     const std::vector<at::Tensor>& params) override;
  // The keys and values of earlier positions are `state` ([B, kv_heads, seq_len, head_dim] each,
  // filled up to `start`): the new positions' queries attend to them and to each other,
  // causally.
  at::Tensor forward_cached(const std::vector<at::Tensor>& inputs,
                            const std::vector<at::Tensor>& params, int64_t start,
                            std::vector<at::Tensor>& state) override;
  std::vector<std::string> param_names() const override;
  double forward_flops_per_token(int64_t seq_len) const override;
  std::vector<int64_t> output_shape(int64_t batch, int64_t seq_len) const override;

 private:
  // q [B, T, h, hd], k and v [B, T, kv, hd] of x's positions [start, start + T) (rotated for
  // llama), and the block's weights in the order the rest of forward needs them.
  struct Projected {
    at::Tensor q, k, v, proj, proj_bias;
  };
  Projected project(const at::Tensor& x, const std::vector<at::Tensor>& params, int64_t start);
  // Attention of q over k, v ([B, T, h or kv, hd]), causal, from position 0: [B, T, h * hd].
  at::Tensor attend(const at::Tensor& q, at::Tensor k, at::Tensor v);
  at::Tensor causal_bias(int64_t t, const at::Tensor& like);
  // x: [B, T, heads, head_dim] at positions [start, start + T).
  at::Tensor rotate(const at::Tensor& x, int64_t start, int64_t t);

  ModelConfig config_;
  AttentionParams p_;
  at::Tensor mask_;       // [seq_len, seq_len] additive causal mask, built once
  at::Tensor cos_, sin_;  // [seq_len, head_dim] rotary tables (llama), where activations are
};

}  // namespace starling::model
