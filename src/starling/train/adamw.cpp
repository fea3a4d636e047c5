#include "starling/train/adamw.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>

#include "starling/common/error.h"
#include "starling/common/torch_version.h"

namespace starling::train {

AdamW::AdamW(graph::ParamStore& params, AdamWOptions options) : params_(params), options_(options) {
  zeros_pending_ = options_.defer_zero_state;
  for (const auto& p : params_.params()) {
    // Deferred moments are placeholders in RAM, whatever the parameters' device: at::empty maps
    // its memory without touching it, so nothing is committed until it is written (on a GPU an
    // allocation would take the memory at once).
    const auto cpu = p.value.options().device(c10::kCPU);
    exp_avg_.push_back(zeros_pending_ ? at::empty(p.value.sizes(), cpu) : at::zeros_like(p.value));
    exp_avg_sq_.push_back(zeros_pending_ ? at::empty(p.value.sizes(), cpu)
                                         : at::zeros_like(p.value));
  }
#if STARLING_TORCH_AT_LEAST(2, 1)
  const auto& params_list = params_.params();
  fused_ = options_.fused && !params_list.empty();
  for (const auto& p : params_list)
    fused_ = fused_ && p.value.is_cuda() && p.value.scalar_type() == at::kFloat;
#endif
}

bool AdamW::claim_zero_state() {
  const bool pending = zeros_pending_;
  zeros_pending_ = false;
  return pending;
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  if (claim_zero_state()) {
    // Nothing else holds the placeholders yet: zeros beside the parameters take their place.
    const auto& params = params_.params();
    for (auto* list : {&exp_avg_, &exp_avg_sq_})
      for (size_t i = 0; i < list->size(); ++i) (*list)[i] = at::zeros_like(params[i].value);
  }
  ++steps_;
  if (fused_)
    step_fused(lr);
  else
    step_single(lr);
}

void AdamW::step_fused(double lr) {
#if STARLING_TORCH_AT_LEAST(2, 1)
  // Two calls, one per weight-decay group; the kernel reads the step count from a tensor per
  // parameter (on the device, so bias correction needs no host round trip).
  const at::Tensor step_count =
      at::full({}, static_cast<double>(steps_), exp_avg_.front().options());
  auto& params = params_.params();
  for (const bool decay : {true, false}) {
    std::vector<at::Tensor> w, g, m, v, s;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].decay != decay || !params[i].value.grad().defined()) continue;
      w.push_back(params[i].value);
      g.push_back(params[i].value.grad());
      m.push_back(exp_avg_[i]);
      v.push_back(exp_avg_sq_[i]);
      s.push_back(step_count);
    }
    if (w.empty()) continue;
    at::_fused_adamw_(w, g, m, v, /*max_exp_avg_sqs=*/{}, s, lr, options_.beta1, options_.beta2,
                      decay ? options_.weight_decay : 0.0, options_.eps, /*amsgrad=*/false,
                      /*maximize=*/false);
  }
#else
  step_single(lr);
#endif
}

void AdamW::step_single(double lr) {
  auto& params = params_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& w = params[i].value;
    if (!w.grad().defined()) continue;
    update_elements(w, w.grad(), exp_avg_[i], exp_avg_sq_[i], lr, params[i].decay, options_,
                    steps_);
  }
}

void AdamW::update_part(at::Tensor& w, const at::Tensor& g, at::Tensor& m, at::Tensor& v, double lr,
                        bool decay, int64_t steps) const {
#if STARLING_TORCH_AT_LEAST(2, 1)
  if (fused_) {
    const std::vector<at::Tensor> ws{w}, gs{g}, ms{m}, vs{v},
        ss{at::full({}, static_cast<double>(steps), m.options())};
    at::_fused_adamw_(ws, gs, ms, vs, /*max_exp_avg_sqs=*/{}, ss, lr, options_.beta1,
                      options_.beta2, decay ? options_.weight_decay : 0.0, options_.eps,
                      /*amsgrad=*/false, /*maximize=*/false);
    return;
  }
#endif
  update_elements(w, g, m, v, lr, decay, options_, steps);
}

void update_elements(at::Tensor& w, const at::Tensor& g, at::Tensor& m, at::Tensor& v, double lr,
                     bool decay, const AdamWOptions& o, int64_t steps) {
  const double bias1 = 1.0 - std::pow(o.beta1, static_cast<double>(steps));
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(steps)));
  if (decay && o.weight_decay != 0) w.mul_(1.0 - lr * o.weight_decay);
  m.lerp_(g, 1.0 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  at::Tensor denom = (v.sqrt() / bias2_sqrt).add_(o.eps);
  w.addcdiv_(m, denom, -lr / bias1);
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::state() const {
  if (zeros_pending_)
    throw std::logic_error("AdamW::state(): the deferred zero moments were never claimed");
  std::vector<std::pair<std::string, at::Tensor>> out;
  const auto& params = params_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    out.emplace_back("exp_avg." + params[i].name, exp_avg_[i]);
    out.emplace_back("exp_avg_sq." + params[i].name, exp_avg_sq_[i]);
  }
  return out;
}

void AdamW::load_state(const SafetensorsFile& file, int64_t steps) {
  at::NoGradGuard no_grad;
  const auto& params = params_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    for (auto* pair : {&exp_avg_, &exp_avg_sq_}) {
      const std::string name = (pair == &exp_avg_ ? "exp_avg." : "exp_avg_sq.") + params[i].name;
      const at::Tensor& t = file.at(name);
      if (t.sizes() != params[i].value.sizes())
        throw CheckpointError(file.file.string() + ": optimizer tensor \"" + name +
                              "\" has shape " + c10::str(t.sizes()) + ", the model needs " +
                              c10::str(params[i].value.sizes()));
      // While the deferred moments are unwritten and unclaimed, nothing else holds them: the
      // file's tensor can take their place without a copy. Later (a swapper owns them), the
      // values are copied into the tensors it holds.
      if (zeros_pending_ && t.scalar_type() == at::kFloat && t.is_contiguous())
        (*pair)[i] = t;
      else
        (*pair)[i].copy_(t);
    }
  }
  zeros_pending_ = false;
  steps_ = steps;
}

at::Tensor clip_grad_norm(graph::ParamStore& params, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params.params())
    if (p.value.grad().defined()) grads.push_back(p.value.grad());
  if (grads.empty()) return at::zeros({}, at::kFloat);
  // One multi-tensor kernel for all the norms on a GPU (a per-tensor loop on CPUs).
  const at::Tensor total = at::stack(at::_foreach_norm(grads, 2)).norm(2);
  if (max_norm > 0) {
    // min(1, max_norm / (norm + 1e-6)) on the device: multiplying by exactly 1 leaves a gradient
    // under the limit bit-identical, so no host decision is needed.
    const at::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
#if STARLING_TORCH_AT_LEAST(2, 1)
    at::_foreach_mul_(grads, coef);
#else
    for (auto& g : grads) g.mul_(coef);
#endif
  }
  return total;
}

}  // namespace starling::train
