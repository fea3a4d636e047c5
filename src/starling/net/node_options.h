// What a swarm peer (node.h) is configured with: where it listens, who it is, whom it trusts and
// joins through, and its timing and message limits.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "starling/net/keys.h"
#include "starling/net/log.h"

namespace starling::net {

struct NodeOptions {
  std::string name;                          // shown in status and logs
  std::string listen = "tcp://127.0.0.1:0";  // port 0 picks a free port
  std::string advertise;                     // host others reach us at (for 0.0.0.0 binds)
  bool insecure = false;                     // plain TCP without CURVE (explicit opt-in)
  // Collective chunks travel on direct TCP links between ring neighbours (direct_links.h) rather
  // than through ZeroMQ; sealed with AES-256-GCM in CURVE swarms.
  bool direct_data = true;
  KeyPair keys;                       // this peer's identity (unless insecure)
  std::vector<AllowedKey> allowlist;  // the swarm: keys allowed to connect
  std::vector<std::string> join;      // entry points; empty = start a new swarm
  // Takes part in the collectives (of the swarm, or of a group it is in) from the start; an
  // inactive peer becomes active with Node::activate() or by calling a collective.
  bool active = true;
  std::string role;  // MemberInfo::role: what it does, for others to find it by
  std::chrono::milliseconds heartbeat_interval{500};
  std::chrono::milliseconds peer_timeout{5000};  // silence after which a peer is dead
  std::chrono::milliseconds join_timeout{30000};
  std::chrono::milliseconds collective_timeout{300000};  // waiting for everyone to be ready
  size_t chunk_bytes = 512 * 1024;                       // fp32 bytes per pipelined chunk
  // The bandwidth probe sent to each new member; a receiver asks for larger ones, up to 16 times
  // this (and 16 MiB), where a probe passes too fast to time (link_probe.h).
  size_t probe_bytes = 256 * 1024;
  uint64_t max_message_bytes = 64ull << 20;
  // Chunks of collectives that have not started here yet (a neighbour a few ring steps ahead)
  // are kept until they do, up to this many bytes in all; beyond it they are dropped and the
  // collective fails and runs again. Without a bound a member could fill this peer's memory
  // with chunks of collectives that never come.
  uint64_t max_early_bytes = 1ull << 30;
  LogFn log;  // default: stderr
  // Fault injection for tests: the communication loop sleeps this long after each hello it
  // handles, so that the probe behind it waits queued.
  std::chrono::milliseconds hold_after_hello{0};
};

}  // namespace starling::net
