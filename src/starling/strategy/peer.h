// One peer of a training swarm: the collectives from [net] (Starling's swarm node, or a rank of a
// fixed Gloo/NCCL group), the strategy from [strategy], and the training loop, in one call.
// `starling peer` runs it directly; `starling train --peers N` launches N of them
// (cli/local_swarm.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "starling/net/node.h"
#include "starling/train/config.h"
#include "starling/train/step_hooks.h"
#include "starling/train/trainer.h"

namespace starling::strategy {

// The strategy named by config.strategy.kind (not "none"); ConfigError for an unknown kind. Its
// collectives run among `group` (a pipeline stage's counterparts), or the whole swarm when empty.
std::unique_ptr<train::StepHooks> make_strategy(const train::RunConfig& config,
                                                net::Collectives& net,
                                                std::vector<net::PeerId> group = {});

// A TrainOptions::on_record that tells the swarm how this peer trains (net::Node::set_progress):
// its latest step, loss, tokens, tokens/s and validation loss, and from the strategy's report the
// network wait, the round and its own figures (co2's staleness gap).
std::function<void(const nlohmann::json&)> publish_progress(net::Node& node);

struct PeerOptions {
  train::TrainOptions train;  // resume, progress, stop_at, data share, json_events
  // gloo/nccl: a launcher already hosts the rendezvous store at net.store (torchrun's agent).
  bool store_hosted_elsewhere = false;
};

// With [pipeline] set: one stage of a pipeline replica (pipeline_peer.h; pipeline.stage,
// replica and replicas placed first, see place_pipeline_peer). Otherwise,
// net.backend = "starling": joins (or starts) the swarm, waits for net.min_peers, trains with
// the strategy and leaves. With train.json_events the first stdout line is
// {"event":"listening","endpoint":...}, the address (with public key) other peers join through.
// net.backend = "gloo" or "nccl": forms the group (with train.json_events, rank 0 hosting the
// store first prints {"event":"listening","endpoint":"HOST:PORT"}, the store's address) of
// net.world_size ranks at net.store (ConfigError when net.rank, net.world_size or net.store is
// unset, or nccl without a CUDA train.device), then trains; a rank that fails ends every rank's run
// with a NetError.
train::TrainResult run_peer(const train::RunConfig& config, const PeerOptions& options);

}  // namespace starling::strategy
