#include "starling/model/ops/loss.h"

#include <ATen/ATen.h>

namespace starling::model {

at::Tensor LossOp::forward(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>&) {
  const at::Tensor& logits = inputs.at(0);
  const at::Tensor& targets = inputs.at(1);
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

}  // namespace starling::model
