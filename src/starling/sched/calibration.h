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

// The compute per micro-batch a run's step records show: `cumulative` holds (step, the stage's
// compute seconds so far) in step order. The median over steps after the first (which warms the
// allocator and the caches) of each step's growth, over `micro_batches`; < 0 when there are fewer
// than two steps.
double compute_per_micro_batch(const std::vector<std::pair<int64_t, double>>& cumulative,
                               int64_t micro_batches);

// Sets each timed device's speed to its stage's profiled compute over the measured time; devices
// without a timing keep theirs. ConfigError naming the device on a device or node range outside
// `t`, or a time that is not finite and positive. Returns one line per timed device: its speed
// before and after.
std::string calibrate_speeds(CostTable& t, const std::vector<StageTiming>& timings);

}  // namespace starling::sched
