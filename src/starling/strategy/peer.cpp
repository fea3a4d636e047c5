#include "starling/strategy/peer.h"

#include <c10/core/Device.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "starling/common/error.h"
#include "starling/net/dashboard.h"
#include "starling/net/endpoint.h"
#include "starling/net/gloo_backend.h"
#include "starling/net/nccl_backend.h"
#include "starling/net/node.h"
#include "starling/strategy/atom.h"
#include "starling/strategy/co2.h"
#include "starling/strategy/ddp.h"
#include "starling/strategy/diloco.h"
#include "starling/strategy/localsgd.h"
#include "starling/strategy/pipeline_auto_peer.h"
#include "starling/strategy/pipeline_peer.h"
#include "starling/strategy/replica_role.h"
#include "starling/train/events.h"

namespace starling::strategy {

std::unique_ptr<train::StepHooks> make_strategy(const train::RunConfig& config,
                                                net::Collectives& net,
                                                std::vector<net::PeerId> group) {
  const std::string& kind = config.strategy.kind;
  check_peer(config.strategy, net.backend_name());
  std::unique_ptr<SwarmStrategy> s;
  if (kind == "ddp") {
    s = std::make_unique<Ddp>(config, net);
  } else if (kind == "localsgd") {
    s = std::make_unique<LocalSgd>(config, net);
  } else if (kind == "diloco") {
    s = std::make_unique<DiLoCo>(config, net);
  } else if (kind == "co2") {
    s = std::make_unique<Co2>(config, net);
  } else {
    auto* node = dynamic_cast<net::Node*>(&net);
    if (node == nullptr) throw std::logic_error("atom on a collective that is not a swarm node");
    s = std::make_unique<Atom>(config, *node);
  }
  s->restrict_to(std::move(group));
  return s;
}

std::function<void(const nlohmann::json&)> publish_progress(net::Node& node) {
  auto said = std::make_shared<nlohmann::json>(nlohmann::json::object());
  return [&node, said](const nlohmann::json& record) {
    for (const char* key : {"step", "loss", "tokens", "tokens_per_s", "val_loss"})
      if (record.contains(key) && record[key].is_number()) (*said)[key] = record[key];
    if (record.contains("net") && record["net"].is_object())
      for (const auto& [key, value] : record["net"].items())
        if (value.is_number() && key != "bytes_sent" && key != "state_bytes") (*said)[key] = value;
    if (record.contains("checkpoint_step") && record["checkpoint_step"].is_number())
      (*said)["checkpoint_step"] = record["checkpoint_step"];
    node.set_progress(said->dump());
  };
}

namespace {

// The swarm's replica role (replica_role.h) is the one most of its live members have, this peer
// included; between as many, the oldest member's. A peer without it leaves and fails at once,
// naming the keys, before it takes part in a round. A swarm forming with one misconfigured peer
// loses that one only, and a joiner unlike the swarm (older than it) is the one to go. With
// `defer_ties`, a tie in a swarm still forming (no member has trained a step) is left to a later
// call, once net.min_peers have arrived, since its misconfigured peer may be the first, the
// oldest: from three peers on it is outvoted there (one against one, the oldest stays).
void refuse_unlike_replicas(net::Node& node, const std::string& mine, bool defer_ties) {
  struct Holders {
    int count = 0;
    std::pair<int64_t, net::PeerId> oldest{std::numeric_limits<int64_t>::max(), 0};
    std::string name;  // the oldest holder's
  };
  std::map<std::string, Holders> roles;
  bool self_seen = false, trained = false;
  for (const net::MemberView& m : node.members()) {
    // A member's progress is said from its first step on (publish_progress).
    trained = trained || (m.info.id != node.id() && !m.info.left && !m.info.progress.empty() &&
                          m.info.progress != "{}");
    if (m.info.left || m.state != net::MemberState::alive || !is_replica_role(m.info.role))
      continue;
    self_seen = self_seen || m.info.id == node.id();
    Holders& h = roles[m.info.role];
    ++h.count;
    if (const std::pair age{m.info.joined_at_ms, m.info.id}; age < h.oldest) {
      h.oldest = age;
      h.name = m.info.name.empty() ? net::short_peer_id(m.info.id) : m.info.name;
    }
  }
  if (!self_seen) ++roles[mine].count;
  const auto swarm = std::max_element(roles.begin(), roles.end(), [](const auto& a, const auto& b) {
    return a.second.count != b.second.count ? a.second.count < b.second.count
                                            : a.second.oldest > b.second.oldest;
  });
  if (swarm == roles.end() || swarm->first == mine) return;
  if (defer_ties && !trained && roles[mine].count == swarm->second.count) return;
  std::string keys;
  for (const std::string& d : replica_role_differences(mine, swarm->first)) keys += "\n  " + d;
  node.leave();
  throw ConfigError("the swarm's member " + swarm->second.name +
                    " (and every peer like it) trains another model or strategy than this "
                    "peer's config (every peer of a swarm trains the same [model] with the same "
                    "strategy):" +
                    keys);
}

// The live members a replica of `mine` trains with: those of that role, and those of no role (a
// peer of an older build, not compared), this peer included.
size_t members_like(const net::Node& node, const std::string& mine) {
  size_t n = 0;
  for (const net::MemberView& m : node.members())
    if (!m.info.left && m.state == net::MemberState::alive &&
        (m.info.role == mine || !is_replica_role(m.info.role)))
      ++n;
  return n;
}

// net.min_peers peers like this one, within net.join_timeout_s: a peer unlike the others that
// arrives meanwhile refuses itself (refuse_unlike_replicas) and is not counted, and this one
// refuses itself where it is the one unlike the others.
void wait_for_like_peers(net::Node& node, const train::RunConfig& config, const std::string& role) {
  const auto min_peers = static_cast<size_t>(config.net.min_peers);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(config.net.join_timeout_s);
  std::cerr << "waiting for " << min_peers << " peers...\n";
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || !node.wait_for_members(min_peers, left)) {
      refuse_unlike_replicas(node, role, false);  // this peer the one unlike: that, not the wait
      throw NetError("only " + std::to_string(members_like(node, role)) + " of net.min_peers = " +
                     std::to_string(min_peers) + " peers arrived within net.join_timeout_s = " +
                     std::to_string(config.net.join_timeout_s) + " s");
    }
    refuse_unlike_replicas(node, role, false);
    if (members_like(node, role) >= min_peers) return;
    // The peers unlike this one refuse themselves as it would: until they have left they still
    // count as members, so the wait above would not wait.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

train::TrainResult train_with(const train::RunConfig& config, const PeerOptions& options,
                              net::Collectives& net) {
  auto hooks = make_strategy(config, net);
  train::TrainOptions t = options.train;
  t.hooks = hooks.get();
  return train::train(config, t);
}

train::TrainResult run_swarm_peer(const train::RunConfig& config, const PeerOptions& options) {
  net::NodeOptions node_opts = net::node_options(config.net);
  node_opts.role = replica_role(config);
  net::Node node(node_opts);
  const auto min_peers = static_cast<size_t>(config.net.min_peers);
  refuse_unlike_replicas(node, node_opts.role, min_peers > 1);
  const std::string entry =
      net::format_entry_point(node_opts.insecure ? "" : node_opts.keys.public_key, node.endpoint());
  if (options.train.json_events) std::cout << train::events::listening(entry).dump() << std::endl;
  std::cerr << "peer " << net::short_peer_id(node.id()) << " listening at " << entry << "\n";
  // Declared after the node, so it stops sampling before the node goes.
  const auto dashboard =
      net::serve_dashboard(config.net, std::make_shared<net::CurrentNode>(&node));
  if (dashboard) {
    if (options.train.json_events)
      std::cout << train::events::dashboard(dashboard->url()).dump() << std::endl;
    std::cerr << "dashboard at " << dashboard->url() << "\n";
  }
  if (min_peers > 1) wait_for_like_peers(node, config, node_opts.role);
  PeerOptions o = options;
  o.train.on_record = publish_progress(node);
  train::TrainResult result = train_with(config, o, node);
  node.leave();
  return result;
}

// A rank of a fixed c10d group (net.backend = "gloo" or "nccl").
train::TrainResult run_group_rank(const train::RunConfig& config, const PeerOptions& options) {
  const net::NetConfig& n = config.net;
  if (n.rank < 0 || n.world_size < 1 || n.store.empty())
    throw ConfigError("net.backend = \"" + n.backend +
                      "\" needs net.rank, net.world_size and net.store, or RANK, WORLD_SIZE, "
                      "MASTER_ADDR and MASTER_PORT from a launcher such as torchrun");
  if (n.rank >= n.world_size)
    throw ConfigError("net.rank = " + std::to_string(n.rank) +
                      " must be below net.world_size = " + std::to_string(n.world_size));
  std::unique_ptr<net::Collectives> group;
  const auto fill = [&](net::GroupOptions& g) {
    g.rank = static_cast<int>(n.rank);
    g.world_size = static_cast<int>(n.world_size);
    g.store = n.store;
    g.store_hosted_elsewhere = options.store_hosted_elsewhere;
    g.timeout = std::chrono::seconds(n.collective_timeout_s);
    // Rank 0 says where its store listens (port 0 picks one), as a swarm peer says its endpoint.
    if (options.train.json_events)
      g.on_store_listening = [host = n.store.substr(0, n.store.rfind(':'))](uint16_t port) {
        std::cout << train::events::listening(host + ":" + std::to_string(port)).dump()
                  << std::endl;
      };
  };
  std::cerr << "rank " << n.rank << " of " << n.world_size << " joining the " << n.backend
            << " group at " << n.store << "...\n";
  if (n.backend == "gloo") {
    net::GlooOptions g;
    fill(g);
    g.interface = n.interface;
    group = std::make_unique<net::GlooBackend>(g);
  } else {
    const c10::Device device(config.train.device);
    if (!device.is_cuda())
      throw ConfigError(
          "net.backend = \"nccl\" needs train.device = \"cuda\" (or \"cuda:N\"), not \"" +
          config.train.device + "\"; use net.backend = \"gloo\" on CPUs");
    net::NcclOptions g;
    fill(g);
    g.device_index = device.has_index() ? device.index() : 0;
    group = net::make_nccl_backend(g);
  }
  return train_with(config, options, *group);
}

}  // namespace

train::TrainResult run_peer(const train::RunConfig& config, const PeerOptions& options) {
  if (config.pipeline.auto_stages) {
    check_auto_pipeline_peer(config);
    return run_pipeline_peer(config, options);
  }
  if (config.pipeline.enabled()) {
    check_pipeline_peer(config.pipeline, {.strategy_kind = config.strategy.kind,
                                          .dtype = config.train.dtype,
                                          .net_backend = config.net.backend,
                                          .swapped = config.swap.enabled(),
                                          .stage = config.pipeline.stage,
                                          .replica = config.pipeline.replica,
                                          .replicas = config.pipeline.replicas});
    return run_pipeline_peer(config, options);
  }
  check_peer(config.strategy, config.net.backend);
  if (config.net.backend == "starling") return run_swarm_peer(config, options);
  return run_group_rank(config, options);
}

}  // namespace starling::strategy
