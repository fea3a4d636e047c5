// pipeline.stages = "auto" among peers started one by one (`starling peer`, or a launcher such as
// torchrun): no launcher knows the swarm, so its peers measure it and agree on one plan.
//
// Every peer joins with the role "pipeline auto" and waits for net.min_peers of them. Each then
// profiles the model on its own device (sched::profile_workload; under its own CPU share, GPU or
// thread count) and reports to the planner, the peer with the lowest id: its forward-plus-backward
// time of one micro-batch and the bandwidth it measured into itself from every other peer (the
// probe each member sends a newcomer; net::Node::links). The planner lays the reports over the
// model's cost table (its own profile, or pipeline.profile), runs OP-Fence (plan_on_costs), and
// sends the plan to every peer. Each takes its place as its role (net::Node::set_role) and the
// pipeline starts as if its stages had been configured by hand. Every peer keeps the plan in its
// out_dir, so --resume places it as before without measuring again.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "starling/net/node.h"
#include "starling/sched/cost_table.h"
#include "starling/strategy/auto_pipeline.h"

namespace starling::train {
struct RunConfig;
}

namespace starling::strategy {

// The role a peer announces while the swarm plans.
inline constexpr const char* kAutoPipelineRole = "pipeline auto";

// What a peer measured, for the planner.
struct PeerReport {
  net::PeerId id = 0;
  std::string name;  // net.name, for the plan's report
  // Forward plus backward of one micro-batch of the whole model on this peer (its profile's sum).
  double compute_s = 0;
  // Bandwidth measured on the link from each other peer into this one.
  std::map<net::PeerId, double> inbound_bytes_per_s;
  // Round trip of this peer's pings to each other peer, in seconds (gossip's; absent where none
  // came back yet).
  std::map<net::PeerId, double> rtt_s;
};

std::vector<uint8_t> encode_report(const PeerReport& r);
// NetError naming `sender` when the bytes are not a report, or one about another peer.
PeerReport decode_report(std::span<const uint8_t> bytes, net::PeerId sender);

// The swarm's cost table: `reference`'s nodes (times on a device of speed 1), one device per
// report in the reports' order with speed = the reference's total time / the peer's own, and
// links[a][b] = what b measured from a. A direction nobody measured takes the other direction's
// figure; a pair measured in neither takes sched::kUnshapedBytesPerS, and `unmeasured` (when
// given) names it. A link's latency is half the round trip a measured between a and b (or, if a
// has none, b's), 0 where neither pinged the other. Deterministic, so the table is the same
// wherever it is built.
sched::CostTable swarm_costs(const sched::CostTable& reference,
                             const std::vector<PeerReport>& reports,
                             std::vector<std::string>* unmeasured = nullptr);

// What a peer given stages = "auto" refuses before it joins (ConfigError naming the keys): a
// place or replica count set by hand, fewer than two peers to plan among (net.min_peers, which
// WORLD_SIZE sets), and check_any_cut.
void check_auto_pipeline_peer(const train::RunConfig& config);
// What a pipeline peer refuses whatever the cut (check_pipeline_peer on any two stages): the
// strategy, dtype, backend or swapping.
void check_any_cut(const train::RunConfig& config);

// The agreement above, run by every peer on `node` (joined with kAutoPipelineRole). Returns the
// plan with `self` set to this peer's device, and with trial_steps > 0 when the planner's
// pipeline.calibrate_steps (calibration_steps) asks for trials first (calibrate_among_peers).
// On the planner, `swarm` (when given) receives the cost table it planned on. NetError when the
// peers do not all arrive, a member is not planning too, or a report or the plan does not come
// within `timeout`; ConfigError when no pipeline fits the peers.
AutoPipeline agree_on_pipeline(net::Node& node, const train::RunConfig& config,
                               std::chrono::milliseconds timeout,
                               sched::CostTable* swarm = nullptr);

// Runs one trial of `plan` on this peer (its place: plan.self) for plan.trial_steps steps; `n`
// counts the trials from 1. Returns the compute per micro-batch of this peer's stage over the
// steps a trial times (trial_seconds_per_micro_batch).
using RunTrial = std::function<double(const AutoPipeline& plan, int n)>;

// pipeline.calibrate_steps among peers that plan themselves. While `plan` asks for a trial, every
// peer runs it (`run_trial`) and sends the planner what its stage measured; the planner, which
// holds the cost table `swarm` it planned on (agree_on_pipeline's), calibrates the speeds and
// plans again (PlanTrials), and sends every peer the next plan: another trial, or the one to run,
// whose report says what every trial measured. A peer starts a trial or the run only once the
// planner has heard from all of them, so no peer's trial overlaps another's next one. Returns the
// plan to run (trial_steps = 0, `self` set). NetError when a figure or a plan does not come
// within `timeout` of this peer's own trial, or is malformed.
AutoPipeline calibrate_among_peers(net::Node& node, const train::RunConfig& config,
                                   AutoPipeline plan, const sched::CostTable& swarm,
                                   const RunTrial& run_trial, std::chrono::milliseconds timeout);

}  // namespace starling::strategy
