// ddp: the baseline everyone knows. Every step all-reduces the gradients (mean over the peers),
// so every replica takes the same optimizer step and stays identical; a joiner adopts the
// parameters, AdamW moments and step.
#pragma once

#include "starling/strategy/swarm_strategy.h"

namespace starling::strategy {

class Ddp : public SwarmStrategy {
 public:
  Ddp(const train::RunConfig& config, net::Collectives& net);
  void gradients_ready(train::Replica& r) override;
  bool step_done(train::Replica& r, bool last) override;
  nlohmann::json checkpoint_state(
      std::vector<std::pair<std::string, at::Tensor>>& tensors) override;

 protected:
  void allocate(train::Replica& r) override;
  int64_t state_numel() const override { return 3 * flat_->numel(); }
  void pack_state(train::Replica& r, at::Tensor& out) override;
  void unpack_state(train::Replica& r, const at::Tensor& in) override;
  void restore(train::Replica&, const nlohmann::json&, const SafetensorsFile&) override {}

 protected:
  std::optional<Staging> grads_;
};

}  // namespace starling::strategy
