#include "starling/strategy/shared_copies.h"

#include <ATen/ATen.h>

#include "starling/net/crc32c.h"
#include "starling/strategy/pipeline_runner.h"

namespace starling::strategy {

uint32_t copy_checksum(const at::Tensor& value) {
  const at::Tensor host = value.detach().to(at::kCPU).contiguous();
  return net::crc32c(host.data_ptr(), static_cast<size_t>(host.numel()) * host.element_size());
}

void AlignSharedCopies::start(train::Replica& replica, const nlohmann::json& state,
                              const SafetensorsFile* tensors) {
  strategy_->start(replica, state, tensors);
  if (strategy_->ended_in_start() && runner_ != nullptr) runner_->align_shared_copies();
}

bool AlignSharedCopies::step_done(train::Replica& replica, bool last) {
  const bool boundary = strategy_->step_done(replica, last);
  // Only a round changes the parameters outside the stages' own identical steps; every stage of
  // the pipeline reaches the same boundaries, so all of them take part.
  if (boundary && runner_ != nullptr) runner_->align_shared_copies();
  return boundary;
}

}  // namespace starling::strategy
