// atom: replicas of unequal speed share one optimizer step. Each peer runs micro-batches at its own
// pace, adding up its gradients, and announces its sample count after each one (progress_board.h);
// when the swarm together will hold strategy.target_batch samples, the peer stops, and the peers
// check the count in their agreement (below), all-reduce their gradient sums and sample counts and
// divide: the sample-weighted mean of everyone's gradients, the same SGD step as ddp over a batch
// of that many samples. A faster peer simply contributes more samples; nobody computes a fixed
// share while the others wait. Every replica takes the same step, so parameters and AdamW moments
// stay identical; joiners and failures work as in ddp (a joiner adopts parameters, moments and
// step).
//
// Peers stop on the others' counts projected at their pace, except the one with the smallest id
// still accumulating: it stops only on announced counts, so a step of live peers gathers the
// target (next_sequences), unless one of them died meanwhile (below).
//
// A step's last micro-batch may be smaller than train.batch_size: a peer that sees the swarm
// reaching the target within its next micro-batch computes only the sequences it will have
// gained by then, so that every peer ends close to that moment. With whole micro-batches the
// peers ended up to one of the slowest peer's micro-batches apart, and the first to end waited
// for the last. The peer closing the round, once the others have stopped, computes exactly what
// is still missing.
//
// None of that can tell a peer that died while it accumulated (the others go on projecting its
// announced pace, and its samples never reach the exchange), so the count is checked before the
// gradients travel: the exchange's agreement, taken at the end of run_step, sums every
// participant's samples and pace (round_notes). Where every participant is in that exchange and
// contributes, all of them know the swarm's count from it alike; where not (the agreement handed
// a peer the swarm's state, or a joiner takes its first exchange), one more tiny all-reduce sums
// the contributors' samples and paces. A count short of the target is made up at once, each
// contributor computing a share of the missing samples by its pace, before any gradient is sent.
// The exchange then all-reduces the counts as always (its divisor).
//
// A stop asked for (the run's first SIGINT or SIGTERM) ends the step in progress early: the peer
// stops gathering, says so on the board (closing), the others end their step too at their next
// micro-batch, nobody makes up the shortfall, and the swarm's step averages what it holds (its
// count, as always, the divisor). A large target on slow peers would otherwise hold the stop for
// as long as the step takes. Only the peers told to stop stop after the step; the others go on
// with the next.
//
// The exchange does not overlap computation. Computing the next step's micro-batches while the
// others finish and while the all-reduce runs (their gradients one step stale) was built and
// measured on CPU peers: both throughput and loss got worse (docs/atom.md), so peers wait.
#pragma once

#include <optional>

#include "starling/strategy/ddp.h"
#include "starling/strategy/fault_injection.h"
#include "starling/strategy/progress_board.h"

namespace starling::strategy {

class Atom final : public Ddp {
 public:
  // `node` is the swarm `net` is: announcements travel on its point-to-point messages.
  Atom(const train::RunConfig& config, net::Node& node);

  StepWork run_step(train::StepRunner& runner, train::Replica& r, double loss_scale) override;
  bool gradients_ready(train::Replica& r) override;
  nlohmann::json checkpoint_state(
      std::vector<std::pair<std::string, at::Tensor>>& tensors) override;
  train::StrategyReport report() const override;

 protected:
  // Peers read at their own pace: each keeps the share of the data it started with.
  bool lockstep_data() const override { return false; }
  // Ddp's, with this peer's samples in the step (notes[0]) and its pace (notes[2]): read in the
  // exchange's agreement only.
  std::array<float, kAgreementNotes> round_notes() const override;

 private:
  // The samples a step gathers: strategy.target_batch, or batch_size x grad_accum per peer.
  int64_t target() const;
  double pace() const;  // samples per second
  // After this peer's micro-batches bring it to `mine` samples: the sequences of its next
  // micro-batch (train.batch_size, or fewer to end with the swarm), or 0 to stop accumulating.
  int64_t next_sequences(int64_t mine);
  // After the exchange's agreement `a`: the swarm's count, where every participant knows it from
  // the agreement's notes alike (all of them in this exchange, all contributing), else nullopt.
  std::optional<int64_t> agreed_count(const Agreement& a) const;
  // The step's count before the exchange, as every contributor knows it alike.
  struct Count {
    int64_t samples = 0;   // the contributors' samples
    double paces = 0;      // their paces, summed (samples per second)
    int contributors = 0;  // how many they are
    bool checked = false;  // taken by a collective of its own, not from the agreement's notes
  };
  // From the agreement's notes where they settle it (agreed_count); else, where an exchange
  // follows, from one more tiny all-reduce of the contributors' samples and paces (a state moved
  // in the agreement, or a joiner's first exchange). nullopt where no exchange follows or that
  // all-reduce failed.
  std::optional<Count> step_count(const Agreement& a);
  // This peer's share of the `missing` samples of a step that fell short, by its pace among the
  // contributors' (`paces`, their sum), rounded up, so that together they make up at least that.
  int64_t top_up_share(int64_t missing, double paces, int contributors) const;

  ProgressBoard board_;
  ProgressBoard::Round round_;  // this step's on the board
  // The exchange's agreement, taken at the end of run_step, for gradients_ready.
  std::optional<Agreement> agreement_;
  int64_t topped_up_steps_ = 0;             // steps whose count fell short and was made up
  std::optional<AccumulationDeath> death_;  // STARLING_FAULT_DIE_ACCUMULATING
  int64_t steps_run_ = 0;                   // run_step calls of this process
  // Steps this peer began a round behind the others at its step (ProgressBoard::View::apart),
  // and the last of them (its log line is once a step).
  int64_t behind_steps_ = 0, behind_step_ = 0;
  int64_t local_samples_ = 0;  // this peer's samples in the step being exchanged
  int64_t swarm_samples_ = 0;  // the swarm's samples in the last exchanged step
  int64_t micro_batches_ = 0;  // this peer's micro-batches in the last step
  double micro_s_ = 0;         // this peer's time per whole micro-batch (moving average)
  // Micro-batches this peer computed because, closing a round, it found the count still short.
  int64_t extra_micro_batches_ = 0;
  int64_t last_sequences_ = 0;  // the sequences of this peer's last micro-batch in the last step
  bool closing_ = false;        // another peer ended this step early (ProgressBoard::View::closing)
  double compute_s_ = 0;        // seconds in micro-batches so far (the rest: waits, exchanges)
};

}  // namespace starling::strategy
