#include "starling/train/step_runner.h"

#include <ATen/ATen.h>

#include "starling/data/loader.h"
#include "starling/graph/executor.h"
#include "starling/graph/param_store.h"
#include "starling/train/adamw.h"

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

LocalStepRunner::LocalStepRunner(graph::Executor& executor, graph::ParamStore& params,
                                 AdamW& optimizer, data::TokenLoader& loader, c10::Device device)
    : executor_(executor),
      params_(params),
      optimizer_(optimizer),
      loader_(loader),
      device_(device) {}

at::Tensor LocalStepRunner::run(int64_t micro_batches, double loss_scale) {
  params_.zero_grad();
  at::Tensor loss_sum;
  for (int64_t m = 0; m < micro_batches; ++m) {
    at::Tensor l = executor_.forward_backward(to_device(loader_.next(), device_),
                                              loss_scale / static_cast<double>(micro_batches));
    loss_sum = loss_sum.defined() ? loss_sum + l : l;
  }
  return loss_sum / static_cast<double>(micro_batches);
}

at::Tensor LocalStepRunner::update(double lr, double max_norm, bool skip) {
  const at::Tensor norm = clip_grad_norm(params_, max_norm);
  if (!skip) optimizer_.step(lr);
  return norm;
}

}  // namespace starling::train
