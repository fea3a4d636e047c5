// diloco: tau local AdamW steps from the anchor x, a synchronous all-reduce of the
// pseudo-gradient delta = x - y (mean over contributing peers), then outer Nesterov momentum:
//   m <- beta*m + Delta;  x <- x - alpha*(Delta + beta*m);  every peer restarts from x.
// A joiner adopts x, m and the step; the inner AdamW state stays local.
//
// A swapped replica keeps x and m where it keeps its own state (StepRunner::keep_state: in its
// tier, a tensor per parameter), and the outer step goes a piece at a time.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "starling/strategy/outer_vector.h"
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
  std::vector<at::Tensor> state_tensors(train::Replica&) override;
  void state_adopted(train::Replica&) override;
  // Either form of the two vectors: one tensor each ("strategy.anchor", an unswapped run's) or
  // one per parameter ("strategy.anchor.<parameter>", a swapped run's).
  void restore(train::Replica& r, const nlohmann::json& state,
               const SafetensorsFile& tensors) override;
  // A joiner whose opening agreement was the others' round boundary takes part in their
  // pseudo-gradient all-reduce (sending nothing) and takes the same outer step.
  void started(const Agreement& a) override;
  // ... and where that boundary was the last, settles the run with them (last_round()).
  void end_in_last_round(train::Replica& r, int64_t agreed_version) override;

 private:
  // The round's all-reduce of the pseudo-gradient and outer step.
  void outer_step(const Agreement& a);
  // The same a piece at a time, where some participant is swapped (round_notes): the
  // parameters, the anchor and the momentum (flat_'s order, the same on every peer) are cut
  // alike into pieces of the participants' mean strategy.transfer_piece; each piece of the
  // three is read from wherever its tensors lie (StepRunner::read_state), its pseudo-gradient
  // all-reduced, and the new momentum, anchor and parameters written back a tensor at a time
  // (StepRunner::write_state). So the step holds three pieces, and the tensors crossing their
  // edges, beside the replica's budget.
  void outer_step_in_pieces(const Agreement& a);
  // [0]: strategy.transfer_piece in units of 1000 bytes; [1]: 1 when the runner keeps the two
  // vectors (a swapped replica).
  std::array<float, kAgreementNotes> round_notes() const override;

  train::Replica* replica_ = nullptr;  // the replica start() was given
  // In memory, or kept by the runner (a swapped replica's tier).
  OuterVector anchor_, momentum_;
  std::optional<Staging> delta_;  // this round's pseudo-gradient, then the average (not kept)
  std::optional<Staging> piece_;  // one piece of it (outer_step_in_pieces)
  at::Tensor anchor_piece_, momentum_piece_;
  // STARLING_FAULT_DIE_IN_EXCHANGE, STARLING_FAULT_LOSE_PIECE (fault_injection.h), counted by
  // outer steps.
  RoundFaults faults_;
};

}  // namespace starling::strategy
