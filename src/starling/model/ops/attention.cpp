#include "starling/model/ops/attention.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "starling/common/torch_version.h"

namespace starling::model {

AttentionOp::AttentionOp(const ModelConfig& config, AttentionParams params)
    : config_(config), p_(std::move(params)) {
  if (config_.arch == Arch::kLlama) {
    const int64_t hd = config_.head_dim();
    auto opts = at::TensorOptions().dtype(at::kDouble);
    at::Tensor inv_freq =
        at::pow(config_.rope_theta, -at::arange(0, hd, 2, opts) / static_cast<double>(hd));
    at::Tensor angles = at::outer(at::arange(config_.seq_len, opts), inv_freq);  // [T, hd/2]
    // rotate_half(x) * sin = [x2, x1] * [-sin, sin]: the sign lives in the table, so rotating
    // costs no negation pass.
    // Built in double on the host; rotate() moves them to the activations' device and dtype.
    cos_ = at::cat({angles, angles}, -1).cos();  // [T, hd]
    sin_ = at::cat({-angles, angles}, -1).sin();
  }
}

at::Tensor AttentionOp::causal_bias(int64_t t, const at::Tensor& like) {
  if (!mask_.defined() || mask_.scalar_type() != like.scalar_type() ||
      mask_.device() != like.device()) {
    const int64_t n = config_.seq_len;
    mask_ = at::full({n, n}, -std::numeric_limits<float>::infinity(), like.options())
                .triu_(1)
                .contiguous();
  }
  return mask_.narrow(0, 0, t).narrow(1, 0, t);
}

at::Tensor AttentionOp::rotate(const at::Tensor& x, int64_t start, int64_t t) {
  // The tables follow the activations (their device, and the dtype autocast computes in).
  if (cos_.device() != x.device() || cos_.scalar_type() != x.scalar_type()) {
    cos_ = cos_.to(x.options());
    sin_ = sin_.to(x.options());
  }
  const int64_t half = x.size(-1) / 2;
  at::Tensor cos = cos_.narrow(0, start, t).unsqueeze(1);  // [T, 1, hd] broadcasts over heads
  at::Tensor sin = sin_.narrow(0, start, t).unsqueeze(1);
  at::Tensor swapped = at::cat({x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return at::addcmul(x * cos, swapped, sin);
}

AttentionOp::Projected AttentionOp::project(const at::Tensor& x,
                                            const std::vector<at::Tensor>& params, int64_t start) {
  graph::ParamReader p(params);  // in param_names() order
  const at::Tensor norm_weight = p.next(), norm_bias = p.next_if(!p_.norm.bias_name.empty());
  const at::Tensor qkv_weight = p.next(), qkv_bias = p.next_if(!p_.qkv_bias_name.empty());
  Projected out;
  out.proj = p.next();
  out.proj_bias = p.next_if(!p_.proj_bias_name.empty());
  const int64_t b = x.size(0), t = x.size(1);
  const int64_t h = config_.n_head, kv = config_.kv_heads(), hd = config_.head_dim();
  at::Tensor normed = apply_norm(config_.arch, norm_weight, norm_bias, x, config_.norm_eps);
  at::Tensor qkv = at::linear(normed, qkv_weight, qkv_bias);  // [B, T, (h + 2kv) * hd]
  out.v = qkv.narrow(-1, (h + kv) * hd, kv * hd).view({b, t, kv, hd});
  if (config_.arch == Arch::kLlama) {
    // q and k rotate together: half the kernels of rotating each.
    at::Tensor qk = rotate(qkv.narrow(-1, 0, (h + kv) * hd).view({b, t, h + kv, hd}), start, t);
    out.q = qk.narrow(2, 0, h);
    out.k = qk.narrow(2, h, kv);
  } else {
    out.q = qkv.narrow(-1, 0, h * hd).view({b, t, h, hd});
    out.k = qkv.narrow(-1, h * hd, kv * hd).view({b, t, kv, hd});
  }
  return out;
}

at::Tensor AttentionOp::attend(const at::Tensor& q_in, at::Tensor k, at::Tensor v) {
  at::Tensor q = q_in;
  const int64_t b = q.size(0), t = q.size(1);
  const int64_t h = config_.n_head, kv = config_.kv_heads(), hd = config_.head_dim();
  if (kv != h) {  // grouped-query attention: each k/v head serves h/kv query heads
    k = k.repeat_interleave(h / kv, 2);
    v = v.repeat_interleave(h / kv, 2);
  }
#if STARLING_TORCH_AT_LEAST(2, 0)
  // libtorch 2.x: one fused kernel (flash or memory-efficient attention on GPUs) that never
  // materialises the [T, T] scores, so activation memory grows with T instead of T^2.
  return at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true)
      .transpose(1, 2)
      .reshape({b, t, h * hd});
#else
  // libtorch 1.13: the materialised form. [B*h, T, hd] batches for bmm.
  q = q.transpose(1, 2).reshape({b * h, t, hd});
  k = k.transpose(1, 2).reshape({b * h, t, hd});
  v = v.transpose(1, 2).reshape({b * h, t, hd});
  // scores = mask + scale * q k^T in one kernel; the mask is -inf above the diagonal.
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  at::Tensor scores = at::baddbmm(causal_bias(t, q), q, k.transpose(1, 2), 1.0, scale);
  at::Tensor att = at::softmax(scores, -1);
  return at::bmm(att, v).view({b, h, t, hd}).transpose(1, 2).reshape({b, t, h * hd});
#endif
}

at::Tensor AttentionOp::forward(const std::vector<at::Tensor>& inputs,
                                const std::vector<at::Tensor>& params) {
  const at::Tensor& x = inputs.at(0);
  const Projected p = project(x, params, 0);
  return x + at::linear(attend(p.q, p.k, p.v), p.proj, p.proj_bias);
}

at::Tensor AttentionOp::forward_cached(const std::vector<at::Tensor>& inputs,
                                       const std::vector<at::Tensor>& params, int64_t start,
                                       std::vector<at::Tensor>& state) {
  const at::Tensor& x = inputs.at(0);
  const int64_t b = x.size(0), t = x.size(1);
  if (start + t > config_.seq_len)
    throw std::invalid_argument("attention: positions up to " + std::to_string(start + t) +
                                " exceed model.seq_len " + std::to_string(config_.seq_len));
  const Projected p = project(x, params, start);
  const int64_t h = config_.n_head, kv = config_.kv_heads(), hd = config_.head_dim();
  if (start == 0 || state.size() != 2) {
    // Room for every position, [B, kv, seq_len, hd] each: a new token's keys and values are
    // written in place, and the attention reads the filled part, without copying the cache.
    state = {at::empty({b, kv, config_.seq_len, hd}, p.k.options()),
             at::empty({b, kv, config_.seq_len, hd}, p.v.options())};
  }
  state[0].narrow(2, start, t).copy_(p.k.transpose(1, 2));
  state[1].narrow(2, start, t).copy_(p.v.transpose(1, 2));
  // The first positions: the same attention as forward(), so a prompt's outputs are forward's.
  if (start == 0) return x + at::linear(attend(p.q, p.k, p.v), p.proj, p.proj_bias);
  at::Tensor k = state[0].narrow(2, 0, start + t), v = state[1].narrow(2, 0, start + t);
  if (kv != h) {
    k = k.repeat_interleave(h / kv, 1);
    v = v.repeat_interleave(h / kv, 1);
  }
  // The new queries over every key so far: [B, h, T, start + T]. Query i (position start + i)
  // sees the keys up to its own position.
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  at::Tensor scores = at::matmul(p.q.transpose(1, 2), k.transpose(2, 3)).mul_(scale);
  if (t > 1) {
    const int64_t total = start + t;
    at::Tensor later = at::arange(total, x.options().dtype(at::kLong)).view({1, total}) >
                       (at::arange(t, x.options().dtype(at::kLong)) + start).view({t, 1});
    scores = scores.masked_fill(later, -std::numeric_limits<float>::infinity());
  }
  at::Tensor y = at::matmul(at::softmax(scores, -1), v)  // [B, h, T, hd]
                     .transpose(1, 2)
                     .reshape({b, t, h * hd});
  return x + at::linear(y, p.proj, p.proj_bias);
}

std::vector<std::string> AttentionOp::param_names() const {
  std::vector<std::string> names = p_.norm.names();
  for (const auto* n : {&p_.qkv_name, &p_.qkv_bias_name, &p_.proj_name, &p_.proj_bias_name})
    if (!n->empty()) names.push_back(*n);
  return names;
}

double AttentionOp::forward_flops_per_token(int64_t seq_len) const {
  const double d = config_.d_model, hd = config_.head_dim();
  const double qkv = 2.0 * d * (config_.n_head + 2 * config_.kv_heads()) * hd;
  const double proj = 2.0 * d * d;
  const double scores = 2.0 * 2.0 * seq_len * d;  // q k^T and att v, full (unmasked) count
  return qkv + proj + scores;
}

std::vector<int64_t> AttentionOp::output_shape(int64_t batch, int64_t seq_len) const {
  return {batch, seq_len, config_.d_model};
}

}  // namespace starling::model
