// The swapping runtime: an executor observer that keeps the training state (weights, gradients,
// AdamW moments) under a memory budget by following a SwapPlan. Before a layer group runs it
// makes the group's weights (and, in backward, gradients) resident, starts loading the next
// `depth` groups, and when a group is left it evicts what the next tasks do not need: weights
// are dropped (the tier holds them), gradients written out. The optimizer step streams every
// parameter through a staging area in chunks, running AdamW where the bytes are, so the moments
// never need to be resident. Gradients are clipped by the global norm as train::clip_grad_norm
// does; the norms are taken while each final gradient is resident, so results are bit-identical
// to unswapped training.
//
// A step is: begin_step(), then per micro-batch begin_micro_batch(m) + the executor's forward and
// backward + end_pass(), then update(). Evaluation forwards work between steps (groups load on
// demand). gather() makes weights and moments resident for a checkpoint or sampling; the next
// step evicts down to the budget again.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "starling/graph/executor.h"
#include "starling/swap/buffer_pool.h"
#include "starling/swap/swap_plan.h"
#include "starling/swap/swap_slot.h"
#include "starling/swap/tier.h"

namespace starling::graph {
class OpDag;
}
namespace starling::train {
class AdamW;
}

namespace starling::swap {

struct SwapStats {
  int64_t peak_resident = 0;  // the largest resident set of the steps (checkpoints excluded)
  int64_t read_bytes = 0, write_bytes = 0;
  double wait_s = 0;  // time the training thread waited for the tier, in all
  // Where the steps' time went: the micro-batches' passes (begin_step to update) and the
  // optimizer (update), each with the part of it spent waiting for the tier.
  double pass_s = 0, pass_wait_s = 0;
  double update_s = 0, update_wait_s = 0;
};

class Swapper final : public graph::NodeObserver {
 public:
  // Adopts every weight and moment (they must be resident, contiguous CPU fp32 tensors) and
  // evicts down to the plan's budget. `micro_batches` is train.grad_accum.
  Swapper(graph::OpDag& dag, train::AdamW& optimizer, SwapPlan plan, std::unique_ptr<Tier> tier,
          int64_t micro_batches);
  ~Swapper() override;

  void before(int node, graph::Phase phase) override;

  void begin_step();
  void begin_micro_batch(int64_t micro);
  void end_pass();
  // Clips to `max_norm` (0 = off) and applies one AdamW update with `lr`; drops the gradients.
  // Returns the gradient norm before clipping (0-dim fp32; 0 without gradients).
  at::Tensor update(double lr, double max_norm);
  void gather();

  const SwapPlan& plan() const { return plan_; }
  const SwapStats& stats() const { return stats_; }
  int64_t resident_bytes() const { return held_; }
  const Tier& tier() const { return *tier_; }

 private:
  struct Task {
    int group = -1;
    bool backward = false;
  };
  Task task_at(int64_t index) const;
  void enter(int group, bool backward);
  void leave();
  void want(int group, bool backward, bool must);
  void narrow_to(int group, bool backward, int64_t bytes);
  void mark_guard(int group, bool backward);
  bool needed_soon(int group) const;
  void evict(SwapSlot& s);
  void load(SwapSlot& s);
  void settle(SwapSlot& s);  // waits for its transfer; resident or out afterwards
  void poll_writes();
  void drain_writes();  // waits for every write in flight and frees its buffer
  bool make_room(int64_t bytes, bool must);
  void adopt_grads(int group);
  void track(int64_t delta);
  void fit_pool();            // kept buffers give way to what is held
  void release(SwapSlot& s);  // its buffer goes to the pool; the storage empties
  void step_streamed(double lr, const at::Tensor& coef);

  graph::OpDag& dag_;
  train::AdamW& optimizer_;
  SwapPlan plan_;
  std::unique_ptr<Tier> tier_;
  int64_t micro_batches_;
  std::vector<int> node_group_;
  std::vector<std::vector<int>> group_params_;  // parameters each group reads
  std::vector<int> owner_;                      // first group reading each parameter
  std::vector<SwapSlot> values_, grads_, exp_avg_, exp_avg_sq_;
  std::vector<at::Tensor> norms_;  // per parameter, taken when its gradient is final
  std::vector<SwapSlot*> writing_;
  std::vector<char*> staging_;
  BufferPool pool_;
  int64_t held_ = 0;
  int64_t reserved_ = 0;  // gradients the running group's backward is about to create
  uint64_t epoch_ = 1;    // slots start with guard 0: unguarded
  bool in_step_ = false;
  int64_t micro_ = 0;
  int current_ = -1;
  bool current_backward_ = false;
  int64_t task_ = -1;
  double step_start_s_ = 0, step_start_wait_s_ = 0;
  SwapStats stats_;
};

}  // namespace starling::swap
