// Plans as people read them: one line per stage (device, nodes, compute and link time per
// micro-batch) and the predicted step, for `starling plan pipeline` and the local launcher's
// stages = "auto". Torch-free.
#pragma once

#include <string>

#include "starling/sched/op_fence.h"

namespace starling::sched {

// "12.3 ms" under a second, "1.23 s" above.
std::string format_seconds(double s);

// A table of the plan's stages and its slowest part and predicted step.
std::string describe_plan(const CostTable& t, const PipelinePlan& p);

// The replicas' common cut (replica 0's stages, then each other replica's devices), the
// averaging's share and the predicted step and throughput.
std::string describe_plan(const CostTable& t, const ReplicatedPlan& p);

}  // namespace starling::sched
