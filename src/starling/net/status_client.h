// Asks one member of a swarm for its view: members, their state, and measured links. Used by
// `starling status`. The client is not a member; with CURVE its key must still be allowlisted.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "starling/net/keys.h"
#include "starling/net/membership.h"

namespace starling::net {

struct StatusQuery {
  std::string entry;  // "tcp://HOST:PORT" or "KEY@tcp://HOST:PORT"
  bool insecure = false;
  KeyPair keys;
  std::vector<AllowedKey> allowlist;  // candidate keys for the entry when it names none
  std::chrono::milliseconds timeout{5000};
};

struct StatusMember {
  MemberInfo info;
  std::string state;
  double seconds_since_heard = 0;
};

struct StatusLink {
  PeerId from = 0, to = 0;
  LinkStats stats;
};

struct StatusReport {
  PeerId answered_by = 0;
  std::vector<StatusMember> members;
  std::vector<StatusLink> links;
};

// Throws NetError when nobody answers within the timeout or the answer is malformed.
StatusReport query_status(const StatusQuery& query);

// A human-readable table of members and a bandwidth/latency matrix.
std::string format_status(const StatusReport& report);

}  // namespace starling::net
