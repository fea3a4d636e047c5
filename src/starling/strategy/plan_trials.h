// The trials of pipeline.calibrate_steps, whoever plans: the local launcher (cli/local_swarm.cpp)
// and the planner among peers that plan themselves (pipeline_auto_peer.h). A trial trains the
// plan for a few steps where the peers run; each device's speed becomes its stage's profiled time
// over what it measured there (sched::calibrate_speeds), and OP-Fence plans again. A peer's speed
// also depends on which nodes it computes and beside whom, so a plan that moved the stages is
// tried once more (at most kMaxTrials: a plan could move back and forth). The run keeps one of
// the plans tried, priced at what its own stages measured: the one predicting the shortest step
// that way. A plan OP-Fence moved to but nobody tried has no such price, so it is never kept.
#pragma once

#include <string>
#include <vector>

#include "starling/sched/calibration.h"
#include "starling/sched/cost_table.h"
#include "starling/strategy/auto_pipeline.h"
#include "starling/train/config.h"

namespace starling::strategy {

class PlanTrials {
 public:
  static constexpr int kMaxTrials = 2;

  // `first`: the plan from the assumed speeds of `costs` (plan_on_costs over them, same config).
  // `where` names the cost table's source in OP-Fence's errors.
  PlanTrials(const train::RunConfig& config, sched::CostTable costs, AutoPipeline first,
             std::string where);

  // The plan the next trial runs: the first, then the one the measured speeds moved to.
  const AutoPipeline& next() const { return next_; }
  int trials() const { return static_cast<int>(tried_.size()); }

  // What a trial of next() measured, one timing per device. Returns true when another trial is
  // due (the measured speeds move the stages and fewer than kMaxTrials ran); next() is then it.
  bool record(const std::vector<sched::StageTiming>& timings);

  // The tried plan the run keeps, its report preceded by what every trial measured (`timed`
  // says which steps of a trial were timed). Needs at least one recorded trial.
  AutoPipeline kept(const sched::TimedSteps& timed) const;

 private:
  train::RunConfig config_;
  sched::CostTable costs_;
  std::string where_;
  double assumed_step_s_ = 0;
  AutoPipeline next_;
  std::vector<AutoPipeline> tried_;  // each priced at its own trial's speeds
  std::string measured_;
};

// What a trial of `trial_steps` steps misses of the run's rounds ("plan: note: ...\n"; empty when
// it times a round after the first, or the strategy has no rounds).
std::string trial_note(const train::RunConfig& config, int64_t trial_steps);

}  // namespace starling::strategy
