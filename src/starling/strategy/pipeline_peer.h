// A peer that runs one stage of a pipeline (pipeline_runner.h): joins the swarm, learns which
// member runs which stage, and trains its stage. strategy/peer.h calls it when [pipeline] is set.
#pragma once

#include <chrono>
#include <vector>

#include "starling/net/node.h"
#include "starling/strategy/peer.h"

namespace starling::strategy {

// Where each member of a swarm of pipeline replicas sits: peers[replica][stage].
using PipelineGrid = std::vector<std::vector<net::PeerId>>;

// Every member tells every other which replica and stage it runs (a point-to-point message each
// way); the result holds the peer of every place, this one's included. NetError when a member
// does not answer within `timeout`, claims a place out of range or one already claimed, or the
// swarm's size is not stages x replicas.
PipelineGrid pipeline_roles(net::Node& node, int stage, int replica, int stages, int replicas,
                            std::chrono::milliseconds timeout);

// The whole run of a pipeline stage peer (net.backend = "starling"; check_pipeline_peer passed).
train::TrainResult run_pipeline_peer(const train::RunConfig& config, const PeerOptions& options);

}  // namespace starling::strategy
