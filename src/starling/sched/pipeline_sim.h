// The time of one optimizer step of a pipeline plan, by playing its schedule through: every stage
// runs its micro-batches' forwards and backwards in the order the pipeline runner does (GPipe, or
// 1F1B with its warm-up and CostTable::extra_warmup), each as soon as the stage is free and its
// input has arrived; every tensor a stage sends queues on its link, one at a time per direction
// (and on the sender's one upload and the receiver's one download where they have them: a
// star's), and arrives its latency after its last byte left. The step ends when the last backward
// is done.
//
// The steady-state formula of op_fence.h counts the slowest part once per micro-batch. On a slow
// link that is not enough: with 1F1B a stage holds only a few micro-batches in flight, and when
// their round trip across the link (forward over it, the later stages' work, gradients back)
// outlasts the stage's warm-up, the stage waits; the simulation counts those waits. Still not
// counted: the optimizer's update, the loss and norm shared at the end of a step, and the CPU time
// sending takes from compute. Torch-free.
#pragma once

#include "starling/sched/cost_table.h"

namespace starling::sched {

struct PipelinePlan;

// Each stage's forward time per micro-batch (the forward_s of its nodes over its device's speed)
// and backward time (the rest of compute_s), then the step played through. `plan` needs only its
// stages' nodes and devices. std::invalid_argument on an empty plan or a stage out of range.
double simulate_step(const CostTable& t, const PipelinePlan& plan);

}  // namespace starling::sched
