// OP-Fence (FusionLLM's scheduler) over a cost table (cost_table.h): group the devices by the
// bandwidth between them, order the groups into a chain whose joins are the fastest links between
// groups, and cut the model's nodes into contiguous stages along that chain so that the slowest
// stage or link is as fast as it can be (exact dynamic programming over the cut points). A faster
// device gets more nodes; a slow link gets the cut with the fewest bytes.
//
// The time model, per micro-batch: a stage on device d takes the sum of its nodes' compute_s over
// d's speed (forward and backward); a link between consecutive stages takes the cut's bytes over
// its bandwidth plus its latency, in each direction (activations forward, their gradients back,
// on the two directions of the link at once). With M micro-batches a step takes
//   sum of the stages + 2 x sum of the links + (M - 1) x the slowest stage or link
// (the first micro-batch goes through everything forward and back; the others follow at the pace
// of the slowest part: GPipe's and 1F1B's steady state). Torch-free.
#pragma once

#include <vector>

#include "starling/sched/cost_table.h"

namespace starling::sched {

struct StagePlan {
  int first = 0, last = 0;  // nodes, inclusive
  int device = 0;           // index into CostTable::devices
  double compute_s = 0;     // per micro-batch, forward and backward
  double link_s = 0;        // to the next stage, per micro-batch and direction; 0 for the last
};

struct PipelinePlan {
  std::vector<StagePlan> stages;
  double bottleneck_s = 0;  // the slowest stage or link
  double step_s = 0;        // predicted time of an optimizer step (the model above)
};

// Devices grouped so that the links inside a group are much faster than those between groups:
// the pairs' bandwidths are split at their largest ratio gap when it is at least `gap` (otherwise
// one group), and groups are the connected sets of the faster links. Groups in order of their
// first device; devices ascending within a group.
std::vector<std::vector<int>> cluster_devices(const CostTable& t, double gap = 4.0);

// Every device once, in pipeline order: groups one after another in the order whose slowest join
// is fastest (all orders for up to 8 groups, nearest neighbour beyond), and each group's devices
// in the order whose slowest link, the join from the previous group included, is fastest (all
// orders for up to 8 devices).
std::vector<int> device_chain(const CostTable& t, const std::vector<std::vector<int>>& clusters);

// One stage per device of `chain`, in order, each with at least one node: the cut that minimises
// the slowest stage or link, and among those the smallest sum of stage and link times (so the
// predicted step time too). std::invalid_argument if the chain is empty, longer than the nodes,
// or names a device twice.
PipelinePlan cut_pipeline(const CostTable& t, const std::vector<int>& chain);

// The same stages split evenly by node count (the first ones one node longer), as a baseline.
PipelinePlan uniform_pipeline(const CostTable& t, const std::vector<int>& chain);

// The step time of a plan's stages under the model above (fills in the times).
void price(const CostTable& t, PipelinePlan& plan);

// The whole scheduler: clusters, chain, then the contiguous window of the chain (of any length
// from one device up) whose best cut predicts the shortest step. Devices outside the window are
// left for other pipeline replicas.
PipelinePlan op_fence(const CostTable& t, double gap = 4.0);

}  // namespace starling::sched
