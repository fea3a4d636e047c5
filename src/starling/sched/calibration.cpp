#include "starling/sched/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "starling/common/error.h"

namespace starling::sched {

TimedSteps timed_steps(int64_t steps, int64_t round_steps) {
  TimedSteps t{.first = 2, .last = steps};
  if (round_steps > 1 && steps - 1 >= round_steps) {
    // Steps 1..round_steps are the first round, and step round_steps + 1 is the first to
    // compute beside its averaging: from there when a whole round follows, else from step 2.
    t.after_first_round = steps >= 2 * round_steps;
    const int64_t from = t.after_first_round ? round_steps + 1 : 2;
    const int64_t rounds = (steps - from + 1) / round_steps;
    t.first = steps - rounds * round_steps + 1;
    t.mean = true;
    t.rounds = rounds;
  }
  return t;
}

std::string TimedSteps::describe() const {
  const std::string steps = "steps " + std::to_string(first) + "-" + std::to_string(last);
  if (rounds == 0) return steps + ", their median";
  return steps + " (" + std::to_string(rounds) + " whole round" + (rounds > 1 ? "s" : "") +
         (after_first_round ? " after the first" : "") + "), their mean";
}

double compute_per_micro_batch(const std::vector<std::pair<int64_t, double>>& cumulative,
                               int64_t micro_batches, const TimedSteps& timed) {
  if (micro_batches < 1 || timed.first > timed.last || timed.first < 2) return -1;
  auto at = [&](int64_t step) -> const double* {
    for (const auto& [s, seconds] : cumulative)
      if (s == step) return &seconds;
    return nullptr;
  };
  std::vector<double> per_step;
  for (int64_t s = timed.first; s <= timed.last; ++s) {
    const double *before = at(s - 1), *after = at(s);
    if (before == nullptr || after == nullptr) return -1;
    per_step.push_back(*after - *before);
  }
  double seconds = 0;
  if (timed.mean) {
    for (const double x : per_step) seconds += x;
    seconds /= static_cast<double>(per_step.size());
  } else {
    std::sort(per_step.begin(), per_step.end());
    const size_t n = per_step.size();
    seconds = n % 2 ? per_step[n / 2] : (per_step[n / 2 - 1] + per_step[n / 2]) / 2;
  }
  return seconds / static_cast<double>(micro_batches);
}

std::string calibrate_speeds(CostTable& t, const std::vector<StageTiming>& timings) {
  std::string report;
  for (const StageTiming& m : timings) {
    const std::string who = "calibration of device " + std::to_string(m.device);
    if (m.device < 0 || static_cast<size_t>(m.device) >= t.devices.size())
      throw ConfigError(who + ": the table has " + std::to_string(t.devices.size()) + " devices");
    if (m.first < 0 || m.last < m.first || static_cast<size_t>(m.last) >= t.nodes.size())
      throw ConfigError(who + ": nodes " + std::to_string(m.first) + "-" + std::to_string(m.last) +
                        " are not a range of the table's " + std::to_string(t.nodes.size()));
    if (!(m.seconds_per_micro_batch > 0) || !std::isfinite(m.seconds_per_micro_batch))
      throw ConfigError(who + ": a measured time of " + std::to_string(m.seconds_per_micro_batch) +
                        " s per micro-batch");
    double profiled = 0;
    for (int64_t n = m.first; n <= m.last; ++n)
      profiled += t.nodes[static_cast<size_t>(n)].compute_s;
    DeviceCost& d = t.devices[static_cast<size_t>(m.device)];
    const double before = d.speed;
    // A stage of nodes the profile timed at nothing says nothing about the device.
    if (profiled > 0) d.speed = profiled / m.seconds_per_micro_batch;
    char line[256];
    std::snprintf(
        line, sizeof line,
        "    device %d (%s): nodes %lld-%lld took %.1f ms per micro-batch against %.1f ms "
        "planned: speed x%.2f (was x%.2f)\n",
        m.device, d.name.c_str(), static_cast<long long>(m.first), static_cast<long long>(m.last),
        1e3 * m.seconds_per_micro_batch, 1e3 * profiled / before, d.speed, before);
    report += line;
  }
  return report;
}

}  // namespace starling::sched
