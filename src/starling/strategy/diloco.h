// diloco: tau local AdamW steps from the anchor x, a synchronous all-reduce of the
// pseudo-gradient delta = x - y (mean over contributing peers), then outer Nesterov momentum:
//   m <- beta*m + Delta;  x <- x - alpha*(Delta + beta*m);  every peer restarts from x.
// A joiner adopts x, m and the step; the inner AdamW state stays local.
#pragma once

#include "starling/strategy/swarm_strategy.h"

namespace starling::strategy {

class DiLoCo final : public SwarmStrategy {
 public:
  DiLoCo(const train::RunConfig& config, net::Collectives& net);
  bool gradients_ready(train::Replica&) override { return true; }
  bool step_done(train::Replica& r, bool last) override;
  nlohmann::json checkpoint_state(
      std::vector<std::pair<std::string, at::Tensor>>& tensors) override;

 protected:
  void allocate(train::Replica& r) override;
  // The anchor and the outer momentum. A peer whose history is the root's keeps its own, and its
  // parameters: the round's local steps it took count in the pseudo-gradient.
  std::vector<at::Tensor> state_tensors(train::Replica&) override { return {anchor_, momentum_}; }
  void state_adopted(train::Replica&) override;
  void restore(train::Replica& r, const nlohmann::json& state,
               const SafetensorsFile& tensors) override;
  // A joiner whose opening agreement was the others' round boundary takes part in their
  // pseudo-gradient all-reduce (sending nothing) and takes the same outer step.
  void started(const Agreement& a) override;

 private:
  // The round's all-reduce of the pseudo-gradient and outer step.
  void outer_step(const Agreement& a);
  at::Tensor anchor_, momentum_;
  std::optional<Staging> delta_;  // this round's pseudo-gradient, then the average
};

}  // namespace starling::strategy
