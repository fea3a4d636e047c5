// Device speeds from a trial run (pipeline.calibrate_steps): the speed a cost table gives a
// device is an assumption (the reference profile scaled by a CPU quota, or a profile taken alone),
// while a device's real speed depends on what else runs beside it. A peer that computed a stage
// for a few steps measured what that stage costs it per micro-batch; its speed is then the
// stage's profiled time over that. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "starling/sched/cost_table.h"

namespace starling::sched {

// A device's stage in the trial and what it measured.
struct StageTiming {
  int device = -1;
  int64_t first = 0, last = 0;  // the stage's node range
  double seconds_per_micro_batch = 0;
};

// The steps of a trial of `steps` steps that calibration times, always after the first (which
// warms the allocator and the caches). With rounds of `round_steps` steps (localsgd, diloco, co2:
// strategy.local_steps; 1 for none), the last whole rounds among them, and their mean: a round's
// first step computes beside the averaging the round before launched, slower by 10-20% on a
// peer held to a CPU quota, and the run pays that once a round. The run's first round has no
// averaging before it, and every later round does (in 136 peers' co2 runs on the labs, the
// second round computed at 0.92-1.18x the first's, median 1.03), so a trial of two rounds or
// more times only rounds after the first. With fewer steps than a round after the first, or
// without rounds, every step after the first, and their median (which one disturbed step does
// not move).
struct TimedSteps {
  int64_t first = 0, last = 0;     // inclusive; first > last when nothing can be timed
  bool mean = false;               // otherwise the median
  int64_t rounds = 0;              // how many whole rounds they are (0: not whole rounds)
  bool after_first_round = false;  // they leave out the run's first round
  std::string describe() const;    // "steps 5-8 (1 whole round after the first), their mean"
};
TimedSteps timed_steps(int64_t steps, int64_t round_steps);

// The compute per micro-batch a run's step records show over the steps of `timed`: `cumulative`
// holds (step, the stage's compute seconds so far) in step order; a step's compute is its growth
// from the step before. The mean or median of the timed steps', over `micro_batches`; < 0 when a
// timed step or the one before the first of them is missing.
double compute_per_micro_batch(const std::vector<std::pair<int64_t, double>>& cumulative,
                               int64_t micro_batches, const TimedSteps& timed);

// Sets each timed device's speed to its stage's profiled compute over the measured time; devices
// without a timing keep theirs. ConfigError naming the device on a device or node range outside
// `t`, or a time that is not finite and positive. Returns one line per timed device: its speed
// before and after.
std::string calibrate_speeds(CostTable& t, const std::vector<StageTiming>& timings);

}  // namespace starling::sched
