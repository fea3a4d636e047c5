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

std::vector<net::PeerId> pipeline_roles(net::Node& node, int stage, int stages,
                                        std::chrono::milliseconds timeout) {
  std::vector<net::PeerId> others;
  for (const auto& m : node.members())
    if (m.state == net::MemberState::alive && m.info.id != node.id()) others.push_back(m.info.id);
  if (static_cast<int>(others.size()) + 1 != stages)
    throw NetError("pipeline: the swarm has " + std::to_string(others.size() + 1) + " peers for " +
                   std::to_string(stages) +
                   " stages; a pipeline needs exactly one peer per stage (pipeline replicas are "
                   "not available yet)");
  std::vector<uint8_t> mine(4);
  const auto s32 = static_cast<int32_t>(stage);
  std::memcpy(mine.data(), &s32, 4);
  std::vector<net::Transfer> answers;
  for (const net::PeerId p : others) {
    node.send(p, kRoleTag, mine);
    answers.push_back(node.recv(p, kRoleTag));
  }
  std::vector<net::PeerId> peers(static_cast<size_t>(stages), 0);
  peers[static_cast<size_t>(stage)] = node.id();
  for (size_t i = 0; i < others.size(); ++i) {
    const std::string who = "peer " + net::short_peer_id(others[i]);
    if (!answers[i].wait_for(timeout))
      throw NetError("pipeline: " + who + " did not say which stage it runs within " +
                     std::to_string(timeout.count() / 1000) + " s");
    const std::vector<uint8_t> bytes = answers[i].wait();
    int32_t theirs = -1;
    if (bytes.size() == 4) std::memcpy(&theirs, bytes.data(), 4);
    if (theirs < 0 || theirs >= stages)
      throw NetError("pipeline: " + who + " claims stage " + std::to_string(theirs) +
                     " of a pipeline with " + std::to_string(stages) + " stages");
    net::PeerId& slot = peers[static_cast<size_t>(theirs)];
    if (slot != 0)
      throw NetError("pipeline: stage " + std::to_string(theirs) + " is claimed by " + who +
                     " and by peer " + net::short_peer_id(slot) +
                     "; give each peer its own pipeline.stage");
    slot = others[i];
  }
  return peers;
}

train::TrainResult run_pipeline_peer(const train::RunConfig& config, const PeerOptions& options) {
  net::NodeOptions node_opts = net::node_options(config.net);
  net::Node node(node_opts);
  const std::string entry =
      node_opts.insecure ? node.endpoint() : node_opts.keys.public_key + "@" + node.endpoint();
  if (options.train.json_events) std::cout << train::events::listening(entry).dump() << std::endl;
  const int stages = static_cast<int>(config.pipeline.count());
  const int stage = static_cast<int>(config.pipeline.stage);
  std::cerr << "peer " << net::short_peer_id(node.id()) << " (pipeline stage " << stage << " of "
            << stages << ") listening at " << entry << "\n";
  const auto timeout = std::chrono::seconds(config.net.join_timeout_s);
  if (!node.wait_for_members(static_cast<size_t>(stages), timeout))
    throw NetError("only " + std::to_string(node.members().size()) + " of the pipeline's " +
                   std::to_string(stages) + " peers arrived within net.join_timeout_s = " +
                   std::to_string(config.net.join_timeout_s) + " s");
  const std::vector<net::PeerId> peers = pipeline_roles(node, stage, stages, timeout);

  // A stage holds its own layers only in the sense that it trains only them: the end-of-run
  // sample would need the whole model on one peer.
  train::RunConfig c = config;
  c.train.sample_at_end = false;
  train::TrainOptions t = options.train;
  t.hooks = nullptr;
  t.step_runner = [&](train::Session& s,
                      train::ProgressLine&) -> std::unique_ptr<train::StepRunner> {
    PipelineLayout layout(*s.dag, stage_ranges(c.pipeline, s.dag->size()));
    const graph::StageRange r = layout.stage(stage).range;
    std::cerr << "pipeline stage " << stage << ": nodes " << r.first << "-" << r.last << " ("
              << s.dag->nodes()[static_cast<size_t>(r.first)].name << " .. "
              << s.dag->nodes()[static_cast<size_t>(r.last)].name << "), " << c.pipeline.schedule
              << " schedule\n";
    PipelineRunnerOptions o{.stage = stage,
                            .peers = peers,
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
