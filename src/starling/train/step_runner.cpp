#include "starling/train/step_runner.h"

#include <ATen/ATen.h>

#include "starling/common/error.h"
#include "starling/data/loader.h"
#include "starling/graph/executor.h"
#include "starling/graph/param_store.h"
#include "starling/train/adamw.h"
#include "starling/train/loss_scaler.h"
#include "starling/train/step_hooks.h"

namespace starling::train {

std::vector<at::Tensor> to_device(const data::Batch& b, const c10::Device& device) {
  auto make = [&](const std::vector<int64_t>& v) {
    at::Tensor host = at::tensor(at::ArrayRef<int64_t>(v), at::kLong).view({b.batch, b.seq_len});
    if (!device.is_cuda()) return host;
    // A copy from pageable memory waits for everything queued on the GPU; from pinned memory it
    // is queued behind the previous step instead, and the host runs ahead to the next batch.
    return host.pin_memory().to(device, /*non_blocking=*/true);
  };
  return {make(b.inputs), make(b.targets)};
}

void StepRunner::begin_accumulation() {
  throw Error(
      "this step runner runs a fixed number of micro-batches per step; a strategy that "
      "accumulates at its own pace (strategy.kind = \"atom\") cannot use it");
}

at::Tensor StepRunner::accumulate(double, int64_t) {
  begin_accumulation();  // throws the same explanation
  return {};
}

namespace {
[[noreturn]] void no_loss_scaling() {
  throw Error("this step runner does not scale losses (train.dtype = \"fp16\")");
}
}  // namespace

void StepRunner::unscale_next_step(double) { no_loss_scaling(); }
bool StepRunner::gradients_finite() { no_loss_scaling(); }

void copy_state(const at::Tensor& t, const at::Tensor& values) {
  at::NoGradGuard no_grad;
  t.copy_(values.reshape(t.sizes()));
}

at::Tensor StepRunner::evaluation_loss(graph::Executor& executor,
                                       const std::vector<at::Tensor>& batch) {
  return executor.forward(batch);
}

// The hooks' default step lives here, beside the runner it drives.
StepHooks::StepWork StepHooks::run_step(StepRunner& runner, Replica& replica, double loss_scale) {
  const TrainConfig& t = replica.config.train;
  return {
      .loss = runner.run(t.grad_accum, loss_scale),
      .tokens = static_cast<uint64_t>(t.batch_size * t.grad_accum * replica.config.model.seq_len)};
}

LocalStepRunner::LocalStepRunner(graph::Executor& executor, graph::ParamStore& params,
                                 AdamW& optimizer, data::TokenLoader& loader, c10::Device device)
    : executor_(executor),
      params_(params),
      optimizer_(optimizer),
      loader_(loader),
      device_(device) {}

void LocalStepRunner::begin_step() {
  params_.zero_grad();
  step_factor_ = next_factor_;
  next_factor_ = 1;
}

void LocalStepRunner::unscale() {
  if (step_factor_ == 1) return;
  LossScaler::multiply_gradients(params_, step_factor_);
  step_factor_ = 1;
}

bool LocalStepRunner::gradients_finite() {
  unscale();
  return LossScaler::finite(params_);
}

at::Tensor LocalStepRunner::run(int64_t micro_batches, double loss_scale) {
  begin_step();
  at::Tensor loss_sum;
  for (int64_t m = 0; m < micro_batches; ++m) {
    at::Tensor l = executor_.forward_backward(to_device(loader_.next(), device_),
                                              loss_scale / static_cast<double>(micro_batches));
    loss_sum = loss_sum.defined() ? loss_sum + l : l;
  }
  return loss_sum / static_cast<double>(micro_batches);
}

void LocalStepRunner::begin_accumulation() { begin_step(); }

at::Tensor LocalStepRunner::accumulate(double loss_scale, int64_t sequences) {
  return executor_.forward_backward(to_device(loader_.next(sequences), device_),
                                    loss_scale * static_cast<double>(sequences));
}

void LocalStepRunner::visit_gradients(const GradientVisitor& visit) {
  unscale();
  std::vector<int> all(params_.params().size());
  for (size_t i = 0; i < all.size(); ++i) {
    all[i] = static_cast<int>(i);
    at::Tensor& value = params_.params()[i].value;
    if (!value.grad().defined()) value.mutable_grad() = at::zeros_like(value);
  }
  visit(all);
}

void LocalStepRunner::visit_gradients_by_node(const GradientVisitor& visit) {
  visit_gradients([&](std::span<const int>) {
    for (const std::vector<int>& piece : executor_.dag().params_by_first_reader()) visit(piece);
  });
}

at::Tensor LocalStepRunner::update(double lr, double max_norm, bool skip) {
  unscale();
  const at::Tensor norm = clip_grad_norm(params_, max_norm);
  if (!skip) optimizer_.step(lr);
  return norm;
}

}  // namespace starling::train
