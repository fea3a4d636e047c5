#include "starling/net/net_config.h"

#include "starling/common/error.h"
#include "starling/config/config_keys.h"
#include "starling/net/keys.h"

namespace starling::net {

void add_config_keys(NetConfig& n, config::Keys& k) {
  using namespace config;
  k.push_back(string_key("net", "backend", &n.backend,
                         "collectives: \"starling\" (the elastic, encrypted swarm), or a fixed "
                         "c10d group: \"gloo\" (CPU) or \"nccl\" (GPUs in one datacenter; needs "
                         "a CUDA libtorch)",
                         {"starling", "gloo", "nccl"}));
  k.push_back(int_key("net", "rank", &n.rank, -1,
                      "gloo/nccl: this process's rank; -1 = $RANK (torchrun sets it)"));
  k.push_back(int_key("net", "world_size", &n.world_size, 0,
                      "gloo/nccl: ranks in the group; 0 = $WORLD_SIZE"));
  k.push_back(string_key("net", "store", &n.store,
                         "gloo/nccl: HOST:PORT of the rendezvous store rank 0 hosts; \"\" = "
                         "$MASTER_ADDR:$MASTER_PORT"));
  k.push_back(string_key("net", "interface", &n.interface,
                         "gloo: the local address (IP or host name) its connections use"));
  k.push_back(string_key("net", "name", &n.name, "this peer's name in status and logs"));
  k.push_back(string_key("net", "listen", &n.listen,
                         "address to listen on, tcp://HOST:PORT (port 0 picks a free port)"));
  k.push_back(string_key("net", "advertise", &n.advertise,
                         "host or IP others reach this peer at, when listening on 0.0.0.0"));
  k.push_back(string_list_key("net", "join", &n.join,
                              "entry points: any live member, tcp://HOST:PORT or "
                              "KEY@tcp://HOST:PORT; [] = start a new swarm"));
  k.push_back(string_key("net", "key", &n.key, "this peer's key file (`starling keygen`)"));
  k.push_back(
      string_key("net", "allow", &n.allow, "the swarm's allowlist: one public key per line"));
  k.push_back(bool_key("net", "insecure", &n.insecure,
                       "plain TCP without CURVE encryption (trusted networks only)"));
  k.push_back(bool_key("net", "direct_data", &n.direct_data,
                       "collective chunks travel on direct TCP connections between ring "
                       "neighbours, sealed with AES-256-GCM under CURVE (faster on fast "
                       "networks); false keeps them on ZeroMQ like every other message"));
  // The maxima (an hour, a day, a week) only keep a slip of the keyboard from overflowing the
  // clock arithmetic: a timeout of 2^63 s became "no answer within -1.0 s".
  k.push_back(int_key("net", "heartbeat_ms", &n.heartbeat_ms, 10, "heartbeat interval", 3'600'000));
  k.push_back(int_key("net", "peer_timeout_ms", &n.peer_timeout_ms, 100,
                      "silence after which a peer counts as dead", 86'400'000));
  k.push_back(int_key("net", "join_timeout_s", &n.join_timeout_s, 1,
                      "how long joining waits for an entry point to answer", 604'800));
  k.push_back(int_key("net", "collective_timeout_s", &n.collective_timeout_s, 1,
                      "how long a round waits for every peer to reach it", 604'800));
  k.push_back(int_key("net", "min_peers", &n.min_peers, 1,
                      "peers (this one included) to wait for before the first step"));
  k.push_back(string_key("net", "dashboard", &n.dashboard,
                         "HOST:PORT to serve the swarm's live web page on (\"127.0.0.1:8080\"; "
                         "\"\" = none)"));
}

void check(const NetConfig& n, const std::string& source) {
  if (n.peer_timeout_ms <= n.heartbeat_ms)
    throw ConfigError(source + ": net.peer_timeout_ms (" + std::to_string(n.peer_timeout_ms) +
                      ") must exceed net.heartbeat_ms (" + std::to_string(n.heartbeat_ms) + ")");
}

NodeOptions node_options(const NetConfig& net) {
  NodeOptions o;
  o.name = net.name;
  o.listen = net.listen;
  o.advertise = net.advertise;
  o.join = net.join;
  // A peer joining a swarm without waiting for it to form (min_peers 1: a late joiner, a restart)
  // takes part from its first collective: until then, starting up, it must not hold up the rounds
  // of the members already training. A forming swarm (min_peers > 1) counts every member from the
  // start, so that its first round waits for all of them.
  o.active = net.join.empty() || net.min_peers > 1;
  o.insecure = net.insecure;
  o.direct_data = net.direct_data;
  if (!net.insecure) {
    if (net.key.empty() || net.allow.empty())
      throw ConfigError(
          "net.key and net.allow are required (a key from `starling keygen` and the swarm's "
          "allowlist), or set net.insecure = true on a trusted network");
    o.keys = load_keypair(net.key);
    o.allowlist = load_allowlist(net.allow);
  }
  o.heartbeat_interval = std::chrono::milliseconds(net.heartbeat_ms);
  o.peer_timeout = std::chrono::milliseconds(net.peer_timeout_ms);
  o.join_timeout = std::chrono::seconds(net.join_timeout_s);
  o.collective_timeout = std::chrono::seconds(net.collective_timeout_s);
  return o;
}

}  // namespace starling::net
