// A peer that runs one stage of a pipeline (pipeline_runner.h): joins the swarm, learns from the
// members' roles which member runs which stage, and trains its stage. strategy/peer.h calls it
// when [pipeline] is set.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "starling/net/node.h"
#include "starling/strategy/peer.h"

namespace starling::strategy {

// Where each member of a swarm of pipeline replicas sits: peers[replica][stage].
using PipelineGrid = std::vector<std::vector<net::PeerId>>;

// A pipeline peer's place as its member record announces it (net::MemberInfo::role), and back.
struct PipelinePlace {
  int stage = 0, stages = 1, replica = 0, replicas = 1;
};
std::string pipeline_role(const PipelinePlace& p);
// nullopt when `role` is not a pipeline peer's.
std::optional<PipelinePlace> parse_pipeline_role(const std::string& role);

// Waits until every place of `mine`'s grid (stages x replicas) is held by an alive member, this
// one included, and returns who holds which; a member still placing itself (kAutoPipelineRole)
// holds no place yet. NetError at once when a member is not a pipeline peer, counts other stages or
// replicas, or claims a place another alive member holds; and after `timeout` (net.join_timeout_s),
// naming the places still empty.
PipelineGrid wait_for_places(const net::Node& node, const PipelinePlace& mine,
                             std::chrono::milliseconds timeout);

// The whole run of a pipeline stage peer (net.backend = "starling"; check_pipeline_peer passed, or
// check_auto_pipeline_peer with stages = "auto", when the peers first agree on a plan and each
// takes its place from it: pipeline_auto_peer.h): joins inactive with its place as its role, waits
// for every place (wait_for_places) and for every stage to take part, then trains its stage. A peer
// that comes back under a key the swarm knew (a replacement) first waits until a whole replica
// admits it (pipeline_admission.h); with pipeline.replacement_wait_s, a stage whose pipeline lost a
// peer leaves, joins again inactive and waits the same way instead of stopping.
train::TrainResult run_pipeline_peer(const train::RunConfig& config, const PeerOptions& options);

}  // namespace starling::strategy
