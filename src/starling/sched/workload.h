// The workload estimator's measuring half (FusionLLM): profiles a config's model on this machine
// and writes what OP-Fence needs of it into a cost table (cost_table.h). Each node's forward and
// backward time comes from the same node profiler the swap planner uses (swap/profile.h), warm
// (the faster of two passes); each cut's bytes are the activations that cross it, from the nodes'
// output shapes at the run's micro-batch, in fp32. This machine is the table's one device, the
// reference (speed 1); other devices and the links between them are added by whoever plans
// (`starling plan pipeline`).
#pragma once

#include "starling/sched/cost_table.h"

namespace starling::train {
struct RunConfig;
}

namespace starling::sched {

// With steady_seconds > 0 the passes after the first go on until that much time has passed and
// each node's time is its mean over them: under a CPU quota enforced in short periods (a lab's
// cgroups), a single pass of a small model can fit in one period's allowance and never wait
// for the next, where training does.
CostTable profile_workload(const train::RunConfig& config, double steady_seconds = 0);

}  // namespace starling::sched
