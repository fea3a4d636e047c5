// localsgd: tau local AdamW steps on each peer, then synchronous averaging of the parameters.
// The inner optimizer state stays local; a joiner adopts the parameters and step.
#pragma once

#include "starling/strategy/swarm_strategy.h"

namespace starling::strategy {

class LocalSgd final : public SwarmStrategy {
 public:
  LocalSgd(const train::RunConfig& config, net::Collectives& net);
  void gradients_ready(train::Replica&) override {}
  bool step_done(train::Replica& r, bool last) override;
  nlohmann::json checkpoint_state(
      std::vector<std::pair<std::string, at::Tensor>>& tensors) override;

 protected:
  void allocate(train::Replica& r) override;
  std::vector<at::Tensor> state_tensors(train::Replica& r) override;
  void restore(train::Replica&, const nlohmann::json&, const SafetensorsFile&) override {}

 private:
  std::optional<Staging> buffer_;
};

}  // namespace starling::strategy
