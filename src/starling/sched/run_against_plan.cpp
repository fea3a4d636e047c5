#include "starling/sched/run_against_plan.h"

#include <algorithm>
#include <cstdio>

#include "starling/sched/plan_report.h"

namespace starling::sched {

namespace {

std::string fixed(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

}  // namespace

std::string RunAgainstPlan::describe_step() const {
  return "a step took " + format_seconds(measured_step_s) + " against the " +
         format_seconds(predicted_step_s) + " predicted (predicted / measured " +
         fixed("%.2f", predicted_step_s / measured_step_s) + ") over steps " +
         std::to_string(from + 1) + "-" + std::to_string(to);
}

std::string RunAgainstPlan::describe_own() const {
  std::string out = describe_step();
  for (const PeerAgainstPlan& p : peers)
    out += "; stage " + std::to_string(p.stage) + " computed " + format_seconds(p.measured_s) +
           " per micro-batch against the " + format_seconds(p.planned_s) + " planned (x" +
           fixed("%.2f", p.ratio()) + ")";
  return out + "\n";
}

std::string RunAgainstPlan::describe() const {
  std::string out = describe_step() + "\n";
  for (const PeerAgainstPlan& p : peers)
    out += "  peer " + std::to_string(p.peer) + ", stage " + std::to_string(p.stage) +
           ": computed " + format_seconds(p.measured_s) + " per micro-batch against " +
           format_seconds(p.planned_s) + " planned (x" + fixed("%.2f", p.ratio()) + ")\n";
  return out;
}

std::optional<RunAgainstPlan> run_against_plan(const std::vector<std::vector<StepRecord>>& records,
                                               const std::vector<PlannedPeer>& planned,
                                               int64_t micro_batches, double predicted_step_s,
                                               const TimedSteps& timed) {
  if (records.empty() || records.size() != planned.size() || micro_batches < 1 ||
      timed.first > timed.last || !(predicted_step_s > 0))
    return std::nullopt;
  RunAgainstPlan run{.predicted_step_s = predicted_step_s};
  for (size_t i = 0; i < records.size(); ++i) {
    if (!(planned[i].seconds_per_micro_batch > 0)) return std::nullopt;
    // The last invocation's records: a resumed run counts its compute and time from 0 again.
    // Its records say where it began; older ones only show it where a count went back, which a
    // resumed first step slower than all the steps before it hides.
    const auto& all = records[i];
    size_t start = 0;
    for (size_t r = 1; r < all.size(); ++r)
      if (all[r].run_from != all[r - 1].run_from || all[r].step <= all[r - 1].step ||
          all[r].compute_s < all[r - 1].compute_s || all[r].elapsed_s < all[r - 1].elapsed_s)
        start = r;
    const StepRecord* a = nullptr;
    const StepRecord* b = nullptr;
    for (size_t r = start; r < all.size(); ++r) {
      if (a == nullptr && all[r].step >= timed.first - 1) a = &all[r];
      if (all[r].step <= timed.last) b = &all[r];
    }
    if (a == nullptr || b == nullptr || b->step <= a->step) return std::nullopt;
    if (i == 0) {
      run.from = a->step;
      run.to = b->step;
    } else if (a->step != run.from || b->step != run.to) {
      return std::nullopt;
    }
    const double steps = static_cast<double>(b->step - a->step);
    run.measured_step_s = std::max(run.measured_step_s, (b->elapsed_s - a->elapsed_s) / steps);
    run.peers.push_back(
        {.peer = static_cast<int>(i),
         .stage = planned[i].stage,
         .planned_s = planned[i].seconds_per_micro_batch,
         .measured_s = (b->compute_s - a->compute_s) / steps / static_cast<double>(micro_batches)});
  }
  if (!(run.measured_step_s > 0)) return std::nullopt;
  return run;
}

}  // namespace starling::sched
