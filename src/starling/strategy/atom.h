// atom: replicas of unequal speed share one optimizer step. Each peer runs micro-batches at its own
// pace, adding up its gradients, and announces its sample count after each one (progress_board.h);
// when the swarm together will hold strategy.target_batch samples, the peer stops, and the peers
// all-reduce their gradient sums and sample counts and divide: the sample-weighted mean of
// everyone's gradients, the same SGD step as ddp over a batch of that many samples. A faster peer
// simply contributes more samples; nobody computes a fixed share while the others wait. Every
// replica takes the same step, so parameters and AdamW moments stay identical; joiners and
// failures work as in ddp (a joiner adopts parameters, moments and step).
//
// Peers stop on the others' counts projected at their pace, except the one with the smallest id
// still accumulating: it stops only on announced counts, so a step never gathers fewer samples
// than the target (decide_stop).
//
// The exchange does not overlap computation. Computing the next step's micro-batches while the
// others finish and while the all-reduce runs (their gradients one step stale) was built and
// measured on CPU peers: both throughput and loss got worse (docs/atom.md), so peers wait.
#pragma once

#include "starling/strategy/ddp.h"
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

 private:
  // The samples a step gathers: strategy.target_batch, or batch_size x grad_accum per peer.
  int64_t target() const;
  double pace() const;  // samples per second
  // After this peer's micro-batch bringing it to `mine` samples: whether it stops accumulating.
  bool decide_stop(int64_t mine);

  ProgressBoard board_;
  int64_t local_samples_ = 0;  // this peer's samples in the step being exchanged
  int64_t swarm_samples_ = 0;  // the swarm's samples in the last exchanged step
  int64_t micro_batches_ = 0;  // this peer's micro-batches in the last step
  double micro_s_ = 0;         // this peer's time per micro-batch (moving average)
  // Micro-batches this peer computed because, closing a round, it found the count still short.
  int64_t extra_micro_batches_ = 0;
};

}  // namespace starling::strategy
