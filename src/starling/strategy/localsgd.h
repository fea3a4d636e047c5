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
  // ... and where that boundary was the last, settles the run with them (last_round()).
  void end_in_last_round(train::Replica& r, int64_t agreed_version) override;

 private:
  // The round's averaging of the parameters among the agreement's participants.
  void average(const Agreement& a);
  // The same a piece at a time, each read from and written back to wherever the runner keeps its
  // tensors (StepRunner::read_state, write_state): a swapped replica's budget holds no second
  // copy of the weights. Every participant averages so when any of them is swapped, with pieces
  // of the participants' mean strategy.transfer_piece (round_notes): the pieces are the
  // collectives, which must be the same on every peer.
  void average_in_pieces(train::Replica& r, const Agreement& a);
  // Sums the first `n` elements of `staged` over the round's participants and divides them by
  // the number of peers that sent theirs: an element past them carries 1 from each contributor,
  // and a peer that withholds its parameters (non-finite: aggregate() sends zeros in their place,
  // the 1 with them) counts out, so the others' mean is not shrunk by its zeros. False (logged)
  // if the exchange failed or no peer sent.
  bool sum_with_senders(Staging& staged, int64_t n, const Agreement& a);
  // [0]: strategy.transfer_piece in units of 1000 bytes; [1]: 1 when this replica is swapped.
  std::array<float, kAgreementNotes> round_notes() const override;

  train::Replica* replica_ = nullptr;  // the replica start() was given
  // The whole parameter vector (not swapped), or one piece of it (average_in_pieces), each with
  // the count of senders after it (sum_with_senders).
  std::optional<Staging> buffer_;
  std::optional<Staging> pieces_;
  RoundFaults faults_;  // STARLING_FAULT_DIE_IN_EXCHANGE, STARLING_FAULT_LOSE_PIECE
};

}  // namespace starling::strategy
