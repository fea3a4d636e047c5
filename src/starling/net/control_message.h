// Helpers shared by the parts of a peer that speak JSON control messages (gossip, the agreement
// on collectives): encoding a body, reading a peer id field, naming a member's sending socket.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <zmq.hpp>

#include "starling/common/error.h"
#include "starling/net/peer_id.h"

namespace starling::net {

inline zmq::message_t json_message(const nlohmann::json& j) {
  const std::string s = j.dump();
  return zmq::message_t(s.data(), s.size());
}

// A 16-digit hex peer id; NetError naming `field` otherwise.
inline PeerId parse_hex_id(const nlohmann::json& j, const char* field) {
  const auto id = j.is_string() ? parse_peer_id(j.get<std::string>()) : std::nullopt;
  if (!id) throw NetError(std::string("field '") + field + "' is not a 16-digit hex id");
  return *id;
}

// The transport slot (sending socket) of a member. (Built with append: GCC 12 warns falsely
// about "literal" + std::string.)
inline std::string slot_of(PeerId id) { return std::string("m").append(format_peer_id(id)); }

}  // namespace starling::net
