// localsgd: tau local AdamW steps on each peer, then synchronous averaging of the parameters.
// The inner optimizer state stays local; a joiner adopts the parameters and step.
#pragma once

#include "starling/strategy/swarm_strategy.h"

namespace starling::strategy {

class LocalSgd final : public SwarmStrategy {
 public:
  LocalSgd(const train::RunConfig& config, net::Collectives& net);
  bool gradients_ready(train::Replica&) override { return true; }
  bool step_done(train::Replica& r, bool last) override;
  nlohmann::json checkpoint_state(
      std::vector<std::pair<std::string, at::Tensor>>& tensors) override;

 protected:
  void allocate(train::Replica& r) override;
  std::vector<at::Tensor> state_tensors(train::Replica& r) override;
  void restore(train::Replica&, const nlohmann::json&, const SafetensorsFile&) override {}
  // A joiner whose opening agreement was the others' round boundary takes part in their
  // averaging (sending nothing) and ends on their average.
  void started(const Agreement& a) override;

 private:
  // The round's averaging of the parameters among the agreement's participants.
  void average(const Agreement& a);
  std::optional<Staging> buffer_;
};

}  // namespace starling::strategy
