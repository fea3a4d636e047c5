// OP-Fence (FusionLLM's scheduler) over a cost table (cost_table.h): group the devices by the
// bandwidth between them, order the groups into a chain whose joins are the fastest links between
// groups, and cut the model's nodes into contiguous stages along that chain so that the slowest
// stage or link is as fast as it can be (exact dynamic programming over the cut points). A faster
// device gets more nodes; a slow link gets the cut with the fewest bytes.
//
// The time model, per micro-batch: a stage on device d takes the sum of its nodes' compute_s over
// d's speed (forward and backward); a link between consecutive stages takes the cut's bytes over
// its bandwidth plus its latency, in each direction (activations forward, their gradients back,
// on the two directions of the link at once). A device with one upload for everything it sends
// (DeviceCost::egress_bytes_per_s: a star network) adds a part of its own: the bytes its stage
// sends both ways per micro-batch, activations to the next stage and gradients to the previous
// one, over that upload. The cut minimises the slowest part; with M micro-batches the steady state
// of a step is
//   sum of the stages + 2 x sum of the links + (M - 1) x the slowest part
// (the first micro-batch goes through everything forward and back; the others follow at the pace
// of the slowest part: GPipe's and 1F1B's steady state). The predicted step plays the schedule
// through instead (pipeline_sim.h), which also counts the waits of a stage whose micro-batches in
// flight do not cover their round trip over a slow link. Torch-free.
#pragma once

#include <vector>

#include "starling/sched/cost_table.h"

namespace starling::sched {

struct StagePlan {
  int first = 0, last = 0;  // nodes, inclusive
  int device = 0;           // index into CostTable::devices
  double compute_s = 0;     // per micro-batch, forward and backward
  double link_s = 0;        // to the next stage, per micro-batch and direction; 0 for the last
  // Through the device's one upload (a star's), per micro-batch: activations forward and
  // gradients back together; 0 without one.
  double egress_s = 0;
};

struct PipelinePlan {
  std::vector<StagePlan> stages;
  double bottleneck_s = 0;   // the slowest stage, link or upload
  double steady_step_s = 0;  // the steady-state formula above (what the cut's tie-break weighs)
  double step_s = 0;         // predicted time of an optimizer step (simulate_step)
};

// Devices grouped so that the links inside a group are much faster than those between groups:
// the pairs' bandwidths are split at their largest ratio gap when it is at least `gap` (otherwise
// one group), and groups are the connected sets of the faster links. Groups in order of their
// first device; devices ascending within a group.
std::vector<std::vector<int>> cluster_devices(const CostTable& t, double gap = 4.0);

// Every device once, in pipeline order: groups one after another in the order whose slowest join
// is fastest (all orders for up to 8 groups, nearest neighbour beyond), and each group's devices
// in the order whose slowest link, the join from the previous group and the best way on into the
// next included, is fastest (all orders for up to 8 devices).
std::vector<int> device_chain(const CostTable& t, const std::vector<std::vector<int>>& clusters);

// One stage per device of `chain`, in order, each with at least one node: the cut that minimises
// the slowest stage or link, and among those the smallest sum of stage and link times (so the
// steady-state step too). std::invalid_argument if the chain is empty, longer than the nodes,
// or names a device twice.
PipelinePlan cut_pipeline(const CostTable& t, const std::vector<int>& chain);

// The same stages split evenly by node count (the first ones one node longer), as a baseline.
PipelinePlan uniform_pipeline(const CostTable& t, const std::vector<int>& chain);

// A plan's stages priced under the model above: the parts' times, the steady-state step and the
// simulated one (simulate_step).
void price(const CostTable& t, PipelinePlan& plan);

// The whole scheduler: clusters, chain, then the contiguous window of the chain (of any length
// from one device up) whose best cut predicts the shortest step. Devices outside the window are
// left for other pipeline replicas.
PipelinePlan op_fence(const CostTable& t, double gap = 4.0);

// Every device of the table at work, as R pipeline replicas of S stages with one cut shared by
// all replicas (each stage averages with its counterparts, so they must hold the same nodes):
// replica r runs its stages along the window chain[r * S .. r * S + S - 1] of OP-Fence's chain,
// in either direction, so a pipeline stays inside a fast group where it can.
struct ReplicatedPlan {
  std::vector<int> chain;
  int stages = 0, replicas = 0;
  std::vector<PipelinePlan> pipelines;  // per replica, priced on its own devices
  double averaging_s = 0;  // one averaging of every stage with its counterparts (the slowest)
  double sync_s = 0;       // what averaging adds to a step
  double step_s = 0;       // the slowest replica's step plus sync_s
  // Micro-batches the swarm trains per second: replicas x micro_batches / step_s.
  double micro_batches_per_s = 0;
};

// How replicas average: once every `every_steps` steps (1 for ddp, tau for localsgd, diloco and
// co2), and whether the averaging overlaps the next steps' computation (co2) or stops them.
struct ReplicaSync {
  double every_steps = 1;
  bool overlapped = false;
};

// For every stage count S >= 2 (S = the device count when replicas are not allowed) that divides
// the device count and is at most the node count, and every direction of each replica's window:
// the cut minimising the slowest stage or link over all replicas at once (cut_pipeline over a
// chain of "slowest counterpart" devices, each stage's speed and each link the slowest of its
// counterparts'; exact when links have no latency, as in labs without delays), priced per replica.
// An averaging is a ring all-reduce of each stage's parameters over its counterparts' slowest link,
// 2 (R - 1) / R x param_bytes / bandwidth; per step it adds averaging_s / every_steps, or,
// overlapped, what of that exceeds the step. Returns the plan with the most micro-batches per
// second (then the cheapest averaging). std::invalid_argument saying why when no S fits (fewer than
// 2 devices or nodes; more devices than nodes without replicas; no S in [2, nodes] dividing the
// devices) or every_steps <= 0.
ReplicatedPlan plan_replicas(const CostTable& t, bool replicas_allowed, const ReplicaSync& sync,
                             double gap = 4.0);

// Prices `p`'s pipelines again on `t` (the same stages, cut and devices; say, other cut bytes),
// and its step and rate as plan_replicas does; the averaging's time is kept.
void reprice(const CostTable& t, ReplicatedPlan& p, const ReplicaSync& sync);

}  // namespace starling::sched
