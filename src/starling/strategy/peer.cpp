#include "starling/strategy/peer.h"

#include <iostream>
#include <nlohmann/json.hpp>

#include "starling/common/error.h"
#include "starling/strategy/co2.h"
#include "starling/strategy/ddp.h"
#include "starling/strategy/diloco.h"
#include "starling/strategy/localsgd.h"

namespace starling::strategy {

std::unique_ptr<train::StepHooks> make_strategy(const train::RunConfig& config, net::Node& node) {
  const std::string& kind = config.strategy.kind;
  if (kind == "ddp") return std::make_unique<Ddp>(config, node);
  if (kind == "localsgd") return std::make_unique<LocalSgd>(config, node);
  if (kind == "diloco") return std::make_unique<DiLoCo>(config, node);
  if (kind == "co2") return std::make_unique<Co2>(config, node);
  throw ConfigError("strategy.kind = \"" + kind + "\" does not train with peers; use " +
                    train::swarm_strategy_list());
}

net::NodeOptions node_options(const train::NetConfig& net) {
  net::NodeOptions o;
  o.name = net.name;
  o.listen = net.listen;
  o.advertise = net.advertise;
  o.join = net.join;
  o.insecure = net.insecure;
  if (!net.insecure) {
    if (net.key.empty() || net.allow.empty())
      throw ConfigError(
          "net.key and net.allow are required (a key from `starling keygen` and the swarm's "
          "allowlist), or set net.insecure = true on a trusted network");
    o.keys = net::load_keypair(net.key);
    o.allowlist = net::load_allowlist(net.allow);
  }
  o.heartbeat_interval = std::chrono::milliseconds(net.heartbeat_ms);
  o.peer_timeout = std::chrono::milliseconds(net.peer_timeout_ms);
  o.join_timeout = std::chrono::seconds(net.join_timeout_s);
  o.collective_timeout = std::chrono::seconds(net.collective_timeout_s);
  return o;
}

train::TrainResult run_peer(const train::RunConfig& config, const PeerOptions& options) {
  net::NodeOptions node_opts = node_options(config.net);
  net::Node node(node_opts);
  const std::string entry =
      node_opts.insecure ? node.endpoint() : node_opts.keys.public_key + "@" + node.endpoint();
  if (options.train.json_events)
    std::cout << nlohmann::json{{"event", "listening"}, {"endpoint", entry}}.dump() << std::endl;
  std::cerr << "peer " << net::short_peer_id(node.id()) << " listening at " << entry << "\n";
  const auto min_peers = static_cast<size_t>(config.net.min_peers);
  if (min_peers > 1) {
    std::cerr << "waiting for " << min_peers << " peers...\n";
    if (!node.wait_for_members(min_peers, std::chrono::seconds(config.net.join_timeout_s)))
      throw NetError("only " + std::to_string(node.members().size()) + " of net.min_peers = " +
                     std::to_string(min_peers) + " peers arrived within net.join_timeout_s = " +
                     std::to_string(config.net.join_timeout_s) + " s");
  }
  auto hooks = make_strategy(config, node);
  train::TrainOptions t = options.train;
  t.hooks = hooks.get();
  train::TrainResult result = train::train(config, t);
  node.leave();
  return result;
}

}  // namespace starling::strategy
