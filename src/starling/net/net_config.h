// The [net] table: how a peer reaches the others (docs/network.md). The network layer owns these
// settings and their keys; train/config.h places the table in a run's config. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "starling/config/keys_fwd.h"
#include "starling/net/node_options.h"

namespace starling::net {

struct NetConfig {
  // "starling": the elastic, encrypted swarm (every key below `interface`); "gloo" or "nccl": a
  // fixed c10d group of `world_size` ranks meeting at `store` (torchrun's model: no encryption,
  // and a rank that fails stops the run).
  std::string backend = "starling";
  int64_t rank = -1;                    // gloo/nccl: this process's rank (-1 = $RANK)
  int64_t world_size = 0;               // gloo/nccl: ranks in the group (0 = $WORLD_SIZE)
  std::string store;                    // gloo/nccl: HOST:PORT ("" = $MASTER_ADDR:$MASTER_PORT)
  std::string interface = "127.0.0.1";  // gloo: the local address its connections use
  std::string name;                     // shown in status and logs; "" = the key's name
  std::string listen = "tcp://127.0.0.1:0";  // port 0 picks a free port
  std::string advertise;                     // host others reach a 0.0.0.0 listener at
  std::vector<std::string> join;             // entry points ("KEY@tcp://HOST:PORT" or tcp://..)
  std::string key;                           // this peer's key file (`starling keygen`)
  std::string allow;                         // the swarm's allowlist file
  bool insecure = false;                     // plain TCP, no CURVE (trusted networks only)
  bool direct_data = true;                   // collective chunks on direct TCP links, not ZeroMQ
  int64_t heartbeat_ms = 500;
  int64_t peer_timeout_ms = 5000;  // silence after which a peer counts as dead
  int64_t join_timeout_s = 30;
  int64_t collective_timeout_s = 600;  // how long a round waits for every peer to be ready
  int64_t min_peers = 1;               // peers to wait for before the first step
  std::string dashboard;  // HOST:PORT of this peer's swarm dashboard (dashboard.h); "" = none
};

// Appends the [net] keys, bound to `c`'s fields.
void add_config_keys(NetConfig& c, config::Keys& keys);
// Checks that span keys (heartbeat against timeout); ConfigError prefixed with `source`.
void check(const NetConfig& c, const std::string& source);

// A swarm node's options from [net]: key and allowlist are read from their files (ConfigError
// naming the key and file when they cannot be), timeouts converted.
NodeOptions node_options(const NetConfig& c);

}  // namespace starling::net
