#include "starling/strategy/plan_trials.h"

#include <algorithm>
#include <utility>

#include "starling/common/error.h"
#include "starling/train/metrics.h"

namespace starling::strategy {
namespace {

bool same_places(const AutoPipeline& a, const AutoPipeline& b) {
  return a.stages == b.stages && a.stage_of == b.stage_of && a.replica_of == b.replica_of;
}

}  // namespace

PlanTrials::PlanTrials(const train::RunConfig& config, sched::CostTable costs, AutoPipeline first,
                       std::string where)
    : config_(config),
      costs_(std::move(costs)),
      where_(std::move(where)),
      assumed_step_s_(first.predicted_step_s),
      next_(std::move(first)) {}

bool PlanTrials::record(const std::vector<sched::StageTiming>& timings) {
  const int n = trials() + 1;
  measured_ += "  trial " + std::to_string(n) + ":\n" + sched::calibrate_speeds(costs_, timings);
  tried_.push_back(reprice_auto_pipeline(config_, costs_, next_));
  measured_ += "    its plan predicts " + train::fmt("%.2f", tried_.back().predicted_step_s) +
               " s a step at these speeds\n";
  AutoPipeline moved = plan_on_costs(config_, costs_, where_);
  if (same_places(moved, tried_.back()) || trials() >= kMaxTrials) return false;
  next_ = std::move(moved);
  return true;
}

AutoPipeline PlanTrials::kept(const sched::TimedSteps& timed) const {
  if (tried_.empty()) throw Error("PlanTrials::kept: no trial was recorded");
  const auto kept = std::min_element(
      tried_.begin(), tried_.end(),
      [](const auto& a, const auto& b) { return a.predicted_step_s < b.predicted_step_s; });
  const std::string which = tried_.size() == 1
                                ? std::string("its plan")
                                : "trial " + std::to_string(kept - tried_.begin() + 1) +
                                      "'s plan (the tried plan predicting the shortest step)";
  AutoPipeline plan = *kept;
  plan.report = "calibrated by " + std::to_string(tried_.size()) + " trial(s) timed over " +
                timed.describe() + "; the plan from the assumed speeds predicted " +
                train::fmt("%.2f", assumed_step_s_) + " s a step:\n" + measured_ +
                "the run keeps " + which + ", at the speeds its trial measured:\n" + plan.report;
  return plan;
}

std::string trial_note(const train::RunConfig& config, int64_t trial_steps) {
  const int64_t round = round_steps(config);
  const sched::TimedSteps timed = sched::timed_steps(trial_steps, round);
  const std::string steps = std::to_string(trial_steps), twice = std::to_string(2 * round);
  if (round > 1 && timed.rounds == 0)
    return "plan: note: a trial of " + steps + " steps times no whole " + config.strategy.kind +
           " round (strategy.local_steps = " + std::to_string(round) +
           "), so it misses what a round's first step costs beside the averaging; "
           "pipeline.calibrate_steps = " +
           twice + " times a round as the run has them\n";
  if (round > 1 && !timed.after_first_round)
    return "plan: note: a trial of " + steps + " steps times the first " + config.strategy.kind +
           " round, which computes with no averaging beside it, unlike the run's later rounds; "
           "pipeline.calibrate_steps = " +
           twice + " times the second\n";
  return "";
}

}  // namespace starling::strategy
