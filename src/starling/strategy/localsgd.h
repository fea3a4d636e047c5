// localsgd: tau local AdamW steps on each peer, then synchronous averaging of the parameters.
// The inner optimizer state stays local; a joiner adopts the parameters and step. A swapped
// replica's parameters are averaged a piece at a time, through its tier.
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
  // The same for a swapped replica, a piece of strategy.transfer_piece at a time, read from and
  // written back to wherever its runner keeps each tensor (StepRunner::read_state, write_state).
  void average_in_pieces(train::Replica& r, const Agreement& a);
  train::Replica* replica_ = nullptr;  // the replica start() was given
  std::optional<Staging> buffer_;      // the whole parameter vector (not swapped)
  std::optional<Staging> pieces_;      // one piece of it (swapped)
};

}  // namespace starling::strategy
