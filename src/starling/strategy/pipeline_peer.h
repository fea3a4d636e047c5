// A peer that runs one stage of a pipeline (pipeline_runner.h): joins the swarm, learns which
// member runs which stage, and trains its stage. strategy/peer.h calls it when [pipeline] is set.
#pragma once

#include <chrono>
#include <vector>

#include "starling/net/node.h"
#include "starling/strategy/peer.h"

namespace starling::strategy {

// Every member tells every other which stage it runs (a point-to-point message each way); the
// result is the peer of each stage, this one's included. NetError when a member does not answer
// within `timeout`, two claim the same stage, a stage has no peer, or the swarm has more members
// than stages.
std::vector<net::PeerId> pipeline_roles(net::Node& node, int stage, int stages,
                                        std::chrono::milliseconds timeout);

// The whole run of a pipeline stage peer (net.backend = "starling"; check_pipeline_peer passed).
train::TrainResult run_pipeline_peer(const train::RunConfig& config, const PeerOptions& options);

}  // namespace starling::strategy
