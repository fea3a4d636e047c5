// ddp: the baseline everyone knows. Every step all-reduces the gradients (mean over the peers),
// so every replica takes the same optimizer step and stays identical; a joiner adopts the
// parameters, AdamW moments and step. The gradients are reached through the step runner a piece
// at a time (one piece for a replica in memory, a node's parameters for a swapped one, and for
// every peer of a round that has a swapped one: round_notes), so a swapped replica exchanges them
// within its memory budget.
#pragma once

#include <array>
#include <functional>
#include <optional>

#include "starling/strategy/swarm_strategy.h"

namespace starling::strategy {

class Ddp : public SwarmStrategy {
 public:
  Ddp(const train::RunConfig& config, net::Collectives& net);
  bool gradients_ready(train::Replica& r) override;
  bool step_done(train::Replica& r, bool last) override;
  nlohmann::json checkpoint_state(
      std::vector<std::pair<std::string, at::Tensor>>& tensors) override;
  // SwarmStrategy's, with `applied_steps`: the steps of this process whose update applied (a
  // round counts a resumed run's earlier steps too, and a joiner's adopted ones).
  train::StrategyReport report() const override;

 protected:
  void allocate(train::Replica& r) override;
  std::vector<at::Tensor> state_tensors(train::Replica& r) override;
  void started(const Agreement& a) override;
  // The agreement of this step's exchange: the opening one where it belongs to the others'
  // exchange (joined_round_), otherwise a new one.
  Agreement exchange_agreement(train::Replica& r);
  // This peer adopted the swarm's state in an agreement that the other participants held before
  // their gradient exchange (a joiner's opening agreement in start(), theirs in gradients_ready;
  // atom's at the end of run_step): they go on to that exchange at once. Rather than call an
  // agreement of its own into it (which would fail it, and the others' step with it, and cost a
  // second transfer), this peer takes part in that exchange at its first gradients_ready, with the
  // gradients of the step it computed meanwhile on the parameters it adopted, and takes the same
  // update as the others (counts_from_opening()).
  std::optional<Agreement> joined_round_;
  // Not with fp16: the joiner's loss scale is its own (a fresh one), so its first step may
  // overflow where the others' did not, and an overflow in the sum makes every peer skip the
  // step (trainer.cpp).
  bool counts_from_opening() const override { return config_.train.dtype != "fp16"; }
  void restore(train::Replica&, const nlohmann::json&, const SafetensorsFile&) override {}
  // [1]: 1 when this peer's replica is swapped (its gradients come a node's parameters at a
  // time, within its budget). Where any participant's is, all of them exchange in those pieces
  // (StepRunner::visit_gradients_by_node), so that a swarm of swapped and unswapped peers agrees
  // on every collective's size; otherwise in each runner's own (one piece in memory).
  std::array<float, kAgreementNotes> round_notes() const override;

 protected:
  // Sums the peers' gradients piece by piece (StepRunner::visit_gradients) and divides them by
  // divisor(), which is asked once, after the first piece's sum: a divisor that travels in a
  // collective of its own arrives meanwhile. A peer that does not contribute (`a`) sends zeros.
  // Every piece is summed even after one fails, so the peers' collectives stay matched. Returns
  // false when a sum failed or the divisor is not positive, and for a round without
  // contributors (every peer has just adopted the root's state), which sends nothing.
  bool average_gradients(train::Replica& r, const Agreement& a,
                         const std::function<double()>& divisor);
  // Whether the step's update applies, from whether this peer's gradients were `averaged`: a
  // step without an average is skipped (its parameters and moments stay as they were, a
  // partly summed gradient unused) and is no round: the peer's round (version_) stays. Where
  // the exchange failed on every participant (a peer died in it), all of them skip alike and
  // the swarm goes on at once; where some got the average and others not, the next agreement
  // (after the last step, the closing one: close_run) finds their rounds apart, and those
  // without it adopt the state of one with it. A pipeline's stages decide together, since a
  // stage that stepped beside one that skipped would part the tied copies and the model's
  // halves.
  bool update_applies(train::Replica& r, bool averaged);

  std::optional<Staging> grads_;  // the largest piece's gradients, as the network sends them
  // STARLING_FAULT_DIE_IN_EXCHANGE (before this peer sends) and STARLING_FAULT_LOSE_PIECE, counted
  // by gradient exchanges.
  RoundFaults faults_;
  bool applied_ = true;        // whether this step's update applies (update_applies)
  int64_t applied_steps_ = 0;  // steps of this process whose update applied
};

}  // namespace starling::strategy
