#include "starling/strategy/pipeline_peer.h"

#include <cstring>
#include <iostream>

#include "starling/common/error.h"
#include "starling/strategy/pipeline_runner.h"
#include "starling/train/events.h"
#include "starling/train/precision.h"
#include "starling/train/session.h"

namespace starling::strategy {
namespace {

constexpr uint64_t kRoleTag = 0x70697065726f6c65;  // "pipe" "role"

}  // namespace

PipelineGrid pipeline_roles(net::Node& node, int stage, int replica, int stages, int replicas,
                            std::chrono::milliseconds timeout) {
  std::vector<net::PeerId> others;
  for (const auto& m : node.members())
    if (m.state == net::MemberState::alive && m.info.id != node.id()) others.push_back(m.info.id);
  const int places = stages * replicas;
  if (static_cast<int>(others.size()) + 1 != places)
    throw NetError("pipeline: the swarm has " + std::to_string(others.size() + 1) + " peers for " +
                   std::to_string(replicas) + " replica" + (replicas == 1 ? "" : "s") + " of " +
                   std::to_string(stages) +
                   " stages; it needs exactly one peer per stage of each "
                   "replica (pipeline.replicas)");
  std::vector<uint8_t> mine(8);
  const int32_t said[2] = {static_cast<int32_t>(stage), static_cast<int32_t>(replica)};
  std::memcpy(mine.data(), said, 8);
  std::vector<net::Transfer> answers;
  for (const net::PeerId p : others) {
    node.send(p, kRoleTag, mine);
    answers.push_back(node.recv(p, kRoleTag));
  }
  PipelineGrid grid(static_cast<size_t>(replicas),
                    std::vector<net::PeerId>(static_cast<size_t>(stages), 0));
  grid[static_cast<size_t>(replica)][static_cast<size_t>(stage)] = node.id();
  for (size_t i = 0; i < others.size(); ++i) {
    const std::string who = "peer " + net::short_peer_id(others[i]);
    if (!answers[i].wait_for(timeout))
      throw NetError("pipeline: " + who + " did not say which stage it runs within " +
                     std::to_string(timeout.count() / 1000) + " s");
    const std::vector<uint8_t> bytes = answers[i].wait();
    int32_t theirs[2] = {-1, -1};
    if (bytes.size() == 8) std::memcpy(theirs, bytes.data(), 8);
    if (theirs[0] < 0 || theirs[0] >= stages || theirs[1] < 0 || theirs[1] >= replicas)
      throw NetError("pipeline: " + who + " claims stage " + std::to_string(theirs[0]) +
                     " of replica " + std::to_string(theirs[1]) + " in a swarm of " +
                     std::to_string(replicas) + " replica" + (replicas == 1 ? "" : "s") + " of " +
                     std::to_string(stages) +
                     " stages (pipeline.replicas and num_stages must "
                     "agree on every peer)");
    net::PeerId& slot = grid[static_cast<size_t>(theirs[1])][static_cast<size_t>(theirs[0])];
    if (slot != 0)
      throw NetError("pipeline: stage " + std::to_string(theirs[0]) + " of replica " +
                     std::to_string(theirs[1]) + " is claimed by " + who + " and by peer " +
                     net::short_peer_id(slot) +
                     "; give each peer its own pipeline.stage and pipeline.replica");
    slot = others[i];
  }
  return grid;
}

train::TrainResult run_pipeline_peer(const train::RunConfig& config, const PeerOptions& options) {
  net::NodeOptions node_opts = net::node_options(config.net);
  net::Node node(node_opts);
  const std::string entry =
      node_opts.insecure ? node.endpoint() : node_opts.keys.public_key + "@" + node.endpoint();
  if (options.train.json_events) std::cout << train::events::listening(entry).dump() << std::endl;
  const int stages = static_cast<int>(config.pipeline.count());
  const int stage = static_cast<int>(config.pipeline.stage);
  const int replicas = static_cast<int>(config.pipeline.replicas);
  const int replica = static_cast<int>(config.pipeline.replica);
  const int places = stages * replicas;
  std::cerr << "peer " << net::short_peer_id(node.id()) << " (pipeline stage " << stage << " of "
            << stages;
  if (replicas > 1) std::cerr << ", replica " << replica << " of " << replicas;
  std::cerr << ") listening at " << entry << "\n";
  const auto timeout = std::chrono::seconds(config.net.join_timeout_s);
  if (!node.wait_for_members(static_cast<size_t>(places), timeout))
    throw NetError("only " + std::to_string(node.members().size()) + " of the " +
                   std::to_string(places) + " pipeline peers arrived within net.join_timeout_s = " +
                   std::to_string(config.net.join_timeout_s) + " s");
  const PipelineGrid grid = pipeline_roles(node, stage, replica, stages, replicas, timeout);
  // This stage's counterparts in every replica average it through the strategy.
  std::vector<net::PeerId> counterparts;
  for (const auto& pipeline : grid) counterparts.push_back(pipeline[static_cast<size_t>(stage)]);

  // The end-of-run sample would need the whole model on one peer.
  train::RunConfig c = config;
  c.train.sample_at_end = false;
  train::TrainOptions t = options.train;
  // A stage builds, holds, steps and checkpoints only the parameters its nodes read.
  t.model_part = [&c, stage](int nodes) {
    return stage_ranges(c.pipeline, nodes).at(static_cast<size_t>(stage));
  };
  std::unique_ptr<train::StepHooks> hooks;
  if (c.strategy.kind != "none") hooks = make_strategy(c, node, counterparts);
  t.hooks = hooks.get();
  t.step_runner = [&](train::Session& s,
                      train::ProgressLine&) -> std::unique_ptr<train::StepRunner> {
    PipelineLayout layout(*s.dag, stage_ranges(c.pipeline, s.dag->size()));
    const graph::StageRange r = layout.stage(stage).range;
    std::cerr << "pipeline stage " << stage << ": nodes " << r.first << "-" << r.last << " ("
              << s.dag->nodes()[static_cast<size_t>(r.first)].name << " .. "
              << s.dag->nodes()[static_cast<size_t>(r.last)].name << "), "
              << s.dag->params().params().size() << " parameters ("
              << train::fmt("%.1f", static_cast<double>(s.dag->params().bytes()) / 1e6)
              << " MB; the other stages hold " << s.dag->params().elsewhere().size() << "), "
              << c.pipeline.schedule << " schedule\n";
    PipelineRunnerOptions o{.stage = stage,
                            .peers = grid[static_cast<size_t>(replica)],
                            .one_f_one_b = c.pipeline.schedule == "1f1b",
                            .batch = c.train.batch_size,
                            .seq_len = c.model.seq_len,
                            .autocast = train::parse_dtype(c.train.dtype, "train.dtype")};
    return std::make_unique<PipelineStepRunner>(node, std::move(layout), std::move(o), *s.executor,
                                                *s.dag, *s.optimizer, *s.loader, s.device);
  };
  train::TrainResult result = train::train(c, t);
  node.leave();
  return result;
}

}  // namespace starling::strategy
