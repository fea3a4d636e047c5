#include "starling/train/adamw.h"

#include <ATen/ATen.h>

#include <cmath>

#include "starling/common/error.h"

namespace starling::train {

AdamW::AdamW(graph::ParamStore& params, AdamWOptions options) : params_(params), options_(options) {
  for (const auto& p : params_.params()) {
    exp_avg_.push_back(at::zeros_like(p.value));
    exp_avg_sq_.push_back(at::zeros_like(p.value));
  }
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++steps_;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double bias1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(steps_)));
  auto& params = params_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& w = params[i].value;
    const at::Tensor& g = w.grad();
    if (!g.defined()) continue;
    if (params[i].decay && options_.weight_decay != 0) w.mul_(1.0 - lr * options_.weight_decay);
    exp_avg_[i].lerp_(g, 1.0 - b1);
    exp_avg_sq_[i].mul_(b2).addcmul_(g, g, 1.0 - b2);
    at::Tensor denom = (exp_avg_sq_[i].sqrt() / bias2_sqrt).add_(options_.eps);
    w.addcdiv_(exp_avg_[i], denom, -lr / bias1);
  }
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::state() const {
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
      (*pair)[i].copy_(t);
    }
  }
  steps_ = steps;
}

double clip_grad_norm(graph::ParamStore& params, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const auto& p : params.params())
    if (p.value.grad().defined()) norms.push_back(p.value.grad().norm(2));
  if (norms.empty()) return 0.0;
  const double total = at::stack(norms).norm(2).item<double>();
  if (max_norm > 0) {
    const double coef = max_norm / (total + 1e-6);
    if (coef < 1.0)
      for (auto& p : params.params())
        if (p.value.grad().defined()) p.value.mutable_grad().mul_(coef);
  }
  return total;
}

}  // namespace starling::train
